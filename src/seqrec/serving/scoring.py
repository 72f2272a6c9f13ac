"""Scoring a batch of histories for `Recommender` (seqrec.serving.recommender): the model's
inputs, the top k over a catalogue read in blocks or through the item index, and the times a
model of time reads (HSTU's time bias, `SequenceModel.uses_times`): when each history item
happened and the time its recommendation is for (default: now), in seconds since the epoch.
Models that do not read times ignore them, so callers may always pass them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqrec.data.preprocess import left_pad, left_pad_times
from seqrec.errors import SeqrecError
from seqrec.serving.index import approximate_top, csr, masked_top

if TYPE_CHECKING:
    from seqrec.serving.recommender import Recommender

__all__ = [
    "MAX_SECONDS",
    "Clock",
    "block_top",
    "clock",
    "history_inputs",
    "index_top",
    "seconds",
]

# the histories' times (one array per history, as its items) and each one's query time
Clock = tuple[list[np.ndarray], np.ndarray]
# the largest time, in seconds either side of the epoch, a model of time is given: the gap of
# two such times stays within int64
MAX_SECONDS = 2**61


def seconds(values: Any, what: str) -> np.ndarray:
    """`values` as int64 seconds within ±MAX_SECONDS; a ValueError line naming `what`
    otherwise (a fraction, a text, a number past the range)."""
    if isinstance(values, np.ndarray) and values.dtype == np.int64:  # a dataset's own
        out, exact = values, True
    else:
        out, exact = _integers(values)
    if not exact or np.any(np.abs(out) > MAX_SECONDS):
        raise ValueError(f"{what}: expected whole seconds within ±2**61 of the epoch")
    return np.asarray(out)


def _integers(values: Any) -> tuple[Any, bool]:
    """`values` as int64 and whether that kept them as they were."""
    try:
        out = np.asarray(values, dtype=np.int64) if len(np.shape(values)) else np.int64(values)
        exact = np.array_equal(out, np.asarray(values))
    except (OverflowError, TypeError, ValueError):
        return None, False
    return out, exact


def clock(
    model: str,
    histories: Sequence[np.ndarray],
    times: Sequence[Sequence[int] | np.ndarray] | None,
    at: int | Sequence[int] | None,
) -> Clock:
    """The histories' times and query times (`at`: one for all, or one a history; default:
    now), checked against the histories: one time per item, one query time per history
    (ValueError, one line); a SeqrecError when `times` is missing (`model` names the model
    that needs them)."""
    if times is None:
        raise SeqrecError(f"{model} reads when each item happened: give each history's times")
    if len(times) != len(histories):
        raise ValueError(f"{len(times)} lists of times for {len(histories)} histories")
    rows = [seconds(t, f"history {r}'s times") for r, t in enumerate(times)]
    for r, (h, t) in enumerate(zip(histories, rows, strict=True)):
        if t.shape != (len(h),):
            raise ValueError(f"history {r}: {t.size} times for {len(h)} items")
    query = np.full(len(histories), int(time.time()), dtype=np.int64)
    if at is not None:  # one for all, or one a history
        given = seconds(at, "at")
        if given.ndim and given.shape != (len(histories),):
            raise ValueError(f"at: {given.size} query times for {len(histories)} histories")
        query[:] = given
    return rows, query


def block_top(
    rec: Recommender,
    items: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    users: np.ndarray | None,
    k: int,
    width: int,
    seen: torch.Tensor | None,
    allowed: torch.Tensor | None,
    when: Clock | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k of each history over the catalogue read `width` items at a time: each
    block's own top k merged into the running one (only (B, 2k) scores are kept)."""
    inputs, times = history_inputs(rec, items, starts, ends, when)
    user_t = None if users is None else torch.from_numpy(users).to(rec.device)
    blocks = rec.model.block_scores(inputs, user_t, times, bf16=rec.bf16)
    empty = torch.from_numpy(ends == starts).to(rec.device)
    pop = torch.from_numpy(rec.popularity).to(rec.device)
    best: tuple[torch.Tensor, torch.Tensor] | None = None
    for lo, block in blocks.blocks(width):
        if bool(empty.any()):  # an empty history gets the training popularity
            block[empty] = pop[lo : lo + block.shape[1]]
            if lo == 0:
                block[empty, 0] = -torch.inf
        top = masked_top(block, lo, k, seen, allowed)
        if best is not None:
            values = torch.cat([best[0], top[0]], 1)
            values, at = values.topk(min(k, values.shape[1]), dim=1)
            top = (values, torch.cat([best[1], top[1]], 1).gather(1, at))
        best = top
    assert best is not None
    return best


@torch.no_grad()
def index_top(
    rec: Recommender,
    items: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    users: np.ndarray | None,
    k: int,
    seen: torch.Tensor | None,
    allowed: torch.Tensor | None,
    when: Clock | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The index's top k, its candidates scored exactly (`index.approximate_top`); None
    (the batch scored exactly) when a history is empty or a row ran out of candidates."""
    assert rec.index is not None
    if bool((ends == starts).any()):
        return None
    inputs, times = history_inputs(rec, items, starts, ends, when)
    user_t = None if users is None else torch.from_numpy(users).to(rec.device)
    with torch.autocast(rec.device.type, dtype=torch.bfloat16, enabled=rec.bf16):
        features = rec.model.user_features(inputs, user_t, times)
    weight, bias = rec.model.output_weights()
    off = 0 if allowed is None else int((~allowed).sum())
    top = approximate_top(rec.index, features.float(), weight, bias, k, seen, allowed, off)
    return None if bool((~torch.isfinite(top[0])).any()) else top


def history_inputs(
    rec: Recommender,
    items: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    when: Clock | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, L) the most recent max_len items of each history, left-padded; and with `when`
    (a model that `uses_times`) their (B, L + 1) times, then each row's query time."""
    longest = int((ends - starts).max(initial=0))
    width = max(1, min(longest, rec.max_len or longest))
    inputs = torch.from_numpy(left_pad(items, starts, ends, width)).to(rec.device)
    if when is None:
        return inputs, None
    padded = left_pad_times(csr(when[0])[0], starts, ends, width, when[1])
    return inputs, torch.from_numpy(padded).to(rec.device)
