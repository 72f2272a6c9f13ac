"""A run from start to end: `fit` checks everything first, opens the run directory (or resumes
it), decides what the run trains once (`policy.resolve`), sets it up (`setup`), trains it
(`loop`), and evaluates the state chosen on VALIDATION on the test split, once, at the end; what
metrics.json records. `train_or_reuse`: a finished run of the same config is reused as it was
trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from seqrec.config import RunConfig
from seqrec.data.candidates import item_popularity
from seqrec.data.item_features import ItemEncoder, ItemFeatures, items_file_bytes
from seqrec.data.prepared import PreparedDataset
from seqrec.data.prepared_items import encode_items
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import PROTOCOLS, evaluate_split, parse_protocols
from seqrec.models.base import SequenceModel
from seqrec.outputs import check_out_dir
from seqrec.provenance import git_commit, git_diff, machine
from seqrec.training import checkpoint as ckpt
from seqrec.training.distributed import (
    Ranks,
    broadcast,
    device_for,
    on_main,
    process_group,
    ranks,
)
from seqrec.training.loop import _LoopState, _test_splits, _train
from seqrec.training.policy import resolve
from seqrec.training.run_checks import judge
from seqrec.training.rundir import RunDir
from seqrec.training.setup import Training, _init_state, resolve_device, setup, torch_settings
from seqrec.training.validation import validate, with_prepared_items

__all__ = ["FitResult", "check_run_out", "fit", "train_or_reuse"]


@dataclass
class FitResult:
    run_dir: Path
    model: SequenceModel
    metrics: dict[str, Any]


def fit(
    ds: PreparedDataset,
    cfg: RunConfig,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    source: dict[str, Any] | None = None,
    inputs: Sequence[str | Path] = (),
    break_lock: bool = False,
    keep_checkpoints: bool = False,
    items_table: Any = None,
    items: tuple[ItemEncoder, ItemFeatures] | None = None,
) -> FitResult:
    """Train `cfg.model` on `ds`; the run directory `out` receives everything (see checkpoint).
    One training at a time holds the directory (`checkpoint.run_lock`). `out` must be new or
    empty (a run directory with `resume`), and may not be or contain the prepared data or any of
    `inputs` (the source file, a run it refits). `break_lock` takes a lock that another host's
    process left (RunDir.lock). A finished run keeps its last checkpoint only, both with
    `keep_checkpoints`. `items_table`: the items table (a frame or a path) in place of
    `cfg.items.table`, for a run with item features; `items`: its encoder and the features of
    `ds`'s items, already made (a refit takes its run's). Without either, and without features
    in `cfg`, the features `ds` was prepared with are read (`prepare(..., items=...)`).

    Under torchrun (seqrec.training.distributed) every rank calls `fit`; rank 0 alone checks, locks
    and writes the run directory, and its error, if any, is every rank's."""
    run_dir = Path(out)
    if not resume:  # every value in range, the run to start from fitting, before any file
        if items is None and items_table is None:
            cfg = with_prepared_items(cfg, ds)  # features kept with the prepared data
        validate(cfg, ds)
        if items is None and cfg.items.features:  # a bad table: one line
            start = RunDir(cfg.train.init_from).item_features() if cfg.train.init_from else None
            encoder = start[0] if start is not None else None
            items = encode_items(cfg.items, ds.item_ids, items_table, encoder)
        if cfg.train.init_from:
            with torch.device("meta"):
                shaped = ckpt.build_model(cfg, ds.n_items, ds.n_users, _features(items))
            _init_state(shaped, Path(cfg.train.init_from), cfg, ds)
    r = ranks()
    run = RunDir(run_dir)
    with process_group(r, resolve_device(cfg.train.device)), contextlib.ExitStack() as stack:

        def opening() -> None:
            check_run_out(run_dir, resume=resume, inputs=[ds.path, *inputs])
            stack.enter_context(run.lock(break_lock=break_lock))

        on_main(r, opening)
        return _fit(
            ds,
            cfg,
            run,
            resume=resume,
            progress=progress,
            source=source,
            keep_checkpoints=keep_checkpoints,
            ranks=r,
            items=items,
        )


def check_run_out(out: Path, *, resume: bool, inputs: Sequence[str | Path] = ()) -> None:
    """A new run's directory must be new or empty and may not be or contain any of `inputs`
    (seqrec.outputs); one line otherwise. A resumed run's is checked when it is opened."""
    if not resume and check_out_dir(out, "run", inputs=inputs):
        raise ConfigError(
            f"{out}: already holds files of a run; choose a new --out, or --resume an "
            "unfinished run"
        )


