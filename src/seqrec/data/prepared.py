"""The prepared-dataset directory: what every model trains and is evaluated on.

    manifest.json      format version, source fingerprint (path, size, mtime) and every setting
    sequences.parquet  (user, item) internal ids, each user's items oldest first, users in order;
                       and `timestamp` (seconds) where the log has real timestamps
    vocab.json         {"users": [external ids...], "items": [external ids...]}; internal item i
                       is items[i - 1], internal user u is users[u]
    stats.json         the Table-1 row (see preprocess.dataset_stats)
    negatives.npz      sampled candidates, (E, n) per split and protocol: valid_uni100, ...

It is rebuilt only when its inputs or settings change, and written to a temporary directory that
is renamed into place when complete: an error never leaves a partial directory behind.
"""

from __future__ import annotations

import json
import threading
import weakref
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import polars as pl

from seqrec.data.candidates import (
    N_NEGATIVES,
    SAMPLED_PROTOCOLS,
    item_popularity,
    sample_negatives,
)
from seqrec.data.preprocess import (
    Preprocessed,
    Sequences,
)
from seqrec.data.settings import DataConfig
from seqrec.data.split import (
    EvalSet,
    LeaveOneOut,
    Split,
    leave_one_out,
    time_split,
)
from seqrec.errors import DataError
from seqrec.files import (
    bound,
    json_object,
    read_checked,
    size_checked,
)

if TYPE_CHECKING:
    from seqrec.data.item_features import ItemEncoder, ItemFeatures

__all__ = [
    "FORMAT_VERSION",
    "MAX_DRAWS",
    "SAME_COLUMN",
    "PreparedDataset",
    "load_prepared",
    "read_sequences",
]

# Bump whenever what a prepared directory holds changes: its files, the preprocessing, or how
# the candidates are sampled (old caches then rebuild instead of keeping old candidates).
# tests/test_prepared.py holds the digest of a small dataset's candidates for each version and
# fails when the sampler changes without a bump. 2: validation negatives may be the test item.
# 3: the log's timestamps are kept (sequences.parquet's `timestamp`).
FORMAT_VERSION = 3

# candidate draws one evaluation ranks against at most (`candidate_draws`; `seqrec evaluate
# --draws`): each holds every evaluated user's candidates
MAX_DRAWS = 1000


@dataclass
class PreparedDataset:
    path: Path
    manifest: dict[str, Any]
    sequences: Sequences
    user_ids: list[Any]
    item_ids: list[Any]
    stats: dict[str, Any]
    # the stored candidates, or the file that holds them, open since the dataset was loaded and
    # read on first use: recommending and serving never need them (at a million users, 1.6 GB),
    # and a folder prepared again meanwhile does not change them
    _negatives: dict[str, np.ndarray] | BinaryIO
    # the time split: how many of each user's items come before the cut (None: leave-one-out)
    before_cut: np.ndarray | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.path.name))

    def item_features(self) -> tuple[ItemEncoder, ItemFeatures] | None:
        """The encoder and features of its items, when it was prepared with an items table
        (`prepare(..., items=...)`); None otherwise."""
        from seqrec.data.prepared_items import read_prepared_items

        return read_prepared_items(self.path)

    @property
    def n_items(self) -> int:
        return self.sequences.n_items

    @property
    def n_users(self) -> int:
        """Users of the data (internal indices 0..n_users-1, the rows of `sequences`)."""
        return self.sequences.n_users

    def data_settings(self) -> DataConfig | None:
        """The [data] settings it was prepared with (reader, columns, k-core), as its manifest
        records them; None for a directory from before they were recorded."""
        data = (self.manifest.get("key") or {}).get("data")
        try:
            return DataConfig(**data) if isinstance(data, dict) else None
        except TypeError:  # keys of another version
            return None

    @cached_property
    def split(self) -> LeaveOneOut:
        """Its training part and held-out targets: leave-one-out, or the time split it was
        prepared with (`data.split`)."""
        if self.before_cut is not None:
            return time_split(self.sequences, self.before_cut)
        return leave_one_out(self.sequences)

    def negatives(self, split: Split) -> dict[str, np.ndarray]:
        """The stored sampled candidates of one split, by protocol."""
        with self._lock:
            if not isinstance(self._negatives, dict):
                handle = self._negatives
                self._negatives = _read_negatives(handle)
                handle.close()
            stored = self._negatives
        return {p: stored[f"{split}_{p}"] for p in SAMPLED_PROTOCOLS}

    def eval_data(
        self, split: Split, sample_users: int = 0, seed: int = 42
    ) -> tuple[EvalSet, dict[str, np.ndarray]]:
        """One split's users, histories and targets with their stored candidates; with
        `sample_users` N > 0, only the split's users among a seeded sample of N of all users (the
        same sample for validation and test, in user order)."""
        eval_set, negatives = self.split.eval_set(split), self.negatives(split)
        rows = self._sampled_rows(eval_set, sample_users, seed)
        if rows is not None:
            eval_set = eval_set.take(rows)
            negatives = {p: n[rows] for p, n in negatives.items()}
        return eval_set, negatives

    def _sampled_rows(self, eval_set: EvalSet, sample_users: int, seed: int) -> np.ndarray | None:
        """The rows of `eval_set` among a seeded sample of `sample_users` users; None: all."""
        if not 0 < sample_users < len(eval_set.targets):
            return None
        chosen = np.random.default_rng(seed).permutation(self.n_users)[:sample_users]
        return np.flatnonzero(np.isin(eval_set.users, chosen))

    @property
    def candidate_seed(self) -> int:
        """The seed its stored candidates were drawn with (`eval.negative_seed`)."""
        return int(self.manifest.get("key", {}).get("negative_seed", 42))

    def candidate_draws(
        self, split: Split, draws: int, sample_users: int = 0, seed: int = 42
    ) -> list[dict[str, np.ndarray]]:
        """The sampled protocols' candidates of one split for `draws` draws: the stored ones
        first, then those the seeds of `draw_seeds` after it give (drawn as `prepare` draws the
        stored ones, with as many negatives); `sample_users`, `seed`: see `eval_data`."""
        if not 1 <= draws <= MAX_DRAWS:  # each draw holds its candidates in memory
            raise ValueError(f"draws: expected 1..{MAX_DRAWS:,}, got {draws}")
        eval_set = self.split.eval_set(split)
        rows = self._sampled_rows(eval_set, sample_users, seed)
        n = int(self.manifest.get("key", {}).get("n_negatives", N_NEGATIVES))
        out = [self.negatives(split)]
        for s in draw_seeds(self.candidate_seed, draws)[1:]:
            out.append(
                {
                    p: _sample_split(self.sequences, self.split, split, p, n, s)
                    for p in SAMPLED_PROTOCOLS
                }
            )
        return out if rows is None else [{p: c[rows] for p, c in d.items()} for d in out]


