"""Data-parallel training over several processes: PyTorch's DistributedDataParallel, launched
by `torchrun` (gloo on CPUs, NCCL on CUDA).

    torchrun --nproc-per-node 2 -m seqrec train sasrec --data ml-1m --out runs/ddp ...

Without torchrun (no WORLD_SIZE in the environment, or 1) a run is one process, as ever. With
N ranks, every rank builds each batch of the epoch's one seeded order, the same on every rank,
and trains on its share of the rows (`shard`); each share's mean loss is weighted by its share
of the batch's targets, so the gradients DDP averages are those of one process training on the
whole batch: `train.batch_size` is the global batch. Rank 0 alone writes the run directory and
reports progress; validation is shared, each rank ranking its share of the users (`all_gather`
puts the ranks back together); rank 0 decides when the run stops (the time budget, patience) and
tells the others (`broadcast`), so every rank takes the same steps with the same learning rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from seqrec.data.batches import Batch
from seqrec.errors import ConfigError, RunError, SeqrecError

T = TypeVar("T")

__all__ = [
    "Ranks",
    "all_gather",
    "all_mean",
    "barrier",
    "broadcast",
    "broadcast_float",
    "device_for",
    "on_main",
    "process_group",
    "ranks",
    "shard",
]


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of a run (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The rank that writes, validates and decides."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def ranks() -> Ranks:
    """This process's ranks as torchrun set them (RANK, WORLD_SIZE, LOCAL_RANK)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    return Ranks(
        rank=int(os.environ.get("RANK", "0")),
        world=world,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


@contextlib.contextmanager
def process_group(r: Ranks, device: torch.device) -> Iterator[None]:
    """The process group of a distributed run (NCCL on CUDA, gloo on CPUs) for its duration;
    nothing without torchrun, or when the caller already made one."""
    if not r.distributed or dist.is_initialized():
        yield
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
        # every rank leaves together (the others wait for rank 0's test pass and writes): no
        # rank tears its end of the group down, or exits, under one still using it
        dist.barrier()
    finally:
        dist.destroy_process_group()


def device_for(r: Ranks, device: torch.device) -> torch.device:
    """A CUDA rank's own GPU (LOCAL_RANK); the device as given otherwise."""
    if r.distributed and device.type == "cuda":
        torch.cuda.set_device(r.local_rank)
        return torch.device("cuda", r.local_rank)
    return device


def broadcast(value: Any, r: Ranks) -> Any:
    """Rank 0's `value` on every rank (any picklable object)."""
    if not r.distributed:
        return value
    box = [value if r.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_float(value: float, r: Ranks, device: torch.device) -> float:
    """Rank 0's number on every rank (a clock reading: every rank then decides alike)."""
    if not r.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def all_mean(value: torch.Tensor, r: Ranks, device: torch.device) -> torch.Tensor:
    """The mean of a 0-dim tensor over the ranks (queued: nothing waits for it here)."""
    if not r.distributed:
        return value
    t = value.detach().to(device, torch.float64).reshape(1)
    dist.all_reduce(t)
    return t[0] / r.world


def all_gather(value: T, r: Ranks) -> list[T]:
    """Every rank's `value` (any picklable object), in rank order, on every rank."""
    if not r.distributed:
        return [value]
    out: list[Any] = [None] * r.world
    dist.all_gather_object(out, value)
    return out


def on_main(r: Ranks, fn: Callable[[], T]) -> T | None:
    """`fn()` on rank 0 only (its value there, None on the other ranks); the one-line error it
    raises is raised on every rank (so every rank stops with the same line, not waiting for
    one that failed)."""
    error, value = None, None
    if r.main:
        try:
            value = fn()
        except SeqrecError as e:
            if not r.distributed:
                raise
            error = (type(e).__name__, str(e))
    error = broadcast(error, r)
    if error is not None:
        raise {"RunError": RunError}.get(error[0], ConfigError)(error[1])
    return value


def barrier(r: Ranks) -> None:
    if r.distributed:
        dist.barrier()


def shard(batch: Batch, r: Ranks, negatives_per: str) -> tuple[Batch, float]:
    """This rank's share of `batch` (a contiguous block of its rows; a rank left without rows
    gets row 0 weighted 0) and its weight: its share of the batch's loss targets, times the
    number of ranks, by which its mean loss is multiplied so that DDP's average of the ranks'
    gradients is the gradient of the whole batch's mean loss."""
    if not r.distributed:
        return batch, 1.0
    rows = torch.tensor_split(torch.arange(batch.inputs.shape[0]), r.world)[r.rank]
    empty = len(rows) == 0
    lo, hi = (0, 1) if empty else (int(rows[0]), int(rows[-1]) + 1)
    counts = batch.positions.sum(dim=1)
    start, end = int(counts[:lo].sum()), int(counts[:hi].sum())
    total = int(counts.sum())
    negatives = batch.negatives
    if negatives is not None and negatives.dim() == 2:
        negatives = negatives[lo:hi] if negatives_per == "sequence" else negatives[start:end]

    def rows_of(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[lo:hi]

    part = dataclasses.replace(
        batch,
        inputs=batch.inputs[lo:hi],
        positions=batch.positions[lo:hi],
        targets=batch.targets[start:end],
        negatives=negatives,
        segments=rows_of(batch.segments),
        position_ids=rows_of(batch.position_ids),
        users=rows_of(batch.users),
        times=rows_of(batch.times),
        n_sequences=0,
    )
    weight = 0.0 if empty or total == 0 else (end - start) / total * r.world
    return part, weight
