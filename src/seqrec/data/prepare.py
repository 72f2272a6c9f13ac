"""Preparing a dataset: a log read, filtered, split and its candidates drawn, written as one
prepared directory atomically (or an unchanged one reused)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from seqrec.data import download
from seqrec.data.candidates import SAMPLED_PROTOCOLS
from seqrec.data.frames import frame_fingerprint, interactions_from_frame, is_frame
from seqrec.data.io import detect_format, read_interactions
from seqrec.data.prepared import (
    FORMAT_VERSION,
    SAME_COLUMN,
    PreparedDataset,
    _sample_split,
    load_prepared,
    read_sequences,
)
from seqrec.data.prepared_files import write_atomically
from seqrec.data.prepared_items import PreparedItems
from seqrec.data.preprocess import (
    PUBLISHED_FORMATS,
    Preprocessed,
    Sequences,
    dataset_stats,
    kcore_key,
    kcore_thresholds,
    note_unfiltered,
    preprocess,
)
from seqrec.data.settings import DataConfig, EvalConfig, ItemsConfig
from seqrec.data.split import (
    LeaveOneOut,
    leave_one_out,
    time_cut_seconds,
    time_split,
    time_split_counts,
)
from seqrec.errors import ConfigError, DataError
from seqrec.files import (
    bound,
    check_name,
    read_checked,
)
from seqrec.outputs import check_out_dir, dir_kind
from seqrec.progress import Progress

if TYPE_CHECKING:
    from seqrec.config import RunConfig

__all__ = ["prepare", "prepare_frame", "prepared", "resolve_source"]


@dataclass(frozen=True)
class _Job:
    """What a `prepare` call asks of whichever source it reads (a file, a frame, sequences)."""

    data_cfg: DataConfig
    eval_cfg: EvalConfig
    out: Path | None
    force: bool
    progress: bool
    inputs: Sequence[Path | str]
    name: str | None
    items: PreparedItems | None


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


def _default_dir(name: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return download.cache_dir() / "prepared" / f"{name}-{digest}"


def _dataset_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".txt", ".csv", ".dat", ".json", ".jsonl", ".parquet"):
        name = name.removesuffix(suffix)
    return name or "dataset"


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
    time_col: str | None = SAME_COLUMN,
    name: str | None = None,
    items: Any = None,
    item_features: Sequence[str] | str | Mapping[str, str] | None = None,
    items_cfg: ItemsConfig | None = None,
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
    read.

    `items` (a frame or a file) and `item_features` ("genres:categories", "title:text", ...):
    an items table whose features are encoded for the dataset's items and kept with it
    (seqrec.data.prepared_items; `PreparedDataset.item_features()`), read with `items_cfg`'s
    item column, separator and text settings (or its table and features, when given there). A
    run trained on the dataset reads them. The table is checked before anything is written."""
    if name is not None:  # it names a folder of the cache
        check_name(name, "dataset name")
    data_cfg = _with_columns(data_cfg or DataConfig(), user_col, item_col, time_col)
    eval_cfg = eval_cfg or EvalConfig()
    out = None if out is None else Path(out)
    table = PreparedItems.read(items, item_features, items_cfg)
    job = _Job(data_cfg, eval_cfg, out, force, progress, inputs, name, table)
    if is_frame(data):
        return _prepare_in_memory(data, job)
    if Path(data).is_dir() and dir_kind(Path(data)) == "prepared":
        if table is not None:
            raise ConfigError(
                f"{data}: a prepared dataset is taken as it is; its items table is given when "
                "it is prepared from its log"
            )
        return load_prepared(data)  # a prepared dataset given as the data: as it is
    if Path(data).is_dir():  # sequences prepared by another engine (read_sequences)
        return _prepare_sequences(Path(data), job)
    return _prepare_file(str(data), job)


def _prepare_file(data: str, job: _Job) -> PreparedDataset:
    """`prepare` of a file, or of a dataset name (the cache, or a download)."""
    data_cfg, eval_cfg, progress = job.data_cfg, job.eval_cfg, job.progress
    source, fmt = resolve_source(data, data_cfg.format, progress=progress)
    fmt = fmt or detect_format(source)
    kcore = kcore_thresholds(data_cfg, fmt, papers=data in download.DATASETS)
    key = {"source": _fingerprint(source), **_settings(data_cfg, eval_cfg)}
    key |= kcore_key(data_cfg, kcore) | _items_key(job.items)
    name = job.name or (data if data in download.DATASETS else _dataset_name(source))
    cached = job.out is None  # the cache's own folder, named by the key: seqrec's to replace
    out = job.out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, job.force, [source, *job.inputs])) is not None:
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
        note_unfiltered(source, df)
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
        items=job.items,
        timed=has_timestamps(fmt, data_cfg),
    )


def has_timestamps(fmt: str, data_cfg: DataConfig) -> bool:
    """Whether a file of format `fmt` read with `data_cfg` gives real timestamps: not the
    papers' files (time-ordered lines, no times), nor a CSV or Parquet log read without a time
    column."""
    if fmt in PUBLISHED_FORMATS:
        return False
    return fmt not in ("csv", "parquet") or data_cfg.time_col is not None


def _items_key(table: PreparedItems | None) -> dict[str, Any]:
    return {} if table is None else {"items": table.key()}