SAME_COLUMN: Any = object()  # a column argument not given: the data settings' own


def read_sequences(path: Path) -> Preprocessed:
    """Sequences prepared by another engine (a Spark job, SQL): a directory holding
    `vocab.json`, {"users": [ids], "items": [ids]}, and `sequences.parquet`, integer columns
    `user` (0-based positions in `users`) and `item` (1-based positions in `items`), one row an
    interaction, grouped by user in ascending order and oldest first within a user; every
    listed user has a row. The schema of seqrec's own prepared directories; what they add
    (the split, the candidates, the manifest) `prepare` computes. Each check is one DataError
    line naming the file and what was expected."""
    vocab_path, table_path = path / "vocab.json", path / "sequences.parquet"
    for f in (vocab_path, table_path):
        if not f.is_file():
            raise DataError(
                f"{path}: not a prepared dataset, and no {f.name} of prepared sequences "
                "(sequences.parquet with integer columns user and item, vocab.json)"
            )
    try:
        vocab = json.loads(read_checked(vocab_path, bound("vocab"), error=DataError))
    except ValueError as e:
        raise DataError(f"{vocab_path}: not JSON ({str(e)[:120]})") from None
    if not (
        isinstance(vocab, dict)
        and all(isinstance(vocab.get(k), list) and vocab[k] for k in ("users", "items"))
    ):
        raise DataError(f'{vocab_path}: expected {{"users": [ids...], "items": [ids...]}}')
    users, items = vocab["users"], vocab["items"]
    try:
        schema = pl.read_parquet_schema(table_path)
        for c in ("user", "item"):
            if c not in schema or not schema[c].is_integer():
                found = schema.get(c, "no such column")
                raise DataError(f"{table_path}: column {c} must be integers, found {found}")
        checked = size_checked(table_path, bound("prepared"), error=DataError)
        table = pl.read_parquet(checked, columns=["user", "item"])
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(f"{table_path}: could not read as Parquet ({str(e)[:120]})") from None
    if table.null_count().sum_horizontal().item():
        raise DataError(f"{table_path}: missing values in user or item")
    user = table.get_column("user").to_numpy().astype(np.int64)
    item = table.get_column("item").to_numpy().astype(np.int64)
    if len(user) == 0:
        raise DataError(f"{table_path}: no rows")
    bad = np.flatnonzero((user < 0) | (user >= len(users)))
    if len(bad):
        raise DataError(
            f"{table_path}: row {bad[0]}: user {user[bad[0]]} is not a position in vocab.json's "
            f"{len(users):,} users (0..{len(users) - 1})"
        )
    bad = np.flatnonzero((item < 1) | (item > len(items)))
    if len(bad):
        raise DataError(
            f"{table_path}: row {bad[0]}: item {item[bad[0]]} is not in 1..{len(items):,} "
            "(vocab.json's items, 1-based)"
        )
    bad = np.flatnonzero(np.diff(user) < 0)
    if len(bad):
        raise DataError(
            f"{table_path}: row {bad[0] + 1}: user {user[bad[0] + 1]} after user {user[bad[0]]}; "
            "rows must be grouped by user in ascending order"
        )
    lengths = np.bincount(user, minlength=len(users))
    if (lengths == 0).any():
        raise DataError(f"{table_path}: user {int(np.argmin(lengths))} of vocab.json has no rows")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Preprocessed(
        sequences=Sequences(items=item, offsets=offsets, n_items=len(items)),
        user_ids=pl.Series("user", users),
        item_ids=pl.Series("item", items),
    )


