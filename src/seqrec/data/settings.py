"""The data and evaluation settings of a run (the `[data]` and `[eval]` sections of a config):
what `prepare` needs to turn a raw file into a prepared dataset with its stored candidates.
They live with the data so that `seqrec.data` depends on nothing above it; `seqrec.config`
composes them into a `RunConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DataConfig", "EvalConfig", "ItemsConfig"]


@dataclass(frozen=True)
class DataConfig:
    """How a raw file becomes a prepared dataset (BERT4Rec §4.1, SASRec §IV-A)."""

    format: str | None = None  # reader name; None = from the file name
    # k-core: users / items with fewer interactions are dropped (both papers: 5). None: 5 for a
    # raw log; no filter for a `user item` file (the papers' format), which is a published,
    # already-filtered dataset that a second k-core would shrink (e.g. Beauty). A number applies.
    min_user_interactions: int | None = None
    min_item_interactions: int | None = None
    user_col: str = "user"  # generic csv/parquet only
    item_col: str = "item"
    time_col: str | None = "timestamp"  # None: rows already in time order per user
    separator: str = ","
    # How a CSV or Parquet log is read: "memory" (the file's text at once), "stream" (Polars'
    # streaming engine, two passes over the three columns: memory bounded by the typed table,
    # not the file), "auto": stream a plain file over 1 GiB. The prepared data is the same.
    reader: Literal["auto", "memory", "stream"] = "auto"
    # How the held-out targets are chosen (seqrec.data.split). "leave_one_out" (the papers'):
    # each user's last item is the test target, the one before it the validation target.
    # "time": a cut in time (`time_cut`); training is every interaction before it, and each
    # user with history before the cut and two items after it has the first as its validation
    # target and the second as its test target (production-like evaluation).
    split: Literal["leave_one_out", "time"] = "leave_one_out"
    # The cut of the time split: a fraction in (0, 1) (that share of the interactions comes
    # before it), seconds since the epoch, or an ISO date or time ("2003-01-01", UTC).
    time_cut: float | str | None = None


@dataclass(frozen=True)
class EvalConfig:
    """Candidate protocols and metrics (BERT4Rec §4.2, SASRec §IV-D)."""

    protocols: tuple[str, ...] = ("full", "uni100", "pop100")
    ks: tuple[int, ...] = (1, 5, 10)
    n_negatives: int = 100
    negative_seed: int = 42  # the sampled candidates are drawn once per prepared dataset
    batch_size: int = 256
    # 0: every user of a split is ranked. N > 0: the same N users of each split (a seeded sample,
    # `negative_seed`), for logs too large to rank every user at each validation; a run's
    # metrics then record `eval_sample_users`
    sample_users: int = 0


@dataclass(frozen=True)
class ItemsConfig:
    """An items table and the features the models read from it (seqrec.data.items_table,
    seqrec.data.item_features, seqrec.models.tower). No features: items are ids only."""

    # a CSV/TSV/Parquet file with a header, or a MovieLens movies.dat; "<frame>" when the
    # estimator's `fit(..., items=frame)` was given a table in memory
    table: str | None = None
    item_col: str = "item"
    # the feature columns, "name" (its kind read from its type) or "name:kind", kinds: category,
    # categories, number, vector, text (seqrec.data.items_table)
    features: tuple[str, ...] = ()
    separator: str = "|"  # between the values of a multi-valued category in one string
    text_dim: int = 32  # a text feature's vector: its top singular directions
    # how a text feature becomes a vector: "hashed" (built in: hashed n-grams, TF-IDF, the top
    # `text_dim` singular directions) or "sentence-transformers:MODEL" (a sentence-embedding
    # model by name or folder; needs `pip install 'seqrec[text]'`; `text_dim` unused)
    text_encoder: str = "hashed"
    # each item's id embedding is left out of a training step with this probability, so that
    # its features learn to stand for it alone (what a cold item has); 1: features only
    id_dropout: float = 0.0
    # an item added after training takes the id embedding of the trained items nearest to it by
    # features: the mean of this many (1: its nearest item's own; more: their average, which
    # places it in the middle of its neighbours rather than like one of them)
    cold_neighbours: int = 1
