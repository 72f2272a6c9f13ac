"""The prepared-dataset directory: what every model trains and is evaluated on.

    manifest.json      format version, source fingerprint (path, size, mtime) and every setting
    sequences.parquet  (user, item) internal ids, each user's items oldest first, users in order
    vocab.json         {"users": [external ids...], "items": [external ids...]}; internal item i
                       is items[i - 1], internal user u is users[u]
    stats.json         the Table-1 row (see preprocess.dataset_stats)
    negatives.npz      sampled candidates, (E, n) per split and protocol: valid_uni100, ...

It is rebuilt only when its inputs or settings change, and written to a temporary directory that
is renamed into place when complete: an error never leaves a partial directory behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import polars as pl

from seqrec.data import download
from seqrec.data.candidates import (
    N_NEGATIVES,
    SAMPLED_PROTOCOLS,
    item_popularity,
    sample_negatives,
)
from seqrec.data.frames import frame_fingerprint, interactions_from_frame, is_frame
from seqrec.data.io import detect_format, read_interactions
from seqrec.data.preprocess import (
    Preprocessed,
    Sequences,
    dataset_stats,
    dense_codes,
    kcore_mask,
    preprocess,
)
from seqrec.data.settings import DataConfig, EvalConfig
from seqrec.data.split import (
    EvalSet,
    LeaveOneOut,
    Split,
    leave_one_out,
    time_cut_seconds,
    time_split,
    time_split_counts,
)
from seqrec.errors import ConfigError, DataError
from seqrec.files import (
    bound,
    check_name,
    json_object,
    read_checked,
    size_checked,
    write_failed,
)
from seqrec.outputs import check_out_dir, dir_kind
from seqrec.progress import Progress

__all__ = [
    "FORMAT_VERSION",
    "PreparedDataset",
    "load_prepared",
    "prepare",
    "prepare_frame",
    "read_sequences",
    "resolve_source",
]

# Bump whenever what a prepared directory holds changes: its files, the preprocessing, or how
# the candidates are sampled (old caches then rebuild instead of keeping old candidates).
# tests/test_prepared.py holds the digest of a small dataset's candidates for each version and
# fails when the sampler changes without a bump. 2: validation negatives may be the test item.
FORMAT_VERSION = 2


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
        if draws < 1:
            raise ValueError(f"draws: expected at least 1, got {draws}")
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


def resolve_source(
    data: str, fmt: str | None = None, *, progress: bool = True
) -> tuple[Path, str | None]:
    """`--data`: a dataset name (cache, then download) or a file path."""
    if data in download.DATASETS:
        source = download.DATASETS[data]
        return download.fetch(source, progress=progress), fmt or source.format
    path = Path(data).expanduser()
    if not path.exists():
        raise DataError(
            f"{data}: no such file, and not a dataset name ({', '.join(download.DATASETS)})"
        )
    return path, fmt


def _fingerprint(source: Path) -> dict[str, Any]:
    st = source.stat()
    return {"path": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _settings(data_cfg: DataConfig, eval_cfg: EvalConfig) -> dict[str, Any]:
    data = asdict(data_cfg)
    del data["reader"]  # how the file is read: the prepared data is the same
    if data_cfg.split == "leave_one_out":  # the keys of datasets prepared before the time split
        del data["split"], data["time_cut"]
    return {
        "format_version": FORMAT_VERSION,
        "data": data,
        "n_negatives": eval_cfg.n_negatives,
        "negative_seed": eval_cfg.negative_seed,
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


def _kcore_key(data_cfg: DataConfig, kcore: tuple[int, int]) -> dict[str, Any]:
    """The key's record of a k-core that the settings leave unset: none for the papers' 5-core
    (the keys of datasets prepared before logs were kept whole), else the thresholds."""
    unset = data_cfg.min_user_interactions is None and data_cfg.min_item_interactions is None
    return {} if not unset or kcore == (DEFAULT_KCORE, DEFAULT_KCORE) else {"kcore": list(kcore)}


def _note_unfiltered(source: Path, df: pl.DataFrame) -> None:
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


def _default_dir(name: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return download.cache_dir() / "prepared" / f"{name}-{digest}"


def _dataset_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".txt", ".csv", ".dat", ".json", ".jsonl", ".parquet"):
        name = name.removesuffix(suffix)
    return name or "dataset"


_SAME: Any = object()  # a column argument not given: the data settings' own


def prepare(
    data: str | Path | Any,
    *,
    data_cfg: DataConfig | None = None,
    eval_cfg: EvalConfig | None = None,
    out: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    inputs: Sequence[Path | str] = (),
    user_col: str | None = None,
    item_col: str | None = None,
    time_col: str | None = _SAME,
    name: str | None = None,
) -> PreparedDataset:
    """Read, preprocess, split and sample candidates for a dataset name, a file, or a log in
    memory (a polars DataFrame or LazyFrame, a pandas DataFrame, an Arrow table: any id types,
    datetime or numeric times, or `time_col=None` for rows already in time order per user);
    reuse the prepared directory while the source and every setting are unchanged. A prepared
    dataset's directory given as `data` is loaded as it is. `user_col`, `item_col`, `time_col`
    override `data_cfg`'s (for frames, and for CSV/Parquet files).

    `out` (default: a folder of the cache named by the source and settings) must be new, empty
    or a prepared dataset; one prepared from another source or settings is replaced only with
    `force`. It may not be or contain the source file or any of `inputs` (paths the caller
    reads, such as a run directory). Refusals are one ConfigError line, before anything is
    read."""
    if name is not None:  # it names a folder of the cache
        check_name(name, "dataset name")
    data_cfg = _with_columns(data_cfg or DataConfig(), user_col, item_col, time_col)
    eval_cfg = eval_cfg or EvalConfig()
    out = None if out is None else Path(out)
    if is_frame(data):
        return _prepare_in_memory(data, data_cfg, eval_cfg, out, force, progress, inputs, name)
    if Path(data).is_dir() and dir_kind(Path(data)) == "prepared":
        return load_prepared(data)  # a prepared dataset given as the data: as it is
    if Path(data).is_dir():  # sequences prepared by another engine (read_sequences)
        return _prepare_sequences(Path(data), data_cfg, eval_cfg, out, force, progress, inputs)
    source, fmt = resolve_source(str(data), data_cfg.format, progress=progress)
    fmt = fmt or detect_format(source)
    kcore = kcore_thresholds(data_cfg, fmt, papers=str(data) in download.DATASETS)
    key = {"source": _fingerprint(source), **_settings(data_cfg, eval_cfg)}
    key |= _kcore_key(data_cfg, kcore)
    name = name or (str(data) if str(data) in download.DATASETS else _dataset_name(source))
    cached = out is None  # the cache's own folder, named by the key: seqrec's to replace
    out = out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, force, [source, *inputs])) is not None:
        return reused
    stages = Progress(0, f"prepare {name}", enabled=progress)
    stages.note(f"prepare {name}: reading {source} ({source.stat().st_size / 2**20:,.1f} MiB)")
    df = read_interactions(
        source,
        fmt,
        user_col=data_cfg.user_col,
        item_col=data_cfg.item_col,
        time_col=data_cfg.time_col,
        separator=data_cfg.separator,
        reader=data_cfg.reader,
    )
    if data_cfg.split == "time" and fmt in PUBLISHED_FORMATS:
        raise ConfigError(f'{source}: data.split = "time" needs timestamps; a {fmt} file has none')
    unset = data_cfg.min_user_interactions is None and data_cfg.min_item_interactions is None
    if fmt in PUBLISHED_FORMATS and unset:
        _note_unfiltered(source, df)
    ds = prepare_frame(
        df,
        out,
        name=name,
        key=key,
        data_cfg=data_cfg,
        eval_cfg=eval_cfg,
        kcore=kcore,
        replace=True,  # checked above
        progress=progress,
    )
    return ds


def _with_columns(
    cfg: DataConfig, user_col: str | None, item_col: str | None, time_col: str | None
) -> DataConfig:
    changes: dict[str, Any] = {}
    if user_col is not None:
        changes["user_col"] = user_col
    if item_col is not None:
        changes["item_col"] = item_col
    if time_col is not _SAME:
        changes["time_col"] = time_col
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _reuse(
    out: Path, key: dict[str, Any], cached: bool, force: bool, inputs: Sequence[Path | str]
) -> PreparedDataset | None:
    """The prepared dataset already in `out` for `key` (None: prepare it), after checking that
    `out` may be written (seqrec.outputs): another key's is replaced only with `force`, or
    when it is the cache's own folder."""
    if check_out_dir(out, "prepared", inputs=inputs) and not force:
        if _manifest_key(out) == key:
            return load_prepared(out)
        if not cached:
            raise ConfigError(
                f"--out {out}: holds a dataset prepared from another source or settings; "
                "--force replaces it"
            )
    return None