def train_or_reuse(
    out: Path,
    cfg: RunConfig,
    ds: PreparedDataset | Callable[[], PreparedDataset],
    *,
    source: dict[str, Any] | None = None,
    progress: bool = True,
    trust: bool = False,
) -> dict[str, Any]:
    """The metrics of the run in `out` for `cfg`: a finished run's, as it was trained; an
    interrupted one's after resuming it; else a new run's. A run of another config is refused in
    one line naming the differing keys. `ds` may be a function that prepares the data, called
    only when there is training to do (sweeps and benchmarks that reuse finished runs). `trust`:
    reuse a finished run without a manifest (one of an older seqrec)."""
    from seqrec.config import config_diff
    from seqrec.training.policy import as_trained

    run = RunDir(out, trust=trust)
    if run.started:
        stored = run.config()  # its epochs tiers: as the run's timing decided them
        diff = config_diff(as_trained(stored), as_trained(cfg, like=stored))
        if diff:
            raise ConfigError(
                f"{out}: holds a run of another config ({'; '.join(diff)}); "
                "move it away or change the config back"
            )
    if (metrics := run.metrics()) is not None:
        return metrics
    data = ds() if callable(ds) else ds
    resume = run.has_checkpoint
    return fit(data, cfg, out, resume=resume, progress=progress, source=source).metrics


def _fit(
    ds: PreparedDataset,
    cfg: RunConfig,
    run: RunDir,
    *,
    resume: bool,
    progress: bool,
    source: dict[str, Any] | None,
    keep_checkpoints: bool = False,
    ranks: Ranks | None = None,
    items: tuple[ItemEncoder, ItemFeatures] | None = None,
) -> FitResult:
    """Open the run (or resume it), set the training up, run the loop, test the chosen state.
    In a distributed run (`ranks`) rank 0 decides what is timed, writes, validates and tests;
    every rank trains."""
    r = ranks or Ranks()
    state = run.checkpoint() if resume else None
    if resume:
        if not run.started:
            raise ConfigError(f"{run.path}: nothing to resume (no run started there)")
        if run.finished:
            raise ConfigError(f"{run.path}: the run has already finished (its metrics are in)")
        cfg = run.config()  # the run goes on with the settings it started with
        items = run.item_features()
    if r.main:  # decided on rank 0 alone (an epochs tier is timed): every rank trains it
        say = (lambda line: tqdm.write(line, file=sys.stderr)) if progress else None
        cfg = resolve(cfg, ds, resolve_device(cfg.train.device).type, say=say)
    cfg = broadcast(cfg, r)
    progress = progress and r.main
    device = device_for(r, resolve_device(cfg.train.device))
    commit = state["git_commit"] if state and "git_commit" in state else git_commit()
    if state is not None:
        run.check_items(ds.item_ids)
    with torch_settings(cfg.train, device):
        # the model, its batches, loss and optimiser first: what they refuse leaves no file
        precision = state.get("precision") if state is not None else None
        # rank 0 first: its "auto" precisions, timed there, are every rank's
        features = _features(items)
        mine = (
            setup(ds, cfg, device, fresh=state is None, precision=precision, features=features)
            if r.main
            else None
        )
        precision = broadcast(mine.precision if mine is not None else None, r)
        training = (
            mine
            if mine is not None
            else setup(ds, cfg, device, fresh=state is None, precision=precision, features=features)
        )
        if state is None and r.main:
            _start(run, ds, cfg, source, items)
        loop = _LoopState.restored(state, training) if state is not None else _LoopState()
        training.distribute(r)
        stopped = _train(training, ds, run, loop, device=device, commit=commit, progress=progress)
        if not r.main:  # rank 0 tests and writes
            return FitResult(run.path, training.model, {})
        metrics = _test(training, ds, loop, stopped, device=device, commit=commit)
    run.save_model(training.model.state_dict())
    run.finish(metrics, keep_checkpoints=keep_checkpoints)
    return FitResult(run.path, training.model, metrics)


def _features(items: tuple[ItemEncoder, ItemFeatures] | None) -> ItemFeatures | None:
    return None if items is None else items[1]


