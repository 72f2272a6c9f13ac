"""Building a run's item index (seqrec.serving.index): `build_index` measures its recall@10
against exact scoring on a sample of the run's histories and stores it; `index_if_large` is
what a finished training does (`seqrec train`, the estimators' `fit`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from seqrec.errors import ConfigError, RunError
from seqrec.serving.catalogue import CATALOGUE_WAIT
from seqrec.serving.index import INDEX_MIN_ITEMS, ItemIndex
from seqrec.serving.recommender import Recommender
from seqrec.training.rundir import RunDir

__all__ = [
    "MIN_RECALL",
    "TARGET_RECALL",
    "build_index",
    "choose_breadth",
    "index_if_large",
    "save_index",
]

# an index built after training is kept only at this recall@10 against exact scoring or more
MIN_RECALL = 0.98
# the recall an index's search breadth is chosen for (above MIN_RECALL: the sample is not the
# traffic), and the broadest graph search tried
TARGET_RECALL = 0.985
MAX_EF_SEARCH = 1024


def build_index(
    rec: Recommender,
    *,
    library: str = "faiss",
    kind: str = "hnsw",
    m: int = 32,
    ef_construction: int = 200,
    ef_search: int | None = None,
    nlist: int | None = None,
    nprobe: int | None = None,
    target: float = TARGET_RECALL,
    sample: int = 1000,
    k: int = 10,
    seed: int = 0,
    save: bool = True,
) -> ItemIndex:
    """The item index of `rec`'s model (its output vectors), its recall@k against exact
    scoring measured on `sample` histories (the training sequences of a seeded sample of its
    users, their seen items excluded; without the prepared data, histories of 20 items drawn
    by training popularity), put in use and, with `save`, stored in the run (index.bin). Without
    `ef_search` (hnsw) or `nprobe` (ivf), the narrowest search whose recall reaches `target` is
    chosen (`choose_breadth`). One line for a model whose scores are not a dot product with
    its output layer."""
    if not rec.model.blockwise:
        raise ConfigError(
            f"{rec.run.path}: a {rec.run.config.model} model's scores are not a dot product "
            "with its output layer; it is scored exactly"
        )
    start = time.perf_counter()
    index = ItemIndex.build(
        *rec.model.output_weights(),
        library=library,
        kind=kind,
        m=m,
        ef_construction=ef_construction,
        ef_search=ef_search or 256,
        nlist=nlist,
        nprobe=nprobe or 8,
        seed=seed,
    )
    seconds = time.perf_counter() - start
    asked = _sample_histories(rec, sample, np.random.default_rng(seed))
    k = min(k, rec.n_items)
    previous, rec.index = rec.index, None
    try:
        exact = rec.recommend_encoded(k=k, **asked)

        def recall_of(index: ItemIndex) -> float:
            rec.index = index
            found = rec.recommend_encoded(k=k, **asked)
            hits = sum(
                len({i for i, _ in a} & {i for i, _ in e})
                for a, e in zip(found, exact, strict=True)
            )
            return hits / max(sum(len(e) for e in exact), 1)

        if (nprobe if index.kind == "ivf" else ef_search) is None:
            recall = choose_breadth(index, recall_of, target)
        else:
            recall = recall_of(index)
    finally:
        rec.index = previous
    index.recall = {
        f"recall@{k}": recall,
        "histories": len(asked["histories"]),
        "build_seconds": seconds,
        "seconds": time.perf_counter() - start,  # with the recall measured, the breadth chosen
    }
    if save:
        save_index(rec, index)
    with rec._lock:
        rec.index = index
    return index


def save_index(rec: Recommender, index: ItemIndex) -> None:
    """`index` recorded in `rec`'s run, under the run's lock, only if the catalogue it was built
    for is still the run's (another writer may have added items meanwhile: one line)."""
    run = RunDir(rec.run.path)
    with run.lock(wait=CATALOGUE_WAIT, what="catalogue"):
        if run.catalogue_stamp() != rec.stamp:
            raise RunError(
                f"{run.path}: its catalogue changed while the index was built (items were "
                "added); build it again"
            )
        data = index.to_bytes()
        # loaded once before it is saved: an index its library cannot read back is never kept
        ItemIndex.from_bytes(data, f"{run.path}/index.bin (as built)", n_items=index.n_items)
        run.save_index(data)


def choose_breadth(
    index: ItemIndex, recall_of: Callable[[ItemIndex], float], target: float
) -> float:
    """Set how widely `index` searches to the least of a series of breadths, each 1.5 or 4/3
    times the one before (hnsw: ef_search 32, 48, 64, 96, ... at most MAX_EF_SEARCH; ivf:
    nprobe 8, 12, 16, 24, ... at most every list), whose `recall_of` reaches `target`; that
    recall."""
    attr, first, cap = (
        ("nprobe", 8, index.nlist) if index.kind == "ivf" else ("ef_search", 32, MAX_EF_SEARCH)
    )
    setattr(index, attr, min(first, cap))
    while (recall := recall_of(index)) < target and getattr(index, attr) < cap:
        setattr(index, attr, min(_wider(getattr(index, attr)), cap))
    return recall


def _wider(breadth: int) -> int:
    """The next breadth: 2^j -> 1.5 x 2^j -> 2^(j + 1)."""
    return breadth * 3 // 2 if breadth & (breadth - 1) == 0 else breadth * 4 // 3


def _sample_histories(rec: Recommender, sample: int, rng: np.random.Generator) -> dict[str, Any]:
    """What an index's recall is measured on (build_index): the keyword arguments of
    `recommend_encoded`, histories (and for a model of time their times, and one query time:
    the latest of them)."""
    if rec.dataset is not None:
        seqs = rec.dataset.sequences
        users = rng.choice(seqs.n_users, min(sample, seqs.n_users), replace=False)
        histories = [seqs.items[seqs.offsets[u] : seqs.offsets[u + 1]] for u in users]
        times = rec.user_times(users.tolist())
    else:
        p = rec.popularity[1:] / max(float(rec.popularity[1:].sum()), 1.0)
        draw = p if p.sum() > 0 else None
        histories = [1 + rng.choice(rec.n_items, 20, p=draw) for _ in range(sample)]
        times = [np.zeros(20, dtype=np.int64)] * sample if rec.model.uses_times else None
    if times is None:
        return {"histories": histories}
    latest = max((int(t.max()) for t in times if len(t)), default=0)
    return {"histories": histories, "times": times, "at": [latest] * len(histories)}


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
            "--target 1.0 searches more widely)",
            file=sys.stderr,
        )
        return None
    save_index(rec, index)
    if progress:
        print(
            f"{run_dir}: item index of {index.n_items:,} items built ({index.describe()}), "
            f"recall@10 against exact scoring {recall:.4f}",
            file=sys.stderr,
        )
    return index