def _prepare_in_memory(
    data: Any,
    data_cfg: DataConfig,
    eval_cfg: EvalConfig,
    out: Path | None,
    force: bool,
    progress: bool,
    inputs: Sequence[Path | str],
    name: str | None,
) -> PreparedDataset:
    """`prepare` of a frame: its columns read into the interactions table, which is keyed by
    its content (so an unchanged frame reuses its prepared directory)."""
    df = interactions_from_frame(
        data, user_col=data_cfg.user_col, item_col=data_cfg.item_col, time_col=data_cfg.time_col
    )
    name = name or "frame"
    kcore = kcore_thresholds(data_cfg, None)  # a user's log: whole unless configured
    key = {"source": {"frame": frame_fingerprint(df)}, **_settings(data_cfg, eval_cfg)}
    key |= _kcore_key(data_cfg, kcore)
    cached = out is None
    out = out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, force, inputs)) is not None:
        return reused
    return prepare_frame(
        df,
        out,
        name=name,
        key=key,
        data_cfg=data_cfg,
        eval_cfg=eval_cfg,
        kcore=kcore,
        replace=True,  # checked above
        progress=progress,
    )


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


def _prepare_sequences(
    path: Path,
    data_cfg: DataConfig,
    eval_cfg: EvalConfig,
    out: Path | None,
    force: bool,
    progress: bool,
    inputs: Sequence[Path | str],
) -> PreparedDataset:
    """`prepare` of sequences another engine prepared (`read_sequences`): checked, then split,
    their candidates sampled and written as any prepared dataset (no k-core: they are taken as
    they are)."""
    if data_cfg.split == "time":
        raise ConfigError(
            f'{path}: data.split = "time" needs timestamps; prepared sequences have none'
        )
    table = path / "sequences.parquet"
    key = {
        "source": {"sequences": _fingerprint(table), "vocab": _fingerprint(path / "vocab.json")},
        **_settings(data_cfg, eval_cfg),
    }
    name = path.name
    cached = out is None
    out = out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, force, [path, *inputs])) is not None:
        return reused
    stages = Progress(0, f"prepare {name}", enabled=progress)
    stages.note(f"prepare {name}: checking the prepared sequences of {path}")
    pre = read_sequences(path)
    return _finish(pre, out, name, key, data_cfg, eval_cfg, stages)


