"""A trained run's catalogue: grown without retraining (items of an items table, each scored
from its features; seqrec.models.tower gives it the id embedding of the trained items nearest to
it by features), and its item index built (seqrec.serving.index)."""

from __future__ import annotations

import copy
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from seqrec.data.ids import IdCodec
from seqrec.data.item_features import items_file_bytes
from seqrec.data.items_table import read_items_table
from seqrec.errors import ConfigError, DataError
from seqrec.serving.index import ItemIndex
from seqrec.training.rundir import RunDir

if TYPE_CHECKING:
    from seqrec.serving.recommender import Recommender

__all__ = ["MIN_RECALL", "add_items", "build_index", "index_if_large"]

# an index built after training is kept only at this recall@10 against exact scoring or more
MIN_RECALL = 0.98


def add_items(
    rec: Recommender, table: Any, *, save: bool = True, neighbours: int | None = None
) -> list[Any]:
    """Items new to the catalogue, from an items table with the run's feature columns (a frame
    or a file), without retraining: each is given the id embedding of the trained item nearest
    to it by features (the mean of `neighbours` such, default `items.cold_neighbours`;
    seqrec.models.tower), so that it is recommended, scored and
    returned by `similar_items` like the others; the other items' scores are unchanged.
    `save`: the run directory records them (its vocab, items file and weights, replaced
    together), so that every later load has them. Returns the new items' ids. One line for a
    run without item features, an item already in the catalogue, or a table the run's encoder
    cannot read."""
    if rec.run.items is None:
        raise ConfigError(
            f"{rec.run.path}: trained without item features, so a new item has nothing to "
            "be scored from (train with --items-table and --item-features)"
        )
    encoder, features = rec.run.items
    df, _ = read_items_table(
        table,
        item_col=rec.run.config.items.item_col,
        features=encoder.features,
        separator=encoder.separator,
    )
    ids = df.get_column("item").to_list()
    known = [i for i in ids if rec.items.lookup(i) is not None]
    if known:
        shown = ", ".join(map(repr, known[:5])) + (", ..." if len(known) > 5 else "")
        raise DataError(
            f"items table: {len(known):,} of its {len(ids):,} items are already in the "
            f"catalogue ({shown}); expected new items only"
        )
    new = encoder.encode(df, ids)
    # the grown model is built beside the one that answers, then put in its place: a request
    # scored meanwhile sees the old catalogue or the new one, never half of one
    model = copy.deepcopy(rec.model)
    model.add_items(new, neighbours or rec.run.config.items.cold_neighbours)
    with rec._lock:
        rec.model = rec.run.model = model
        rec.run.item_ids = [*rec.run.item_ids, *ids]
        rec.run.items = (encoder, features.append(new))
        rec.items = IdCodec(rec.run.item_ids, start=1)
        rec.item_ids = rec.items.ids
        rec.n_items = len(rec.items)
        rec.popularity = np.concatenate([rec.popularity, np.zeros(len(ids), np.float32)])
        rec.index = None  # it holds the old catalogue: every item scored until it is rebuilt
    if save:
        run = RunDir(rec.run.path)
        vocab = {**run.vocab(), "items": rec.item_ids, "popularity": rec.popularity.tolist()}
        state = {k: v.detach().cpu() for k, v in rec.model.state_dict().items()}
        run.add_items(vocab, items_file_bytes(*rec.run.items), state)
        run.save_index(None)  # `seqrec index RUN` builds it again
    return ids


def build_index(
    rec: Recommender,
    *,
    library: str = "faiss",
    m: int = 32,
    ef_construction: int = 200,
    ef_search: int = 256,
    sample: int = 1000,
    k: int = 10,
    seed: int = 0,
    save: bool = True,
) -> ItemIndex:
    """The item index of `rec`'s model (its output vectors), its recall@k against exact
    scoring measured on `sample` histories (the training sequences of a seeded sample of its
    users, their seen items excluded; without the prepared data, histories of 20 items drawn
    by training popularity), put in use and, with `save`, stored in the run (index.bin). One
    line for a model whose scores are not a dot product with its output layer."""
    if not rec.model.blockwise:
        raise ConfigError(
            f"{rec.run.path}: a {rec.run.config.model} model's scores are not a dot product "
            "with its output layer; it is scored exactly"
        )
    start = time.perf_counter()
    index = ItemIndex.build(
        *rec.model.output_weights(),
        library=library,
        m=m,
        ef_construction=ef_construction,
        ef_search=ef_search,
    )
    seconds = time.perf_counter() - start
    rng = np.random.default_rng(seed)
    if rec.dataset is not None:
        seqs = rec.dataset.sequences
        users = rng.choice(seqs.n_users, min(sample, seqs.n_users), replace=False)
        histories = [seqs.items[seqs.offsets[u] : seqs.offsets[u + 1]] for u in users]
    else:
        p = rec.popularity[1:] / max(float(rec.popularity[1:].sum()), 1.0)
        draw = p if p.sum() > 0 else None
        histories = [1 + rng.choice(rec.n_items, 20, p=draw) for _ in range(sample)]
    k = min(k, rec.n_items)
    previous, rec.index = rec.index, None
    exact = rec.recommend_encoded(histories, k)
    rec.index = index
    try:
        found = rec.recommend_encoded(histories, k)
    finally:
        rec.index = previous
    hits = [len({i for i, _ in a} & {i for i, _ in e}) for a, e in zip(found, exact, strict=True)]
    index.recall = {
        f"recall@{k}": sum(hits) / max(sum(len(e) for e in exact), 1),
        "histories": len(histories),
        "build_seconds": seconds,
    }
    with rec._lock:
        rec.index = index
    if save:
        RunDir(rec.run.path).save_index(index.to_bytes())
    return index


def index_if_large(run_dir: Any, *, progress: bool = True) -> ItemIndex | None:
    """A finished run's item index, built when its catalogue has `INDEX_MIN_ITEMS` or more
    items and its model is scored by a dot product (what `seqrec train` and the estimators'
    `fit` do at the end), and kept when its recall@10 against exact scoring is `MIN_RECALL` or
    more; without the index library installed, a line says how to get it."""
    from seqrec.serving.index import INDEX_MIN_ITEMS
    from seqrec.serving.recommender import Recommender

    vocab = RunDir(run_dir).vocab()
    if len(vocab["items"]) < INDEX_MIN_ITEMS:
        return None
    rec = Recommender.from_run(run_dir, exact=True)
    if not rec.model.blockwise:
        return None
    try:
        index = build_index(rec, save=False)
    except ConfigError as err:  # the library is missing: every item is scored
        print(f"{run_dir}: no item index ({err}); every item is scored", file=sys.stderr)
        return None
    recall = index.recall["recall@10"]
    if recall < MIN_RECALL:  # kept only where it agrees with exact scoring
        print(
            f"{run_dir}: an item index reached recall@10 {recall:.4f} against exact scoring, "
            f"under {MIN_RECALL}: not kept, every item is scored (seqrec index RUN "
            "--ef-search 512 builds a broader one)",
            file=sys.stderr,
        )
        return None
    RunDir(run_dir).save_index(index.to_bytes())
    if progress:
        print(
            f"{run_dir}: item index of {index.n_items:,} items built, recall@10 against exact "
            f"scoring {recall:.4f}",
            file=sys.stderr,
        )
    return index
