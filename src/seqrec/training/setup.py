"""Setting a training up: the device, the precision (decided by timing where it is "auto"),
the process's torch settings for the run, the model with its batches, loss and optimiser, and
the state it starts from (a warm start from another run)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqrec.config import (
    RunConfig,
    TrainConfig,
)
from seqrec.data.batches import Batch
from seqrec.data.candidates import item_popularity
from seqrec.data.ids import IdCodec, check_items, same_items
from seqrec.data.item_features import ItemFeatures
from seqrec.data.negatives import NegativeSampler
from seqrec.data.prepared import PreparedDataset
from seqrec.data.prepared_items import encode_items
from seqrec.errors import ConfigError, DataError
from seqrec.models.base import BlockScores, Sampler, SequenceModel
from seqrec.models.registry import entry
from seqrec.models.tower import grown_state
from seqrec.provenance import cpu_flags
from seqrec.training import checkpoint as ckpt
from seqrec.training.distributed import (
    Ranks,
    all_mean,
    shard,
)
from seqrec.training.losses import LossSpec, full_cross_entropy, model_loss
from seqrec.training.step import _resolved, train_step

__all__ = [
    "ModelScorer",
    "Training",
    "loss_spec",
    "make_optimizer",
    "resolve_device",
    "resolve_precision",
    "setup",
    "synchronize",
    "torch_settings",
]


def loss_spec(cfg: RunConfig, n_items: int) -> LossSpec:
    """The loss `cfg.train` asks for; settings its negatives cannot combine with are one
    ConfigError line (`NegativeSampler.check`, which validation runs first)."""
    NegativeSampler.check(cfg.train, dict(cfg.sections).get("next_item"), cfg.model)
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
        self.uses_times = model.uses_times

    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.model.score(histories, users, times).float()

    @property
    def blockwise(self) -> bool:
        return self.model.blockwise

    def block_scores(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> BlockScores:
        return self.model.block_scores(histories, users, times, bf16=self.bf16)


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
    # a distributed run (seqrec.training.distributed): this process's ranks, and the model wrapped
    # in DistributedDataParallel (`distribute`)
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
    features: ItemFeatures | None = None,
) -> Training:
    """Build `cfg.model` for `ds` (seeded by train.seed) with its training batches, loss and
    optimiser, and decide its "auto" precisions on its first batch (`precision`: a decision made
    before, kept). `fresh`: a new run's initial weights (train.init_from, or the model's output
    bias hook); a resumed run loads its own weights afterwards. `features`: the items' features
    for a run with item features (encoded from `cfg.items` when not given). `fit` is this plus
    the loop; the benchmarks time `Training.step` on it."""
    device = device or resolve_device(cfg.train.device)
    t = cfg.train
    torch.manual_seed(t.seed)  # initial weights
    if features is None and cfg.items.features:
        encoded = encode_items(cfg.items, ds.item_ids)
        features = encoded[1] if encoded is not None else None
    model = ckpt.build_model(cfg, ds.n_items, ds.n_users, features).to(device)
    if fresh and t.init_from:
        _warm_start(model, Path(t.init_from), cfg, ds)
    elif fresh:  # e.g. bert4rec.out_bias_init (a no-op for most models)
        counts = item_popularity(ds.split.training(t.train_on))[1:]
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


def _warm_start(model: SequenceModel, source: Path, cfg: RunConfig, ds: PreparedDataset) -> None:
    """Load the best weights of the run in `source` into `model` (train.init_from)."""
    model.load_state_dict(_init_state(model, source, cfg, ds))


def _init_state(
    model: torch.nn.Module, source: Path, cfg: RunConfig, ds: PreparedDataset
) -> dict[str, torch.Tensor]:
    """The best weights of the run in `source` (train.init_from), checked to be a run of the
    same model on `ds`'s items, shape for shape with `model` (which may be on the meta device:
    `fit` checks before it writes anything). A run with item features may start a model of
    other items (a log whose catalogue grew): each item it knew keeps its rows, a new one
    starts from its features (seqrec.models.tower.grown_state)."""
    where = f"train.init_from {source}"
    run = ckpt.load_run(source)  # verified: manifest, ranges, its own weights' shapes
    if run.config.model != cfg.model:
        raise ConfigError(f"{where}: a {run.config.model} run; expected a {cfg.model} run")
    grows = (
        run.items is not None and cfg.items.features and not same_items(run.item_ids, ds.item_ids)
    )
    if not grows:
        check_items(run.item_ids, ds.item_ids, where)
    # the architecture section's size keys, where the model has them, said as configured
    mine, theirs = cfg.sections[0][1], run.config.sections[0][1]
    diff = [
        f"{k} {getattr(theirs, k)} vs {getattr(mine, k)}"
        for k in ("max_len", "d_model", "n_layers", "n_heads")
        if hasattr(mine, k) and getattr(theirs, k) != getattr(mine, k)
    ]
    state = run.model.state_dict()
    if grows and not diff:
        rows = IdCodec(run.item_ids).encode_rows(ds.item_ids)
        state = grown_state(model, state, rows, cfg.items.cold_neighbours)
    mismatch = ckpt.shape_mismatch(state, model)
    if diff or mismatch:  # or e.g. a shared vs a separate output embedding
        raise ConfigError(f"{where}: another model shape ({', '.join(diff) or mismatch})")
    return state
