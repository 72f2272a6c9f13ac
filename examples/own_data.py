"""Your own data in ten lines: a log of string ids with a datetime column -> a trained model ->
its test metrics, a top-10 DataFrame, similar items, the model refitted on every item, and the
same answers after save/load.

    python examples/own_data.py                       # a synthetic log of string ids
    python examples/own_data.py events.parquet        # your log (user_id, sku, ts)
    python examples/own_data.py events.parquet 2m     # ... with a time budget as a cap
"""

import sys
import tempfile

import polars as pl

import seqrec
from seqrec.data.synthetic import synthetic_interactions


def synthetic_log() -> pl.DataFrame:
    df = synthetic_interactions(n_users=300, n_items=120, seed=0)
    return pl.DataFrame(
        {
            "user_id": [f"user_{u}" for u in df["user"].to_list()],
            "sku": [f"sku-{i:04d}" for i in df["item"].to_list()],
            "ts": pl.from_epoch(df["timestamp"], time_unit="s"),
        }
    ).sample(fraction=1.0, shuffle=True, seed=0)


if __name__ == "__main__":
    source = sys.argv[1] if len(sys.argv) > 1 else None
    log = (
        (pl.read_parquet if str(source).endswith(".parquet") else pl.read_csv)(source)
        if source
        else synthetic_log()
    )
    budget = sys.argv[2] if len(sys.argv) > 2 else None  # none: it stops on validation

    # the ten lines
    model = seqrec.SASRec().fit(
        log, user_col="user_id", item_col="sku", time_col="ts", time_budget=budget
    )
    print(model.evaluate(protocols=["full"])["full"])  # test split, full ranking
    users = log["user_id"].unique().sort().head(3).to_list()
    top = model.recommend(users, k=10, filter_viewed=True)  # user, rank, item, score
    print(top.head(10))
    print(model.similar_items([top["item"][0]], k=5))  # item-to-item
    model.refit()  # again on every item, for the epochs validation chose: the model to serve
    top = model.recommend(users, k=10, filter_viewed=True)
    with tempfile.TemporaryDirectory() as tmp:
        again = seqrec.load(model.save(f"{tmp}/model")).recommend(users, k=10)
    print("same after save/load:", again["item"].equals(top["item"]))