def _sample_split(
    seqs: Sequences, split: LeaveOneOut, split_name: Split, protocol: str, n: int, seed: int
) -> np.ndarray:
    """One split's candidates under one sampled protocol, for the candidate seed `seed`."""
    # What a split's negatives must avoid: the items known at its time. Test: the whole
    # sequence. Validation: the items up to and including its target, i.e. the test input; the
    # test item is the future there and may be drawn (blocking it would leak it).
    if split_name == "valid":
        seen, rows = split.test.histories, np.arange(len(split.test.users))
    else:
        seen, rows = seqs, split.test.users
    weights = item_popularity(seqs) if protocol == "pop100" else None
    # one independent, reproducible stream per (split, protocol)
    s_i, p_i = ("valid", "test").index(split_name), SAMPLED_PROTOCOLS.index(protocol)
    stream = int(np.random.SeedSequence([seed, s_i, p_i]).generate_state(1)[0])
    return sample_negatives(seen, rows, n=n, weights=weights, seed=stream)


def draw_seeds(own: int, draws: int) -> list[int]:
    """The candidate seeds of `draws` draws: the stored one (`own`) first, then the smallest
    non-negative integers other than it."""
    others = (s for s in range(draws + 1) if s != own)
    return [own, *(next(others) for _ in range(draws - 1))]


def _json(path: Path, kind: str) -> dict[str, Any]:
    """A prepared dataset's JSON file, looked at before it is read (seqrec.files)."""
    data = read_checked(path, bound(kind), root=path.parent, error=DataError)
    return json_object(data, path, DataError, "prepare again")


def _looked_at(path: Path) -> Path:
    """A prepared dataset's table or arrays, looked at before a reader opens it."""
    return size_checked(path, bound("prepared"), root=path.parent, error=DataError)


def _read_negatives(handle: BinaryIO) -> dict[str, np.ndarray]:
    """A prepared dataset's stored candidates, split_protocol -> (E, n) int32, from the open
    file `handle`."""
    try:
        handle.seek(0)
        with np.load(handle) as npz:
            return {k: npz[k].astype(np.int32, copy=False) for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(
            f"{handle.name}: not readable as stored candidates ({first}); prepare again"
        ) from None


def load_prepared(path: str | Path) -> PreparedDataset:
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise DataError(f"{path}: not a prepared dataset (no manifest.json); run `seqrec prepare`")
    manifest = _json(manifest_path, "config")
    version = manifest.get("key", {}).get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"{path}: prepared with format {version}, expected {FORMAT_VERSION}; prepare again"
        )
    vocab = _json(path / "vocab.json", "vocab")
    table = pl.read_parquet(_looked_at(path / "sequences.parquet"))
    users = table.get_column("user").to_numpy().astype(np.int64)
    n_users = len(vocab["users"])
    offsets = np.concatenate([[0], np.cumsum(np.bincount(users, minlength=n_users))]).astype(
        np.int64
    )
    seqs = Sequences(
        items=table.get_column("item").to_numpy().astype(np.int64),
        offsets=offsets,
        n_items=len(vocab["items"]),
        times=(
            table.get_column("timestamp").to_numpy().astype(np.int64)
            if "timestamp" in table.columns
            else None
        ),
    )
    negatives_file = _looked_at(path / "negatives.npz")
    stats = _json(path / "stats.json", "metrics")
    before = None
    if "after_cut" in table.columns:
        after = table.get_column("after_cut").to_numpy()
        before = np.bincount(users[~after], minlength=n_users).astype(np.int64)
    negatives = negatives_file.open("rb")  # read when first needed
    ds = PreparedDataset(
        path=path,
        manifest=manifest,
        sequences=seqs,
        user_ids=vocab["users"],
        item_ids=vocab["items"],
        stats=stats,
        _negatives=negatives,
        before_cut=before,
    )
    weakref.finalize(ds, negatives.close)  # closed with the dataset, if never read
    return ds