def _with_columns(
    cfg: DataConfig, user_col: str | None, item_col: str | None, time_col: str | None
) -> DataConfig:
    changes: dict[str, Any] = {}
    if user_col is not None:
        changes["user_col"] = user_col
    if item_col is not None:
        changes["item_col"] = item_col
    if time_col is not SAME_COLUMN:
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


def _prepare_in_memory(data: Any, job: _Job) -> PreparedDataset:
    """`prepare` of a frame: its columns read into the interactions table, which is keyed by
    its content (so an unchanged frame reuses its prepared directory)."""
    data_cfg, eval_cfg = job.data_cfg, job.eval_cfg
    df = interactions_from_frame(
        data, user_col=data_cfg.user_col, item_col=data_cfg.item_col, time_col=data_cfg.time_col
    )
    name = job.name or "frame"
    kcore = kcore_thresholds(data_cfg, None)  # a user's log: whole unless configured
    key = {"source": {"frame": frame_fingerprint(df)}, **_settings(data_cfg, eval_cfg)}
    key |= kcore_key(data_cfg, kcore) | _items_key(job.items)
    cached = job.out is None
    out = job.out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, job.force, job.inputs)) is not None:
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
        progress=job.progress,
        items=job.items,
        timed=data_cfg.time_col is not None,
    )


def _prepare_sequences(path: Path, job: _Job) -> PreparedDataset:
    """`prepare` of sequences another engine prepared (`read_sequences`): checked, then split,
    their candidates sampled and written as any prepared dataset (no k-core: they are taken as
    they are)."""
    data_cfg, eval_cfg = job.data_cfg, job.eval_cfg
    if data_cfg.split == "time":
        raise ConfigError(
            f'{path}: data.split = "time" needs timestamps; prepared sequences have none'
        )
    table = path / "sequences.parquet"
    key = {
        "source": {"sequences": _fingerprint(table), "vocab": _fingerprint(path / "vocab.json")},
        **_settings(data_cfg, eval_cfg),
    } | _items_key(job.items)
    name = path.name
    cached = job.out is None
    out = job.out or _default_dir(name, key)
    if (reused := _reuse(out, key, cached, job.force, [path, *job.inputs])) is not None:
        return reused
    stages = Progress(0, f"prepare {name}", enabled=job.progress)
    stages.note(f"prepare {name}: checking the prepared sequences of {path}")
    pre = read_sequences(path)
    return _finish(pre, out, name, key, data_cfg, eval_cfg, stages, items=job.items)


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
    items: PreparedItems | None = None,
    timed: bool | None = None,
) -> PreparedDataset:
    """Prepare an in-memory interactions table (e.g. synthetic data) into `out`; `kcore`
    (users, items) defaults to the configured thresholds, 1 (no filter) where unset. A k-core
    that removes anything says so in one line on stderr, and the dataset's stats record it
    ("kcore"). `out` must be new, empty or (with `replace`) a prepared dataset
    (seqrec.outputs). `items`: an items table whose features the dataset keeps. `timed`: its
    timestamps are real times, kept with the sequences (default: `data_cfg.time_col` is set)."""
    out = Path(out)
    if check_out_dir(out, "prepared") and not replace:
        raise ConfigError(f"{out}: holds a prepared dataset; replace=True replaces it")
    data_cfg = data_cfg or DataConfig()
    eval_cfg = eval_cfg or EvalConfig()
    key = key or {"source": {"in_memory": name}, **_settings(data_cfg, eval_cfg)}
    key |= _items_key(items)
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
    if data_cfg.time_col is not None if timed is None else timed:
        pre = dataclasses.replace(
            pre, sequences=dataclasses.replace(pre.sequences, times=pre.times)
        )
    kcore_stats = {"min_user": min_user, "min_item": min_item, "removed": pre.removed}
    return _finish(pre, out, name, key, data_cfg, eval_cfg, stages, kcore_stats, items)


def _finish(
    pre: Preprocessed,
    out: Path,
    name: str,
    key: dict[str, Any],
    data_cfg: DataConfig,
    eval_cfg: EvalConfig,
    stages: Progress,
    kcore: dict[str, Any] | None = None,
    items: PreparedItems | None = None,
) -> PreparedDataset:
    """The split, the sampled candidates and the directory of preprocessed sequences; the
    stats record the k-core (`kcore`) and how many test targets are items the training part
    never holds (a model cannot have learned them: reported, not dropped). `items`' features
    are encoded first: an item without a row stops it before anything is written."""
    items_bytes = None if items is None else items.file_bytes(pre.item_ids.to_list())
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
    write_atomically(out, pre, manifest, negatives, before, items_bytes)
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


def prepared(
    data: Any,
    cfg: RunConfig,
    progress: bool,
    *,
    user_col: str | None = None,
    item_col: str | None = None,
    time_col: str | None = SAME_COLUMN,
) -> PreparedDataset:
    """`data` prepared with `cfg`'s data and evaluation settings (a PreparedDataset as it is);
    the columns, where given, override the settings' (`time_col=None`: rows in time order)."""
    if isinstance(data, PreparedDataset):
        return data
    columns: dict[str, Any] = {"user_col": user_col, "item_col": item_col}
    if time_col is not SAME_COLUMN:
        columns["time_col"] = time_col
    return prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=progress, **columns)
