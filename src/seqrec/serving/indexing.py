"""Building a run's item index (seqrec.serving.index): `build_index` measures its recall@10
against exact scoring on a sample of the run's histories and stores it; `index_if_large` is
what a finished training does (`seqrec train`, the estimators' `fit`)."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from seqrec.errors import ConfigError
from seqrec.serving.index import INDEX_MIN_ITEMS, ItemIndex
from seqrec.serving.recommender import Recommender
from seqrec.training.rundir import RunDir

__all__ = ["MIN_RECALL", "build_index", "index_if_large"]

# an index built after training is kept only at this recall@10 against exact scoring or more
MIN_RECALL = 0.98


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
