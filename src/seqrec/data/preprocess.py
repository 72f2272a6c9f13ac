"""Pure preprocessing, as in both papers (BERT4Rec §4.1, SASRec §IV-A):

1. every rating / review is one implicit interaction (ratings are dropped by the readers);
2. each user's interactions are ordered by timestamp, ties kept in file order (a stable sort:
   shared/data/README.md shows this is what produced the papers' ML-1M file);
3. an iterative k-core filter with separate user and item thresholds (5 and 5 for the papers);
4. contiguous internal ids: users 0..U-1, items 1..n with 0 = padding. Both are assigned in the
   sorted order of the external ids, so a file whose ids are already 1..n keeps them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec.data.settings import DataConfig
from seqrec.errors import DataError

__all__ = [
    "Preprocessed",
    "Sequences",
    "dataset_stats",
    "dense_codes",
    "kcore_mask",
    "left_pad",
    "left_pad_times",
    "preprocess",
]


@dataclass(frozen=True)
class Sequences:
    """Every user's item sequence in CSR form: user u's items are `items[offsets[u]:offsets[u+1]]`,
    oldest first. Items are internal ids 1..n_items (0 is padding and never appears here)."""

    items: np.ndarray  # (T,) int64
    offsets: np.ndarray  # (U + 1,) int64
    n_items: int
    # (T,) int64 seconds since the epoch of every entry of `items`, where the log has real
    # timestamps (not a file's line order); None otherwise
    times: np.ndarray | None = None

    @property
    def n_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, user: int) -> np.ndarray:
        return self.items[self.offsets[user] : self.offsets[user + 1]]

    def take(self, rows: np.ndarray, drop_last: np.ndarray | int = 0) -> Sequences:
        """A new CSR holding, for each r in `rows`, self[r] without its last `drop_last` items."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts - drop_last
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # position k of output row j comes from self.items[starts[j] + k]
        src = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        times = None if self.times is None else self.times[src]
        return Sequences(self.items[src], offsets, self.n_items, times)

    def user_index(self) -> np.ndarray:
        """(T,) the user of every entry of `items`."""
        return np.repeat(np.arange(self.n_users, dtype=np.int64), self.lengths)

    def position_index(self) -> np.ndarray:
        """(T,) 0-based position of every entry of `items` within its user's sequence."""
        return np.arange(len(self.items), dtype=np.int64) - np.repeat(
            self.offsets[:-1], self.lengths
        )

    @classmethod
    def from_lists(
        cls,
        seqs: list[list[int]],
        n_items: int | None = None,
        times: list[list[int]] | None = None,
    ) -> Sequences:
        """Build from Python lists (tests, small inputs); `times` in the shape of `seqs`."""
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.array([i for s in seqs for i in s], dtype=np.int64)
        n = int(items.max()) if n_items is None and len(items) else int(n_items or 0)
        flat = None if times is None else np.array([t for s in times for t in s], dtype=np.int64)
        if flat is not None and len(flat) != len(items):
            raise ValueError(f"times: {len(flat)} timestamps for {len(items)} items")
        return cls(items=items, offsets=offsets, n_items=n, times=flat)