def _manifest_key(path: Path) -> Any:
    try:
        manifest = read_checked(path / "manifest.json", bound("config"), root=path)
        return json.loads(manifest).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_frame(
    interactions: pl.DataFrame,
    out: Path,
    *,
    name: str,
    key: dict[str, Any] | None = None,
    data_cfg: DataConfig | None = None,
    eval_cfg: EvalConfig | None = None,
    kcore: tuple[int, int] | None = None,
    replace: bool = False,
    progress: bool = False,
) -> PreparedDataset:
    """Prepare an in-memory interactions table (e.g. synthetic data) into `out`; `kcore`
    (users, items) defaults to the configured thresholds, 1 (no filter) where unset. A k-core
    that removes anything says so in one line on stderr, and the dataset's stats record it
    ("kcore"). `out` must be new, empty or (with `replace`) a prepared dataset
    (seqrec.outputs)."""
    out = Path(out)
    if check_out_dir(out, "prepared") and not replace:
        raise ConfigError(f"{out}: holds a prepared dataset; replace=True replaces it")
    data_cfg = data_cfg or DataConfig()
    eval_cfg = eval_cfg or EvalConfig()
    key = key or {"source": {"in_memory": name}, **_settings(data_cfg, eval_cfg)}
    min_user, min_item = kcore or kcore_thresholds(data_cfg, None)
    stages = Progress(0, f"prepare {name}", enabled=progress)
    stages.note(
        f"prepare {name}: {interactions.height:,} interactions: time order, "
        f"{min_user}/{min_item}-core, ids"
    )
    _check_split(data_cfg)
    pre = preprocess(interactions, min_user_interactions=min_user, min_item_interactions=min_item)
    if pre.removed["interactions"]:
        r = pre.removed
        print(
            f"{name}: the {min_user}-user/{min_item}-item core removed {r['users']:,} users, "
            f"{r['items']:,} items and {r['interactions']:,} of {interactions.height:,} "
            "interactions (data.min_user_interactions = 1 and data.min_item_interactions = 1 "
            "keep them)",
            file=sys.stderr,
        )
    kcore_stats = {"min_user": min_user, "min_item": min_item, "removed": pre.removed}
    return _finish(pre, out, name, key, data_cfg, eval_cfg, stages, kcore_stats)