def _start(
    run: RunDir,
    ds: PreparedDataset,
    cfg: RunConfig,
    source: dict[str, Any] | None,
    items: tuple[ItemEncoder, ItemFeatures] | None = None,
) -> None:
    """A new run's first files. Its config records the data settings `ds` was prepared with
    (a DataFrame or a file with its own columns prepared from Python is prepared the same way
    again by `evaluate`/`refit` on the run)."""
    settings = ds.data_settings()
    if settings is not None and settings != cfg.data:
        cfg = dataclasses.replace(cfg, data=settings)
    popularity = item_popularity(ds.split.training(cfg.train.train_on)).tolist()
    recorded = {**(source or {}), "prepared": str(ds.path)}
    origin = (ds.manifest.get("key") or {}).get("source") or {}
    if "data" not in recorded and "path" in origin:  # fit from Python: the file it read
        recorded["data"] = origin["path"]
    run.start(
        {**cfg.to_dict(), "source": recorded},
        # the training popularity: the ranking a recommender gives an empty history
        {"items": ds.item_ids, "popularity": popularity, "n_users": ds.n_users},
        code_diff=git_diff(),
        items=None if items is None else items_file_bytes(*items),
    )


def _test(
    training: Training,
    ds: PreparedDataset,
    loop: _LoopState,
    stopped: str,
    *,
    device: torch.device,
    commit: str,
) -> dict[str, Any]:
    """The test split, once, with the state chosen on validation (train+valid: the last
    state), and everything the run's metrics record."""
    cfg, model = training.cfg, training.model
    t = cfg.train
    validating = t.train_on == "train"
    best = loop.best
    if not validating:
        best = {"metric": math.nan, "epoch": len(loop.history) - 1, "state": None}
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    metrics: dict[str, Any] = {"model": cfg.model, "dataset": ds.name, "data": _data_record(ds)}
    for split in _test_splits(cfg):
        report = evaluate_split(
            ds,
            training.scorer(device),
            split,
            protocols=cfg.eval.protocols or PROTOCOLS,
            ks=cfg.eval.ks,
            batch_size=cfg.eval.batch_size,
            device=device,
            sample_users=cfg.eval.sample_users,
            seed=cfg.eval.negative_seed,
        )
        metrics[split] = report.metrics
        if cfg.eval.sample_users:  # metrics of a sample of the users: said beside them
            metrics["eval_sample_users"] = {
                **metrics.get("eval_sample_users", {}),
                split: len(report.users),
            }
    history = loop.history
    # what the run learned, said where it is too little (seqrec.training.run_checks)
    metrics.update(
        judge(cfg, ds, history, metrics, stopped, loop.step, training.scorer(device), device)
    )
    train_seconds = sum(h["epoch_s"] for h in history)
    n_samples = sum(h["sequences"] for h in history)
    val_protocol = parse_protocols(t.val_protocol)[0]
    metrics.update(
        {
            "best_epoch": best["epoch"],
            "epochs": len(history),
            "steps": loop.step,
            "stopped": stopped,
            "lr_reductions": loop.reductions,
            "selected_on": f"valid {val_protocol} {t.val_metric}"
            if validating
            else f"being the last (train.train_on = {t.train_on})",
            "train_on": t.train_on,
            "wall_time_s": time.perf_counter() - loop.started,
            "train_time_s": train_seconds,
            "seq_per_s": n_samples / max(train_seconds, 1e-9),
            "cpu_util": _cpu_util(history),
            "seed": t.seed,
            "negative_seed": cfg.eval.negative_seed,  # the stored candidates' seed
            "precision": {**training.precision, "decided_in_s": training.precision_s},
            "device": str(device),
            "git_commit": commit,
            "machine": machine(),
        }
    )
    return metrics


def _data_record(ds: PreparedDataset) -> dict[str, Any]:
    """What a run's metrics record of its data: its sizes, the k-core that made it (what it
    removed) and the test targets its training part never holds."""
    keys = ("users", "items", "actions", "kcore", "test_targets_unseen")
    return {k: ds.stats[k] for k in keys if k in ds.stats}


def _cpu_util(history: list[dict[str, Any]]) -> float | None:
    """The epochs' CPU use per wall second per thread, time-weighted (None for old logs)."""
    lines = [h for h in history if "cpu_util" in h]
    seconds = sum(h["epoch_s"] for h in lines)
    if not lines or seconds <= 0:
        return None
    return sum(h["cpu_util"] * h["epoch_s"] for h in lines) / seconds
