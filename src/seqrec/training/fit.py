"""One training loop for every neural model: AdamW with linear warm-up and decay, gradient
clipping, validation every k epochs, early stopping and the best state chosen on VALIDATION only,
a wall-clock budget, a checkpoint per epoch (so `--resume` continues an interrupted run), and the
test split evaluated once, at the end, with the best state.

Randomness: epoch e's batches come from a generator seeded by (seed, e) and its dropout from
torch's generator seeded by (seed, e); a resumed run therefore repeats exactly the epochs an
uninterrupted one would have run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from seqrec.config import (
    RunConfig,
    TrainConfig,
    adapt_to_data,
    apply_device_tiers,
    apply_short_budget,
    parse_duration,
    speed_tiers,
)
from seqrec.data.batches import Batch
from seqrec.data.negatives import NegativeSampler
from seqrec.data.prepared import PreparedDataset
from seqrec.data.split import Split
from seqrec.errors import ConfigError, DataError, TrainingError
from seqrec.evaluation.metrics import summarize
from seqrec.evaluation.protocols import PROTOCOLS, evaluate, parse_protocols
from seqrec.models.base import BlockScores, Sampler, SequenceModel
from seqrec.models.registry import entry
from seqrec.progress import Progress
from seqrec.provenance import cpu_flags, git_commit, git_diff, machine
from seqrec.training import checkpoint as ckpt
from seqrec.training.distributed import (
    Ranks,
    all_gather,
    all_mean,
    broadcast,
    broadcast_float,
    device_for,
    on_main,
    process_group,
    ranks,
    shard,
)
from seqrec.training.losses import LossSpec, full_cross_entropy, model_loss
from seqrec.training.outputs import check_out_dir
from seqrec.training.run_checks import judge
from seqrec.training.rundir import RunDir
from seqrec.training.validation import validate

__all__ = [
    "FitResult",
    "ModelScorer",
    "Training",
    "fit",
    "loss_spec",
    "lr_factor",
    "make_optimizer",
    "resolve_device",
    "resolve_precision",
    "setup",
    "train_or_reuse",
    "train_step",
]


def loss_spec(cfg: RunConfig, n_items: int) -> LossSpec:
    """The loss `cfg.train` asks for; settings its negatives cannot combine with are one
    ConfigError line (`NegativeSampler.check`, which validation runs first)."""
    NegativeSampler.check(cfg)
    t = cfg.train
    bf16 = _resolved(t.bf16, "bf16") or _resolved(t.loss_bf16, "loss_bf16")
    return LossSpec(
        name=t.loss,
        n_items=n_items,
        n_negatives=t.n_negatives,
        negatives_per=t.negatives_per,
        gbce_t=t.gbce_t,
        logq=t.logq,
        bf16=bf16,
        prior_offset=t.prior_offset,
        bpreg=t.bpreg,
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"train.device: {name!r} is not a device (auto, cpu, cuda, cuda:0)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no GPU is available")
    return device


def make_optimizer(model: SequenceModel, cfg: RunConfig) -> torch.optim.Optimizer:
    t = cfg.train
    # §4.3: L2 weight decay 0.01, as in BERT not on LayerNorm weights and biases (1-d tensors)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": t.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=t.lr,
        betas=(t.beta1, t.beta2),
        eps=t.eps,
        fused=True if t.fused_adamw else None,
    )


def train_step(
    model: SequenceModel,
    spec: LossSpec,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    t: TrainConfig,
    device: torch.device,
    *,
    forward: nn.Module | None = None,
    weight: float = 1.0,
) -> torch.Tensor:
    """One update on `batch` (bf16 autocast and clipping as `t` says); returns the loss, a
    0-dim tensor on `device`. Nothing here waits for the device: on a GPU the host goes on to
    the next batch while this one runs, and reading the loss (`float`) is what waits.
    `forward`: the model as it runs forward (DistributedDataParallel's wrapper of `model` in a
    distributed run); `weight`: this rank's share of the batch (seqrec.training.distributed.shard)."""
    index = batch.index().to(device, non_blocking=device.type == "cuda")
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=_resolved(t.bf16, "bf16")):
        loss = model_loss(
            model,
            spec,
            batch.inputs,
            index,
            batch.targets,
            batch.negatives,
            batch.model_inputs(users=model.uses_users),
            forward=forward,
        )
    if batch.loss_scale * weight != 1.0:
        loss = loss * (batch.loss_scale * weight)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if t.clip_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    optimizer.step()
    return loss.detach()