def left_pad(items: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """(B, width): the last `width` items of each slice items[starts[b]:ends[b]], left-padded
    with 0 (most recent last)."""
    if len(items) == 0:
        return np.zeros((len(starts), width), dtype=np.int64)
    idx = ends[:, None] - width + np.arange(width)[None, :]  # (B, L)
    real = idx >= starts[:, None]
    return np.where(real, items[np.where(real, idx, 0)], 0)


def left_pad_times(
    times: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int, query: np.ndarray
) -> np.ndarray:
    """(B, width + 1) int64: `left_pad` of the items' `times` (0 for padding), then each row's
    `query` time, the time its recommendation is for: what a model of time reads
    (`SequenceModel.uses_times`)."""
    return np.concatenate([left_pad(times, starts, ends, width), query[:, None]], axis=1)


@dataclass(frozen=True)
class Preprocessed:
    sequences: Sequences
    user_ids: pl.Series  # external id of internal user u at position u
    item_ids: pl.Series  # external id of internal item i at position i - 1
    times: np.ndarray | None = None  # (T,) the timestamp of each of `sequences.items`
    # what the k-core removed: {"users", "items", "interactions"} (all 0 when nothing)
    removed: dict[str, int] = field(default_factory=dict)


def kcore_mask(
    user_codes: np.ndarray, item_codes: np.ndarray, min_user: int, min_item: int
) -> np.ndarray:
    """Rows kept by the iterative k-core: repeat dropping users with < min_user and items with
    < min_item interactions until nothing changes. Codes are 0-based dense ids."""
    keep = np.ones(len(user_codes), dtype=bool)
    n_users = int(user_codes.max()) + 1 if len(user_codes) else 0
    n_items = int(item_codes.max()) + 1 if len(item_codes) else 0
    while True:
        uc = np.bincount(user_codes[keep], minlength=n_users)
        ic = np.bincount(item_codes[keep], minlength=n_items)
        new_keep = keep & (uc[user_codes] >= min_user) & (ic[item_codes] >= min_item)
        if new_keep.sum() == keep.sum():
            return keep
        keep = new_keep


def dense_codes(col: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """0-based codes in the sorted order of the values, and the sorted unique values."""
    uniques = col.unique().sort()
    codes = (col.rank("dense") - 1).cast(pl.Int64).to_numpy()
    return codes, uniques


def preprocess(
    interactions: pl.DataFrame, *, min_user_interactions: int = 5, min_item_interactions: int = 5
) -> Preprocessed:
    """Interactions table (see `io`) -> time-ordered, k-core-filtered internal sequences."""
    if interactions.height == 0:
        raise DataError("no interactions to preprocess")
    if min_user_interactions < 1 or min_item_interactions < 1:
        raise DataError("k-core thresholds must be >= 1")
    # (user, timestamp, line): `line` is unique, so this is the stable sort by time within user.
    # (`line` orders ties only: dropped once sorted, as is every copy no longer needed, since a
    # log of tens of millions of rows holds a few hundred MB per column)
    df = (
        interactions.select("user", "item", "timestamp", "line")
        .sort(["user", "timestamp", "line"])
        .drop("line")
    )
    u_codes, user_ids = dense_codes(df.get_column("user"))
    i_codes, item_ids = dense_codes(df.get_column("item"))
    keep = kcore_mask(u_codes, i_codes, min_user_interactions, min_item_interactions)
    if not keep.any():
        raise DataError(
            f"no interactions left after the {min_user_interactions}-user/"
            f"{min_item_interactions}-item core filter"
        )
    before = (len(user_ids), len(item_ids), df.height)
    if not keep.all():
        del u_codes, i_codes
        df = df.filter(pl.Series(keep))
        u_codes, user_ids = dense_codes(df.get_column("user"))
        i_codes, item_ids = dense_codes(df.get_column("item"))
    del keep
    removed = {
        "users": before[0] - len(user_ids),
        "items": before[1] - len(item_ids),
        "interactions": before[2] - df.height,
    }
    lengths = np.bincount(u_codes, minlength=len(user_ids))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    seqs = Sequences(items=i_codes + 1, offsets=offsets, n_items=len(item_ids))
    times = df.get_column("timestamp").to_numpy().astype(np.int64)
    return Preprocessed(
        sequences=seqs, user_ids=user_ids, item_ids=item_ids, times=times, removed=removed
    )


def dataset_stats(seqs: Sequences) -> dict[str, float | int]:
    """The row of BERT4Rec's Table 1.

    `avg_length` and `density` count the *training part* after leave-one-out (every user with
    at least 3 items gives its last two to validation and test), which is how the paper's ML-1m row
    was computed: (999,611 - 2 * 6,040) / 6,040 = 163.5 and 987,531 / (6,040 * 3,416) = 4.79 %.
    `avg_length_all` is the plain actions / users.
    """
    users, items, actions = seqs.n_users, seqs.n_items, int(len(seqs.items))
    held_out = 2 * int((seqs.lengths >= 3).sum())
    train = actions - held_out
    return {
        "users": users,
        "items": items,
        "actions": actions,
        "avg_length": round(train / users, 4) if users else 0.0,
        "density": round(train / (users * items), 6) if users and items else 0.0,
        "avg_length_all": round(actions / users, 4) if users else 0.0,
    }


DEFAULT_KCORE = 5  # both papers' k-core on their raw logs


# Formats whose files are already a paper's dataset (filtered and mapped to ids by its authors).
PUBLISHED_FORMATS = frozenset({"user-item"})


def kcore_thresholds(
    data_cfg: DataConfig, fmt: str | None, papers: bool = False
) -> tuple[int, int]:
    """The (users, items) k-core a prepare applies: the configured thresholds; an unset one is
    5 for one of the papers' raw datasets by name (`papers`: ml-1m, ml-20m, steam, beauty, as
    the papers prepared them) and 1 (no filter) for any other log: a user's log is kept whole
    (every item can be recommended, every user evaluated)."""
    default = DEFAULT_KCORE if papers and fmt not in PUBLISHED_FORMATS else 1
    u, i = data_cfg.min_user_interactions, data_cfg.min_item_interactions
    return (default if u is None else u, default if i is None else i)


def kcore_key(data_cfg: DataConfig, kcore: tuple[int, int]) -> dict[str, Any]:
    """The key's record of a k-core that the settings leave unset: none for the papers' 5-core
    (the keys of datasets prepared before logs were kept whole), else the thresholds."""
    unset = data_cfg.min_user_interactions is None and data_cfg.min_item_interactions is None
    return {} if not unset or kcore == (DEFAULT_KCORE, DEFAULT_KCORE) else {"kcore": list(kcore)}


def note_unfiltered(source: Path, df: pl.DataFrame) -> None:
    """Say so on stderr when the default 5-core would have changed a published file."""
    if df.height == 0:
        return
    users, _ = dense_codes(df.get_column("user"))
    items, _ = dense_codes(df.get_column("item"))
    keep = kcore_mask(users, items, DEFAULT_KCORE, DEFAULT_KCORE)
    if keep.all():
        return
    print(
        f"{source.name}: a published `user item` dataset, taken as it is; a {DEFAULT_KCORE}-core "
        f"would keep {int(keep.sum()):,} of its {df.height:,} interactions "
        f"(--min-user-interactions {DEFAULT_KCORE} --min-item-interactions {DEFAULT_KCORE} "
        "applies it)",
        file=sys.stderr,
    )
