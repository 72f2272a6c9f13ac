"""The loop every neural model trains in: AdamW steps with linear warm-up and decay (or halving on
a plateau), gradient clipping, validation every k epochs, early stopping and the best state chosen
on VALIDATION only, a wall-clock budget, and a checkpoint per validation (so `--resume` continues
an interrupted run).

Randomness: epoch e's batches come from a generator seeded by (seed, e) and its dropout from
torch's generator seeded by (seed, e); a resumed run therefore repeats exactly the epochs an
uninterrupted one would have run."""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from seqrec.config import (
    RunConfig,
    TrainConfig,
    parse_duration,
)
from seqrec.data.batches import Batch
from seqrec.data.prepared import PreparedDataset
from seqrec.data.split import Split
from seqrec.errors import TrainingError
from seqrec.evaluation.metrics import summarize
from seqrec.evaluation.protocols import PROTOCOLS, evaluate, parse_protocols
from seqrec.models.base import Sampler, SequenceModel
from seqrec.progress import Progress, val_field
from seqrec.training.distributed import (
    Ranks,
    all_gather,
    broadcast_float,
)
from seqrec.training.rundir import RunDir
from seqrec.training.setup import Training
from seqrec.training.step import lr_factor

__all__ = ["LOSS_READ_EVERY", "prefetched"]


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
            _check_finite(model, run, epoch, bar)
            line = _epoch_line(
                epoch, loop.step, loss_sum, n_batches, lr, n_seq, seconds, cpu_seconds
            )
            last = epoch == t.max_epochs - 1 or loop.step >= total_steps
            if validating and ((epoch + 1) % t.eval_every == 0 or last or out_of_time):
                # of a finite state (checked above): never a diverged one; each rank ranks its
                # share of the users, and rank 0's value is every rank's (they keep the same
                # best epoch and patience)
                value = broadcast_float(_validate(training, ds, device, r), r, device)
                line[f"valid_{val_protocol}_{t.val_metric}"] = value
                loop.record(value, epoch, model, t)
                # this epoch's value above, the best so far beside it: a user sees it fall
                line["best_valid"], line["best_epoch"] = loop.best["metric"], loop.best["epoch"]
            elif t.decay == "plateau" and epoch in t.plateau_at:  # a refit replays the plateaus
                loop.reductions.append(epoch)
            loop.elapsed = time.perf_counter() - started
            line["elapsed_s"] = loop.elapsed
            loop.history.append(line)
            bar.report(
                epoch=epoch,
                loss=f"{line['loss']:.3f}",
                val=val_field(line.get(f"valid_{val_protocol}_{t.val_metric}"), loop.best),
                seq_s=f"{line['seq_per_s']:.0f}",
            )
            reason = _stop_reason(t, loop, total_steps, out_of_time)
            if r.main:
                due = (epoch + 1) % t.checkpoint_every == 0 or bool(reason) or last
                _keep(training, run, loop, events, line, epoch, commit, checkpoint=due)
            if reason:
                stopped = reason
                break
    finally:
        batches.close()
        if events is not None:
            events.close()
    bar.note(_stop_note(cfg, ds, loop, stopped, validating))
    bar.close()
    return stopped


def _keep(
    training: Training,
    run: RunDir,
    loop: _LoopState,
    events: Any,
    line: dict[str, Any],
    epoch: int,
    commit: str,
    *,
    checkpoint: bool,
) -> None:
    """Rank 0's record of an epoch: its TensorBoard events, and, when a checkpoint is due, the
    log and the checkpoint."""
    if events is not None:
        events.add(line)
    if checkpoint:
        run.write_log(loop.history)
        run.save_checkpoint(loop.checkpoint(training, epoch, commit, training.precision))


def _check_finite(model: SequenceModel, run: RunDir, epoch: int, bar: Any) -> None:
    """A model whose weights are no longer finite stops the run: nothing of this epoch is kept
    (no checkpoint, no best state)."""
    if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):
        bar.close()
        raise TrainingError(
            f"{run.path}: the model's weights are not finite after epoch {epoch}; training "
            f"stopped{_kept(run)} (try a lower train.lr)"
        )


def _kept(run: RunDir) -> str:
    """What a stopped training leaves to resume from, as the end of its line."""
    return ", the last checkpoint is kept" if run.has_checkpoint else "; nothing was kept"


def _epoch_line(
    epoch: int,
    step: int,
    loss_sum: float,
    n_batches: int,
    lr: float,
    n_seq: int,
    seconds: float,
    cpu_seconds: float,
) -> dict[str, Any]:
    """An epoch's line of the run's log (validation adds its metric)."""
    return {
        "epoch": epoch,
        "step": step,
        "loss": loss_sum / max(1, n_batches),
        "lr": lr,
        "sequences": n_seq,
        "seq_per_s": n_seq / max(seconds, 1e-9),
        "epoch_s": seconds,
        # CPU seconds of this process per wall second per thread: ~1 when the run had the
        # cores to itself, well below when another job shared them (its timing is then low)
        "cpu_util": cpu_seconds / max(seconds * torch.get_num_threads(), 1e-9),
    }


def _stop_note(
    cfg: RunConfig, ds: PreparedDataset, loop: _LoopState, stopped: str, validating: bool
) -> str:
    """Why the loop stopped, and which epoch's state is evaluated on what."""
    splits = _test_splits(cfg)
    chosen = loop.best["epoch"] if validating else len(loop.history) - 1
    return f"stopped ({stopped}) after {len(loop.history)} epochs; " + (
        f"evaluating epoch {chosen} on {' and '.join(splits)} "
        f"({', '.join(cfg.eval.protocols or PROTOCOLS)}, {ds.n_users:,} users)"
        if splits
        else f"keeping epoch {chosen} (trained on every item: nothing held out to test)"
    )


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
                # at the first steps the data is the likelier cause (item features with
                # extreme values), later the learning rate
                cause = (
                    "check the item features' values, then try a lower train.lr"
                    if training.cfg.items.features and loop.step < 2 * len(training.sampler)
                    else "try a lower train.lr"
                )
                raise TrainingError(
                    f"{run.path}: the training loss is {value} at epoch {epoch}, step "
                    f"{loop.step - n_batches + len(losses)}; training stopped{_kept(run)} "
                    f"({cause})"
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