def lr_factor(
    step: int,
    warmup: int,
    progress: float,
    shape: str = "linear",
    decay_start: float = 0.0,
) -> float:
    """Linear warm-up to the peak over `warmup` steps; then the peak until `progress` (the share
    of the schedule done, by steps or by the time budget; 0 throughout: a constant rate) reaches
    `decay_start`, and a `shape` ("linear" or "cosine") decay to 0 at progress 1."""
    if step < warmup:
        return (step + 1) / warmup
    x = min(1.0, max(0.0, (progress - decay_start) / (1.0 - decay_start)))
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    return 1.0 - x


def _best_time(
    fn: Callable[[], Any], repeats: int = 3, device: torch.device | None = None
) -> float:
    """The fastest of `repeats` calls of `fn` after one untimed, each timed until `device` has
    done its work (a GPU runs what it is given after the call returns)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def synchronize(device: torch.device | None) -> None:
    """Wait until a GPU `device` has run everything queued on it (nothing to wait for on a CPU)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _has_matrix_units(device: torch.device) -> bool:
    """A GPU, or a CPU whose flags show AMX tiles for bf16 (Intel Sapphire Rapids and later)."""
    return device.type == "cuda" or "amx_bf16" in cpu_flags()


def _has_bf16_instructions(device: torch.device) -> bool:
    """A GPU, or a CPU with bf16 dot products (AVX512-BF16) or AMX. Without them bf16 matmuls
    are emulated, many times slower than fp32 (docs/results/performance.md, "The machines")."""
    return device.type == "cuda" or bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


LOSS_TIMING_TARGETS = 4096


def resolve_precision(
    cfg: RunConfig,
    model: SequenceModel,
    batch: Batch,
    n_items: int,
    device: torch.device,
) -> tuple[RunConfig, dict[str, Any]]:
    """`cfg` with "auto" precisions decided for this machine, and what was measured.

    `train.loss_bf16 = "auto"`: fp32 where there are no bf16 instructions (a CPU without
    AVX512-BF16 or AMX) or a loss other than "ce" (the only one it applies to); else the chunked
    CE's forward and backward on random features of this model's width, for a batch's targets
    (at most `LOSS_TIMING_TARGETS`), timed in fp32 and in bf16 (best of 3); the faster wins.
    `train.bf16 = "auto"`: fp32 where there are no bf16 matrix units (a CPU without AMX); else a
    few forward and backward passes of `model` on `batch` timed both ways (gradients
    discarded, weights untouched)."""
    t = cfg.train
    found: dict[str, Any] = {}
    bf16, loss_bf16 = t.bf16, t.loss_bf16
    if loss_bf16 == "auto" and t.loss != "ce":
        loss_bf16 = False
        found["loss_bf16_reason"] = "fp32: it applies to the full-catalogue CE only"
    elif loss_bf16 == "auto" and not _has_bf16_instructions(device):
        loss_bf16 = False
        found["loss_bf16_reason"] = "fp32: no bf16 instructions (no AVX512-BF16, no AMX, no GPU)"
    elif loss_bf16 == "auto":
        d = int(model.output_weights()[0].shape[1])
        # the batch's targets, at most LOSS_TIMING_TARGETS of them: the two precisions' ratio
        # is what is decided, and a million-item catalogue's whole batch would take minutes
        m = max(1, min(int(batch.targets.shape[0]), LOSS_TIMING_TARGETS))
        gen = torch.Generator().manual_seed(0)
        z = torch.randn(m, d, generator=gen).to(device).requires_grad_()
        w = (0.02 * torch.randn(n_items, d, generator=gen)).to(device).requires_grad_()
        y = torch.randint(1, n_items + 1, (m,), generator=gen).to(device)

        def ce(use_bf16: bool) -> Callable[[], None]:
            return lambda: full_cross_entropy(z, w, None, y, bf16=use_bf16).backward()

        found["loss_s"] = {
            "fp32": _best_time(ce(False), device=device),
            "bf16": _best_time(ce(True), device=device),
        }
        loss_bf16 = found["loss_s"]["bf16"] < found["loss_s"]["fp32"]
    if bf16 == "auto":
        if not _has_matrix_units(device):
            bf16 = False
            found["bf16_reason"] = "fp32: no bf16 matrix units (no AMX, no GPU)"
        else:
            on = batch.to(device)
            spec = loss_spec(_with_precision(cfg, False, bool(loss_bf16)), n_items)

            def step(use_bf16: bool) -> Callable[[], None]:
                def run() -> None:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss = model_loss(
                            model,
                            spec,
                            on.inputs,
                            on.positions,
                            on.targets,
                            on.negatives,
                            on.model_inputs(),
                        )
                    loss.backward()
                    model.zero_grad(set_to_none=True)

                return run

            found["step_s"] = {
                "fp32": _best_time(step(False), 2, device),
                "bf16": _best_time(step(True), 2, device),
            }
            bf16 = found["step_s"]["bf16"] < found["step_s"]["fp32"]
    return _with_precision(cfg, bool(bf16), bool(loss_bf16)), found


