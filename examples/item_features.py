"""An items table beside the log: a model that reads each item's category, price and title as
well as its id, and a new item (no interactions yet) added and recommended the day it appears.

    python examples/item_features.py                   # a synthetic shop: log + items table
    python examples/item_features.py events.parquet items.parquet
        # your log (user_id, sku, ts) and items (sku, category, price, title)
"""

import sys

import numpy as np
import polars as pl

import seqrec


def synthetic_shop(seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """300 shoppers who each keep to one of six categories; 120 products, 6 of them new."""
    rng = np.random.default_rng(seed)
    kinds = ["shoes", "books", "games", "tea", "lamps", "socks"]
    items = pl.DataFrame(
        {
            "sku": [f"sku-{i:04d}" for i in range(126)],
            "category": [kinds[i % 6] for i in range(126)],
            "price": [float(5 + (i * 7) % 40) for i in range(126)],
            "title": [f"{kinds[i % 6]} model {i}" for i in range(126)],
        }
    )
    rows = []
    for u in range(300):
        pool = [i for i in range(120) if i % 6 == u % 6]
        for t, i in enumerate(rng.choice(pool, size=10, replace=False)):
            rows.append((f"user_{u}", f"sku-{i:04d}", t))
    log = pl.DataFrame(rows, schema=["user_id", "sku", "ts"], orient="row")
    return log, items


if __name__ == "__main__":
    if len(sys.argv) > 2:
        log, items = pl.read_parquet(sys.argv[1]), pl.read_parquet(sys.argv[2])
        new_items = items.tail(max(1, items.height // 100))  # pretend: the latest 1 %
        items = items.head(items.height - new_items.height)
    else:
        log, items = synthetic_shop()
        new_items, items = items.tail(6), items.head(120)

    # the ten lines
    model = seqrec.SASRec(set=["items.id_dropout=0.2"]).fit(
        log,
        user_col="user_id",
        item_col="sku",
        time_col="ts",
        items=items.rename({"sku": "item"}),
        item_features=["category", "price:number", "title:text"],
    )
    print(model.evaluate())  # warm items: test full / uni100 / pop100
    added = model.add_items(new_items.rename({"sku": "item"}))  # no retraining
    history = items.filter(pl.col("category") == "tea").get_column("sku").head(5).to_list()
    top = model.recommender_.recommend(history, k=20)
    print(model.similar_items(added[:1], k=5))  # a new item's nearest, by the model

    new_in_top = [item for item, _ in top if item in set(added)]
    print(f"added {len(added)} new items; in the top 20 of a tea history: {new_in_top}")
