"""One optimiser step on one batch, and the learning-rate schedule's factor at a step."""

from __future__ import annotations

import math

import torch
from torch import nn

from seqrec.config import TrainConfig
from seqrec.data.batches import Batch
from seqrec.errors import ConfigError
from seqrec.models.base import SequenceModel
from seqrec.training.losses import LossSpec, model_loss

__all__ = ["lr_factor", "train_step"]


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
    distributed run); `weight`: this rank's share of the batch
    (seqrec.training.distributed.shard)."""
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


def _resolved(value: bool | str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f'train.{name} = "{value}" must be resolved first (resolve_precision)')
    return value