class ModelScorer:
    """Wraps a model as a `Scorer` in eval mode (dropout off), optionally under bf16."""

    def __init__(self, model: SequenceModel, bf16: bool, device: torch.device) -> None:
        self.model, self.bf16, self.device = model, bf16, device
        self.max_len: int | None = model.max_len

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.model.score(histories, users).float()

    @property
    def blockwise(self) -> bool:
        return self.model.blockwise

    def block_scores(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> BlockScores:
        return self.model.block_scores(histories, users, bf16=self.bf16)


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
) -> FitResult:
    """Train `cfg.model` on `ds`; the run directory `out` receives everything (see checkpoint).
    One training at a time holds the directory (`checkpoint.run_lock`). `out` must be new or
    empty (a run directory with `resume`), and may not be or contain the prepared data or any of
    `inputs` (the source file, a run it refits). `break_lock` takes a lock that another host's
    process left (RunDir.lock). A finished run keeps its last checkpoint only, both with
    `keep_checkpoints`.

    Under torchrun (seqrec.training.distributed) every rank calls `fit`; rank 0 alone checks, locks and
    writes the run directory, and its error, if any, is every rank's."""
    run_dir = Path(out)
    if not resume:  # every value in range, the run to start from fitting, before any file
        validate(cfg, ds)
        if cfg.train.init_from:
            with torch.device("meta"):
                shaped = ckpt.build_model(cfg, ds.n_items, ds.n_users)
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
        )


def check_run_out(out: Path, *, resume: bool, inputs: Sequence[str | Path] = ()) -> None:
    """A new run's directory must be new or empty and may not be or contain any of `inputs`
    (seqrec.training.outputs); one line otherwise. A resumed run's is checked when it is opened."""
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
    from seqrec.config import as_trained, config_diff

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
    if cfg.adapt:  # the recipe's sizes fitted to this data (the run's config records the values)
        train = ds.split.training(cfg.train.train_on)
        cfg, fitted = adapt_to_data(cfg, train.lengths, ds.n_items)
        if progress:
            tqdm.write(f"sizes fitted to the data: {'; '.join(fitted)}", file=sys.stderr)
    # what it trains, and what the run's config records (an epochs tier times this machine first)
    measuring = bool(speed_tiers(cfg))  # never for a resumed run: its recorded config decided
    if r.main:  # timed on rank 0 alone: every rank trains what it decided
        cfg = apply_device_tiers(cfg, resolve_device(cfg.train.device).type)
        cfg = validate(apply_short_budget(cfg, lambda base: epochs_bought(ds, base)), ds)
    cfg = broadcast(cfg, r)
    progress = progress and r.main
    if measuring and progress:
        tqdm.write(_decided(cfg), file=sys.stderr)
    device = device_for(r, resolve_device(cfg.train.device))
    commit = state["git_commit"] if state and "git_commit" in state else git_commit()
    if state is not None:
        run.check_items(ds.item_ids)
    with torch_settings(cfg.train, device):
        # the model, its batches, loss and optimiser first: what they refuse leaves no file
        precision = state.get("precision") if state is not None else None
        # rank 0 first: its "auto" precisions, timed there, are every rank's
        mine = setup(ds, cfg, device, fresh=state is None, precision=precision) if r.main else None
        precision = broadcast(mine.precision if mine is not None else None, r)
        training = (
            mine
            if mine is not None
            else setup(ds, cfg, device, fresh=state is None, precision=precision)
        )
        if state is None and r.main:
            _start(run, ds, cfg, source)
        loop = _LoopState.restored(state, training) if state is not None else _LoopState()
        training.distribute(r)
        stopped = _train(training, ds, run, loop, device=device, commit=commit, progress=progress)
        if not r.main:  # rank 0 tests and writes
            return FitResult(run.path, training.model, {})
        metrics = _test(training, ds, loop, stopped, device=device, commit=commit)
    run.save_model(training.model.state_dict())
    run.finish(metrics, keep_checkpoints=keep_checkpoints)
    return FitResult(run.path, training.model, metrics)