def _finish(
    pre: Preprocessed,
    out: Path,
    name: str,
    key: dict[str, Any],
    data_cfg: DataConfig,
    eval_cfg: EvalConfig,
    stages: Progress,
    kcore: dict[str, Any] | None = None,
) -> PreparedDataset:
    """The split, the sampled candidates and the directory of preprocessed sequences; the
    stats record the k-core (`kcore`) and how many test targets are items the training part
    never holds (a model cannot have learned them: reported, not dropped)."""
    stats: dict[str, Any] = dataset_stats(pre.sequences)
    if kcore is not None:
        stats["kcore"] = kcore
    before = None
    if data_cfg.split == "time":
        assert pre.times is not None and data_cfg.time_cut is not None
        cut = time_cut_seconds(data_cfg.time_cut, pre.times)
        after = pre.times >= cut
        users = pre.sequences.user_index()
        before = np.bincount(users[~after], minlength=pre.sequences.n_users)
        counts = time_split_counts(before, pre.sequences.lengths, cut)
        stats["time_split"] = asdict(counts)
        stages.note(
            f"prepare {name}: time split at {cut}: {counts.evaluated:,} users evaluated, "
            f"{counts.cold:,} cold (every item after the cut), {counts.one_after:,} with one item "
            "after it"
        )
        if counts.evaluated == 0:
            raise DataError(
                f"{name}: no user has an item before the cut and two after it "
                f"(data.time_cut = {data_cfg.time_cut!r})"
            )
    split = leave_one_out(pre.sequences) if before is None else time_split(pre.sequences, before)
    seen = np.zeros(pre.sequences.n_items + 1, dtype=bool)
    seen[split.train.items] = True
    unseen = int((~seen[split.test.targets]).sum())
    stats["test_targets_unseen"] = unseen
    if unseen:
        stages.note(
            f"prepare {name}: {unseen:,} of {len(split.test.targets):,} test targets are items "
            "the training part never holds (counted in every metric: no model can rank them "
            "from what it learned)"
        )
    stages.note(f"prepare {name}: sampling the candidates of {pre.sequences.n_users:,} users")
    negatives = _sample_all(pre.sequences, split, eval_cfg)
    manifest = {"name": name, "key": key, "stats": stats}
    _write_atomically(out, pre, manifest, negatives, before)
    stages.note(f"prepare {name}: written to {out}")
    del pre, split, negatives  # before they are read back (a million users: gigabytes)
    return load_prepared(out)


def _check_split(data_cfg: DataConfig) -> None:
    if data_cfg.split != "time":
        return
    if data_cfg.time_cut is None:
        raise ConfigError('data.split = "time" needs data.time_cut (a fraction, or a date)')
    if data_cfg.time_col is None:
        raise ConfigError('data.split = "time" needs a time column (data.time_col is none)')
    time_cut_seconds(data_cfg.time_cut, np.zeros(1, dtype=np.int64))  # a readable cut


def _sample_all(seqs: Sequences, split: LeaveOneOut, eval_cfg: EvalConfig) -> dict[str, np.ndarray]:
    return {
        f"{split_name}_{protocol}": _sample_split(
            seqs, split, split_name, protocol, eval_cfg.n_negatives, eval_cfg.negative_seed
        )
        for split_name in ("valid", "test")
        for protocol in SAMPLED_PROTOCOLS
    }


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


def _write_atomically(
    out: Path,
    pre: Preprocessed,
    manifest: dict[str, Any],
    negatives: dict[str, np.ndarray],
    before: np.ndarray | None = None,
) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    except OSError as err:
        raise write_failed(err, out) from None
    try:
        _write_files(tmp, out, pre, manifest, negatives, before)
    except (OSError, pl.exceptions.PolarsError) as err:  # a full disk, a lost mount: one line
        raise write_failed(err, out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_files(
    tmp: Path,
    out: Path,
    pre: Preprocessed,
    manifest: dict[str, Any],
    negatives: dict[str, np.ndarray],
    before: np.ndarray | None,
) -> None:
    """The prepared files into `tmp`, then `tmp` moved to `out`."""
    seqs = pre.sequences
    columns: dict[str, np.ndarray] = {
        "user": seqs.user_index().astype(np.int32),
        "item": seqs.items.astype(np.int32),
    }
    if before is not None:  # the time split: whether each item comes after the cut
        columns["after_cut"] = seqs.position_index() >= np.repeat(before, seqs.lengths)
    pl.DataFrame(columns).write_parquet(tmp / "sequences.parquet")
    vocab = {"users": pre.user_ids.to_list(), "items": pre.item_ids.to_list()}
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    (tmp / "stats.json").write_text(json.dumps(manifest["stats"], indent=2) + "\n")
    with (tmp / "negatives.npz").open("wb") as f:
        arrays: dict[str, Any] = {k: v.astype(np.int32, copy=False) for k, v in negatives.items()}
        np.savez(f, **arrays)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists() and any(out.iterdir()):
        # only a prepared dataset is ever replaced (checked again: nothing was added to it)
        check_out_dir(out, "prepared")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)  # a new name, or an empty directory's


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