@contextlib.contextmanager
def torch_settings(t: TrainConfig, device: torch.device) -> Iterator[None]:
    """The torch settings a run asks for (TF32 on CUDA, `train.threads` CPU threads), for the
    run only: the caller's are restored when it ends, so a library call leaves the process as
    it found it.

    On CUDA the cuDNN attention backend is left out of scaled_dot_product_attention: torch
    tries it first for bf16 attention with a padding mask, and cuDNN builds an execution plan
    for every new (batch, length) shape, which packed and cropped batches change at every step
    (measured on an H200: bf16 training 13x slower than fp32 with it). The fused
    memory-efficient kernel takes those calls instead; fp32 attention never used cuDNN."""
    saved = (
        torch.get_num_threads(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.cudnn_sdp_enabled(),
    )
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = t.tf32
            torch.backends.cudnn.allow_tf32 = t.tf32
            torch.backends.cuda.enable_cudnn_sdp(False)
        if t.threads > 0:
            torch.set_num_threads(t.threads)
        yield
    finally:
        if torch.get_num_threads() != saved[0]:
            torch.set_num_threads(saved[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1:3]
        torch.backends.cuda.enable_cudnn_sdp(saved[3])


def _start(run: RunDir, ds: PreparedDataset, cfg: RunConfig, source: dict[str, Any] | None) -> None:
    """A new run's first files. Its config records the data settings `ds` was prepared with
    (a DataFrame or a file with its own columns prepared from Python is prepared the same way
    again by `evaluate`/`refit` on the run)."""
    settings = ds.data_settings()
    if settings is not None and settings != cfg.data:
        cfg = dataclasses.replace(cfg, data=settings)
    train_items = ds.split.training(cfg.train.train_on).items
    popularity = np.bincount(train_items, minlength=ds.n_items + 1).tolist()
    recorded = {**(source or {}), "prepared": str(ds.path)}
    origin = (ds.manifest.get("key") or {}).get("source") or {}
    if "data" not in recorded and "path" in origin:  # fit from Python: the file it read
        recorded["data"] = origin["path"]
    run.start(
        {**cfg.to_dict(), "source": recorded},
        # the training popularity: the ranking a recommender gives an empty history
        {"items": ds.item_ids, "popularity": popularity, "n_users": ds.n_users},
        code_diff=git_diff(),
    )


@dataclass
class _LoopState:
    """Where a training loop stands: what a checkpoint saves and `--resume` restores."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(
        default_factory=lambda: {"metric": -math.inf, "epoch": -1, "state": None}
    )
    start_epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    bad: int = 0
    started: float = 0.0  # time.perf_counter() at the run's start, its resumed time counted
    reductions: list[int] = field(default_factory=list)  # epochs after which a plateau lowered lr

    @classmethod
    def restored(cls, state: dict[str, Any], training: Training) -> _LoopState:
        training.model.load_state_dict(state["model"])
        training.optimizer.load_state_dict(state["optimizer"])
        return cls(
            history=state["history"],
            best={**state["best"], "state": state["best_state"]},
            start_epoch=state["epoch"] + 1,
            step=state["step"],
            elapsed=state["elapsed"],
            bad=state["bad"],
            reductions=list(state.get("reductions", [])),
        )

    def record(self, value: float, epoch: int, model: nn.Module, t: TrainConfig) -> None:
        """A validation result: the state is kept if it is the best so far, else one more
        epoch without improvement (a plateau schedule lowers the rate after every
        `plateau_patience` of them in a row)."""
        if value > self.best["metric"]:
            self.best = {
                "metric": value,
                "epoch": epoch,
                "state": copy.deepcopy(model.state_dict()),
            }
            self.bad = 0
        else:
            self.bad += 1
            if t.decay == "plateau" and self.bad % t.plateau_patience == 0:
                self.reductions.append(epoch)

    def checkpoint(
        self, training: Training, epoch: int, commit: str, precision: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "model": training.model.state_dict(),
            "optimizer": training.optimizer.state_dict(),
            "epoch": epoch,
            "step": self.step,
            "elapsed": self.elapsed,
            "bad": self.bad,
            "reductions": self.reductions,
            "history": self.history,
            "best": {k: v for k, v in self.best.items() if k != "state"},
            "best_state": self.best["state"],
            "git_commit": commit,  # the code the run started with
            "precision": precision,
        }


def _schedule(
    training: Training, total_steps: int, budget: float, loop: _LoopState
) -> Callable[[int, float], float]:
    """set_lr(step, seconds): the learning rate of the update about to be made, set on the
    optimiser (warm-up, then the decay by steps, by the budget's seconds, by the plateaus
    `loop` records, or none)."""
    t = training.cfg.train

    def set_lr(step: int, seconds: float) -> float:
        peak = t.lr
        if t.decay == "plateau":
            peak *= t.plateau_factor ** len(loop.reductions)
        if t.decay in ("none", "plateau"):
            progress = 0.0
        elif t.decay == "budget":
            progress = seconds / budget
        else:  # by steps; the decay starts after the warm-up
            progress = (step - t.warmup_steps) / max(1, total_steps - t.warmup_steps)
        lr = peak * lr_factor(step, t.warmup_steps, progress, t.decay_shape, t.decay_start)
        for group in training.optimizer.param_groups:
            group["lr"] = lr
        return lr

    return set_lr


def _train(
    training: Training,
    ds: PreparedDataset,
    run: RunDir,
    loop: _LoopState,
    *,
    device: torch.device,
    commit: str,
    progress: bool,
) -> str:
    """The loop: epochs of updates, each epoch logged and checkpointed, validated every
    `eval_every` (the best state kept), until the epochs, the steps or the budget end or
    validation stops improving. Returns why it stopped."""
    cfg, model, sampler, r = training.cfg, training.model, training.sampler, training.ranks
    t = cfg.train
    budget = parse_duration(t.time_budget) if t.time_budget else math.inf
    total_steps = t.max_epochs * len(sampler)
    if t.max_steps > 0:
        total_steps = min(total_steps, t.max_steps)
    set_lr = _schedule(training, total_steps, budget, loop)
    val_protocol = parse_protocols(t.val_protocol)[0]
    validating = t.train_on == "train"
    stopped = "max_epochs"
    bar = _bar(cfg, budget, total_steps, loop, progress)
    loop.started = started = time.perf_counter() - loop.elapsed
    model.train()
    events = run.event_log() if t.tensorboard and r.main else None
    # every epoch's batches, from one builder that runs on across the epochs' ends (with
    # train.prefetch, a thread that builds the next epoch's first batches while this one ends)
    batches = prefetched(_epochs(sampler, loop.start_epoch, t.max_epochs), t.prefetch)
    try:
        for epoch in range(loop.start_epoch, t.max_epochs):
            torch.manual_seed(int(np.random.SeedSequence([t.seed, epoch]).generate_state(1)[0]))
            epoch_start, cpu_start = time.perf_counter(), time.process_time()
            e = _updates(
                training, run, loop, epoch, batches, bar, set_lr, started, budget, total_steps
            )
            loss_sum, n_batches, n_seq, lr, out_of_time = e
            seconds = time.perf_counter() - epoch_start
            cpu_seconds = time.process_time() - cpu_start
            if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):
                bar.close()  # nothing of this epoch is kept: no checkpoint, no best state
                raise TrainingError(
                    f"{run.path}: the model's weights are not finite after epoch {epoch}; "
                    f"training stopped, the last checkpoint is kept"
                )
            line: dict[str, Any] = {
                "epoch": epoch,
                "step": loop.step,
                "loss": loss_sum / max(1, n_batches),
                "lr": lr,
                "sequences": n_seq,
                "seq_per_s": n_seq / max(seconds, 1e-9),
                "epoch_s": seconds,
                # CPU seconds of this process per wall second per thread: ~1 when the run had the
                # cores to itself, well below when another job shared them (its timing is then low)
                "cpu_util": cpu_seconds / max(seconds * torch.get_num_threads(), 1e-9),
            }
            last = epoch == t.max_epochs - 1 or loop.step >= total_steps
            if validating and ((epoch + 1) % t.eval_every == 0 or last or out_of_time):
                # of a finite state (checked above): never a diverged one; each rank ranks its
                # share of the users, and rank 0's value is every rank's (they keep the same
                # best epoch and patience)
                value = broadcast_float(_validate(training, ds, device, r), r, device)
                line[f"valid_{val_protocol}_{t.val_metric}"] = value
                loop.record(value, epoch, model, t)
            elif t.decay == "plateau" and epoch in t.plateau_at:  # a refit replays the plateaus
                loop.reductions.append(epoch)
            loop.elapsed = time.perf_counter() - started
            line["elapsed_s"] = loop.elapsed
            loop.history.append(line)
            bar.report(
                epoch=epoch,
                loss=f"{line['loss']:.3f}",
                val=f"{loop.best['metric']:.4f}" if loop.best["epoch"] >= 0 else "-",
                seq_s=f"{line['seq_per_s']:.0f}",
            )
            reason = _stop_reason(t, loop, total_steps, out_of_time)
            if r.main:
                if events is not None:
                    events.add(line)
                if (epoch + 1) % t.checkpoint_every == 0 or reason or last:
                    run.write_log(loop.history)
                    state = loop.checkpoint(training, epoch, commit, training.precision)
                    run.save_checkpoint(state)
            if reason:
                stopped = reason
                break
    finally:
        batches.close()
        if events is not None:
            events.close()
    splits = _test_splits(cfg)
    chosen = loop.best["epoch"] if validating else len(loop.history) - 1
    bar.note(
        f"stopped ({stopped}) after {len(loop.history)} epochs; "
        + (
            f"evaluating epoch {chosen} on {' and '.join(splits)} "
            f"({', '.join(cfg.eval.protocols or PROTOCOLS)}, {ds.n_users:,} users)"
            if splits
            else f"keeping epoch {chosen} (trained on every item: nothing held out to test)"
        )
    )
    bar.close()
    return stopped


def _epochs(sampler: Sampler, first: int, end: int) -> Iterator[tuple[int, Batch | None]]:
    """(epoch, batch) for the batches of epochs first..end-1 in order, each epoch closed by
    (epoch, None)."""
    for epoch in range(first, end):
        for batch in sampler.epoch(epoch):
            yield epoch, batch
        yield epoch, None


def _updates(
    training: Training,
    run: RunDir,
    loop: _LoopState,
    epoch: int,
    batches: Iterator[tuple[int, Batch | None]],
    bar: Progress,
    set_lr: Callable[[int, float], float],
    started: float,
    budget: float,
    total_steps: int,
) -> tuple[float, int, int, float, bool]:
    """One epoch's updates, until its batches, the steps or the budget end: (summed loss,
    batches, sequences, the last learning rate, whether the budget ran out). A non-finite loss
    stops the run. The losses are read every `LOSS_READ_EVERY` steps, not at each: reading one
    waits for the device, and on a GPU the host builds the next batches meanwhile."""
    n_batches, n_seq, lr, timed = 0, 0, 0.0, math.isfinite(budget)
    losses: list[float] = []
    pending: list[torch.Tensor] = []

    def clock() -> float:  # rank 0's, in a distributed run: every rank decides alike
        return broadcast_float(time.perf_counter() - started, training.ranks, training.device)

    def read() -> None:  # the pending losses, the first non-finite one stopping the run
        values = torch.stack(pending).double().cpu().tolist() if pending else []
        pending.clear()
        for value in values:
            losses.append(value)
            if not math.isfinite(value):
                bar.close()
                raise TrainingError(
                    f"{run.path}: the training loss is {value} at epoch {epoch}, step "
                    f"{loop.step - n_batches + len(losses)}; training stopped, the last "
                    "checkpoint is kept (try a lower train.lr)"
                )

    out_of_time = False
    for batch_epoch, batch in batches:
        if batch_epoch < epoch:  # the rest of an epoch left before its end (never trained on)
            continue
        if batch is None:  # the epoch's end
            break
        lr = set_lr(loop.step, clock())
        pending.append(training.step(batch))
        loop.step += 1
        n_batches, n_seq = n_batches + 1, n_seq + batch.size
        if len(pending) >= LOSS_READ_EVERY:
            read()
        now = clock()
        bar.update(max(0, int(min(now, budget)) - bar.n) if timed else 1)
        if now > budget:
            out_of_time = True
            break
        if loop.step >= total_steps:  # train.max_steps reached (mid-epoch)
            break
    read()
    return math.fsum(losses), n_batches, n_seq, lr, out_of_time


# training losses read (waited for) once per this many steps, and at the end of an epoch
LOSS_READ_EVERY = 50
T = TypeVar("T")


def prefetched(batches: Iterator[T], ahead: int) -> Generator[T, None, None]:
    """`batches` in their order, built up to `ahead` in advance by a background thread (it
    shares the GIL with the loop: on a GPU it paid at some batch sizes, not at others,
    docs/results/performance.md); `ahead` 0: built in this thread, each when it is asked for.
    An error in building one is raised here; closing this iterator (a loop that stops early)
    stops the thread."""
    if ahead <= 0:
        yield from batches
        return
    ready: queue.Queue[Any] = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def build() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
        except BaseException as err:  # handed to the consumer, raised there
            put(err)
            return
        put(end)

    worker = threading.Thread(target=build, name="seqrec-batches", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def _stop_reason(t: TrainConfig, loop: _LoopState, total_steps: int, out_of_time: bool) -> str:
    """Why the loop stops after this epoch ("" to go on)."""
    if out_of_time:
        return "time_budget"
    if loop.step >= total_steps:
        return "max_steps" if t.max_steps else "max_epochs"
    if t.patience and loop.bad >= t.patience:
        return "early_stopping"
    return ""


def _bar(
    cfg: RunConfig, budget: float, total_steps: int, loop: _LoopState, progress: bool
) -> Progress:
    """A time budget ends the run: the bar counts its seconds (a step count would promise an
    end the clock never lets the run reach); otherwise it counts batches to the last step."""
    timed = math.isfinite(budget)
    return Progress(
        int(budget) if timed else total_steps,
        f"train {cfg.model}",
        initial=int(min(loop.elapsed, budget)) if timed else loop.step,
        unit="s" if timed else "batch",
        enabled=progress,
        bar_format=(
            "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s of the time budget "
            "[{elapsed}<{remaining}{postfix}]"
            if timed
            else None
        ),
    )


def _validate(
    training: Training, ds: PreparedDataset, device: torch.device, r: Ranks | None = None
) -> float:
    """The validation metric of the model as it stands (back in training mode after). In a
    distributed run each rank ranks every world-th user, from its rank on, and the ranks are
    gathered: the metric is the one of all users, on every rank."""
    cfg, model, r = training.cfg, training.model, r or Ranks()
    t = cfg.train
    protocol = parse_protocols(t.val_protocol)[0]
    e = cfg.eval
    eval_set, negatives = ds.eval_data("valid", e.sample_users, e.negative_seed)
    rows = np.arange(r.rank, len(eval_set.targets), r.world)
    model.eval()
    report = evaluate(
        training.scorer(device),
        eval_set.take(rows) if r.distributed else eval_set,
        protocols=(protocol,),
        negatives={p: n[rows] for p, n in negatives.items()} if r.distributed else negatives,
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
        device=device,
    )
    model.train()
    ranks = report.ranks[protocol]
    if r.distributed:
        ranks = np.empty(len(eval_set.targets), dtype=np.int64)
        for rank, part in enumerate(all_gather(report.ranks[protocol], r)):
            ranks[rank :: r.world] = part
    return float(summarize(ranks, cfg.eval.ks)[t.val_metric])


def _test_splits(cfg: RunConfig) -> tuple[Split, ...]:
    """What the chosen state is evaluated on: validation and test (nothing was validated when
    it trained on train+valid: test only; nothing is held out when it trained on all)."""
    splits: dict[str, tuple[Split, ...]] = {"train": ("valid", "test"), "train+valid": ("test",)}
    return splits.get(cfg.train.train_on, ())


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
        report = ds.evaluate(
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


def _resolved(value: bool | str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f'train.{name} = "{value}" must be resolved first (resolve_precision)')
    return value


def _with_precision(cfg: RunConfig, bf16: bool, loss_bf16: bool) -> RunConfig:
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, bf16=bf16, loss_bf16=loss_bf16)
    )


@dataclass
class Training:
    """What a training loop needs (`setup`): the model, its batches, the config with its "auto"
    precisions decided, the loss and the optimiser. `step` is one update."""

    cfg: RunConfig
    model: SequenceModel
    sampler: Sampler
    spec: LossSpec
    optimizer: torch.optim.Optimizer
    device: torch.device
    precision: dict[str, Any]  # the decided bf16 / loss_bf16 and what was timed
    precision_s: float  # seconds spent deciding them
    # a distributed run (seqrec.training.distributed): this process's ranks, and the model wrapped in
    # DistributedDataParallel (`distribute`)
    ranks: Ranks = field(default_factory=Ranks)
    forward: nn.Module | None = None

    def step(self, batch: Batch) -> torch.Tensor:
        """One update on `batch` (this rank's share of it, in a distributed run); returns the
        batch's loss, a 0-dim tensor on the device (`train_step`: reading it waits for the
        GPU)."""
        part, weight = shard(batch, self.ranks, self.cfg.train.negatives_per)
        loss = train_step(
            self.model,
            self.spec,
            part,
            self.optimizer,
            self.cfg.train,
            self.device,
            forward=self.forward,
            weight=weight,
        )
        return all_mean(loss, self.ranks, self.device)  # the whole batch's mean loss

    def distribute(self, r: Ranks) -> None:
        """Train as one of the ranks `r`: DistributedDataParallel averages the gradients."""
        if not r.distributed:
            return
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ranks, self.forward = r, DistributedDataParallel(self.model, device_ids=ids)

    def scorer(self, device: torch.device | None = None) -> ModelScorer:
        """The model as evaluation scores with it (under its decided bf16)."""
        bf16 = _resolved(self.cfg.train.bf16, "bf16")
        return ModelScorer(self.model, bf16, device or self.device)


def setup(
    ds: PreparedDataset,
    cfg: RunConfig,
    device: torch.device | None = None,
    *,
    fresh: bool = True,
    precision: dict[str, Any] | None = None,
) -> Training:
    """Build `cfg.model` for `ds` (seeded by train.seed) with its training batches, loss and
    optimiser, and decide its "auto" precisions on its first batch (`precision`: a decision made
    before, kept). `fresh`: a new run's initial weights (train.init_from, or the model's output
    bias hook); a resumed run loads its own weights afterwards. `fit` is this plus the loop; the
    benchmarks time `Training.step` on it."""
    device = device or resolve_device(cfg.train.device)
    t = cfg.train
    torch.manual_seed(t.seed)  # initial weights
    model = ckpt.build_model(cfg, ds.n_items, ds.n_users).to(device)
    if fresh and t.init_from:
        _warm_start(model, Path(t.init_from), cfg, ds)
    elif fresh:  # e.g. bert4rec.out_bias_init (a no-op for most models)
        counts = np.bincount(ds.split.training(t.train_on).items, minlength=ds.n_items + 1)[1:]
        model.init_output_bias(torch.from_numpy(counts).to(device))
    model.train()
    sampler = entry(cfg.model).batches(cfg, ds)
    if len(sampler) == 0:
        raise DataError(
            f"{ds.name}: no user has two items to learn from in the training part "
            f"(train_on = {t.train_on}): nothing to train on"
        )
    # "auto" precisions: decided once per run (a resumed run keeps its first decision)
    started = time.perf_counter()
    if precision is None:
        first = next(iter(sampler.epoch(0)))
        cfg, measured = resolve_precision(cfg, model, first, ds.n_items, device)
        precision = {"bf16": cfg.train.bf16, "loss_bf16": cfg.train.loss_bf16, **measured}
    cfg = _with_precision(cfg, precision["bf16"], precision["loss_bf16"])
    return Training(
        cfg=cfg,
        model=model,
        sampler=sampler,
        spec=loss_spec(cfg, ds.n_items),
        optimizer=make_optimizer(model, cfg),
        device=device,
        precision=precision,
        precision_s=time.perf_counter() - started,
    )


def epochs_bought(ds: PreparedDataset, cfg: RunConfig, *, steps: int = 10) -> float:
    """How many epochs of `cfg` its `train.time_budget` buys on this machine, for its epochs
    short-budget tiers: `steps` updates of a throwaway model of `cfg` on its first batches
    timed (after 2 untimed ones), an epoch costing its number of batches times their mean, plus
    its share (1 / train.eval_every) of a validation pass, timed too where the run validates.
    The budget's clock has not started: a run pays these seconds on top, as for its "auto"
    precisions."""
    t = cfg.train
    if not t.time_budget:
        raise ConfigError("epochs_bought: the config has no train.time_budget")
    device = resolve_device(t.device)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    training = setup(ds, cfg, device)
    times = []
    for i, batch in zip(range(steps + 2), training.sampler.epoch(0), strict=False):
        start = time.perf_counter()
        float(training.step(batch))  # the step's time: until the device has done it
        if i >= 2:
            times.append(time.perf_counter() - start)
    epoch_s = len(training.sampler) * statistics.fmean(times or [math.inf])
    if t.train_on == "train" and t.eval_every > 0:
        training.model.eval()
        start = time.perf_counter()
        ds.evaluate(
            ModelScorer(training.model, _resolved(training.cfg.train.bf16, "bf16"), device),
            "valid",
            protocols=parse_protocols(t.val_protocol)[:1],
            ks=cfg.eval.ks,
            batch_size=cfg.eval.batch_size,
            device=device,
        )
        epoch_s += (time.perf_counter() - start) / t.eval_every
    return parse_duration(t.time_budget) / epoch_s


def _decided(cfg: RunConfig) -> str:
    """One line: what the timing decided for a run's epochs tiers."""
    timed = [tier for tier in cfg.short_budget if tier.epochs and tier.bought is not None]
    due = [x for tier in timed if tier.applied for x in tier.said()]
    return (
        f"{cfg.train.time_budget} buys ~{timed[0].bought:g} epochs of this config on this machine "
        f"(timed): {'it trains with ' + ', '.join(due) if due else 'no epochs tier applies'}"
    )


def _warm_start(model: SequenceModel, source: Path, cfg: RunConfig, ds: PreparedDataset) -> None:
    """Load the best weights of the run in `source` into `model` (train.init_from)."""
    model.load_state_dict(_init_state(model, source, cfg, ds))


def _init_state(
    model: torch.nn.Module, source: Path, cfg: RunConfig, ds: PreparedDataset
) -> dict[str, torch.Tensor]:
    """The best weights of the run in `source` (train.init_from), checked to be a run of the
    same model on `ds`'s items, shape for shape with `model` (which may be on the meta device:
    `fit` checks before it writes anything)."""
    where = f"train.init_from {source}"
    run = ckpt.load_run(source)  # verified: manifest, ranges, its own weights' shapes
    if run.config.model != cfg.model:
        raise ConfigError(f"{where}: a {run.config.model} run; expected a {cfg.model} run")
    if list(run.item_ids) != list(ds.item_ids):
        raise ConfigError(f"{where}: the run was trained on another dataset's items")
    # the architecture section's size keys, where the model has them, said as configured
    mine, theirs = cfg.sections[0][1], run.config.sections[0][1]
    diff = [
        f"{k} {getattr(theirs, k)} vs {getattr(mine, k)}"
        for k in ("max_len", "d_model", "n_layers", "n_heads")
        if hasattr(mine, k) and getattr(theirs, k) != getattr(mine, k)
    ]
    state = run.model.state_dict()
    mismatch = ckpt.shape_mismatch(state, model)
    if diff or mismatch:  # or e.g. a shared vs a separate output embedding
        raise ConfigError(f"{where}: another model shape ({', '.join(diff) or mismatch})")
    return state
