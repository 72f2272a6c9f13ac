"""Training batches: which positions the loss is computed at, what the model must predict there,
and the negatives of the sampled losses. BERT4Rec's Cloze task (§3.6) and SASRec's shifted
next-item task (§III-E). All randomness comes from a generator seeded by (seed, epoch), so an
epoch's batches are the same whether or not the run was interrupted before it.

BERT4Rec (`ClozeSampler`):

A training sample is a window of one user's training sequence (at most N items):

- histories of at most N items give one window; longer ones give sliding windows that end at the
  last item and step back by `sliding_step` * N, plus one that starts at the first item (the
  original code's `prop_sliding_window`), or only the last N items when `sliding_step` is 0;
- every epoch each window is used once as a Cloze sample: round(ρ * length) of its items (at least
  1, at most `max_predictions`) chosen uniformly are replaced by [MASK] — fresh masks every epoch,
  the equivalent of the original's `dupe_factor` copies;
- plus `last_item_ratio` * (number of windows) samples that mask only the last item (§3.6 "Test":
  training then matches the next-item task). The original code adds one such sample per window
  for every `dupe_factor` = 10 Cloze copies, hence the default 0.1.

SASRec (`NextItemSampler`): each epoch every user's training sequence once, the input
s_1..s_{T-1} (its last N items) and the target at every position the next item s_2..s_T.

Negatives (`draw_negatives`, for the sampled losses): k per target position, uniform over the
items that are not in the sequence (SASRec's `random_neq`), so never the target or a history item.

Batches group samples of similar length (within a pool of `bucket_batches` batches) and are cut
to their longest row, which removes most padding; batch order is shuffled.

Packing (`NextItemConfig.pack`): the sequences of one batch share rows, each in its own segment
with its own positions, and attention never crosses a segment (`pack_rows`). The batch holds the
same sequences and the model computes the same outputs for them as unpacked; only the padding,
about half of a random ML-1M batch at N = 200, is gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from seqrec.data.negatives import NegativeSampler, check_pack
from seqrec.data.preprocess import Sequences, left_pad
from seqrec.data.rows import length_grouped, pack_rows, packed_slots, sliding_windows

__all__ = [
    "Batch",
    "ClozeConfig",
    "ClozeSampler",
    "NextItemConfig",
    "NextItemSampler",
    "pack_rows",
    "sliding_windows",
]


@dataclass(frozen=True)
class ClozeConfig:
    """The Cloze task's settings (§3.6, §4.3; the original ML-1M script where the paper is
    silent)."""

    mask_prob: float = 0.2  # ρ (§4.3: 0.2 ML-1M/ML-20M, 0.4 Steam, 0.6 Beauty)
    max_predictions: int = 40  # masked items per sample at most (original ML-1M script: 40)
    last_item_ratio: float = 0.1  # mask-last samples per Cloze sample (original: 1 per 10 copies)
    sliding_step: float = 0.5  # window step as a share of N; 0 = only the last N items
    # BERT's 80/10/10 replacement (80 % [MASK], 10 % a random item, 10 % unchanged). The
    # original ML-1M script always uses [MASK] (mask_prob=1.0), so this is off by default.
    random_replace: bool = False
    bucket_batches: int = 32  # length-grouping pool, in batches; 1 = no grouping
    # Pack a batch's samples into shared rows (`pack_rows`), each a segment that attends only to
    # itself, with its own positions: the same samples, masks and outputs as the unpacked batch
    # with less padding, so random batches (bucket_batches = 1) train near the speed of grouped
    # ones.
    pack: bool = False


@dataclass(frozen=True)
class NextItemConfig:
    """SASRec's training samples (§III-E)."""

    # Window step as a share of N for histories longer than N; 0 = only the last N items
    # (the paper and the original code).
    sliding_step: float = 0.0
    # Length-grouping pool, in batches; 1 = random batches (the original code). Grouping cuts
    # padding (faster) but changes the objective: the loss is a mean over a batch's positions,
    # so positions of short histories weigh more in their short batches. On ML-1M SASRec+CE
    # reached test full NDCG@10 0.1751 with random batches against 0.1591 grouped, with
    # SASRec+'s init and Adam β2 and 40 instead of 25 minutes changed at the same time
    # (docs/design/sasrec.md).
    bucket_batches: int = 1
    # How a batch's loss is normalised. "batch": the mean over its target positions (the
    # original code). "epoch": the sum over them divided by the epoch's mean number of target
    # positions per batch, so every position weighs the same whatever batch it falls in;
    # with random batches the two agree in expectation, with length grouping only "epoch"
    # keeps the objective of random batches.
    loss_norm: Literal["batch", "epoch"] = "batch"
    # Pack a batch's sequences into shared rows (`pack_rows`), each a segment that attends only
    # to itself with its own positions: the same sequences, the same outputs (up to float
    # rounding) and the same loss as the unpacked batch, at ~60 % of its width x rows.
    pack: bool = False


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, L) int64, left-padded (Cloze: masked positions hold [MASK])
    positions: torch.Tensor  # (B, L) bool: where the loss is computed
    targets: torch.Tensor  # (M,) int64 item ids to predict at those positions, row-major order
    # (M, k) int64 sampled negatives per target position, (B, k) per sequence, or (k,) per batch
    negatives: torch.Tensor | None = None
    # the training step multiplies the batch's mean loss by this (NextItemConfig.loss_norm)
    loss_scale: float = 1.0
    # packed batches (NextItemConfig.pack): (B, L) int64 segment of each slot (0 = padding) and
    # (B, L) int64 position of each item, 0..N-1 counted as in a left-padded row of width N
    segments: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    n_sequences: int = 0  # sequences in a packed batch (its rows otherwise)
    # (B,) int64 internal user index of each row (next-item rows, unpacked), for the models with
    # a per-user term (SequenceModel.uses_users)
    users: torch.Tensor | None = None
    # (B, L + 1) int64 seconds, for a model that reads them (SequenceModel.uses_times): each
    # input's time (0 for padding), then the time of the last position's target
    times: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Training sequences in the batch (a packed row may hold several)."""
        return self.n_sequences or int(self.inputs.shape[0])

    def model_inputs(self, users: bool = False) -> dict[str, torch.Tensor]:
        """The keyword arguments the model takes besides `inputs`: a packed layout, if any, and
        the rows' users when `users` (a model that `uses_users`; a ValueError if the batch has
        none)."""
        out = {}
        if self.segments is not None and self.position_ids is not None:
            out = {"segments": self.segments, "position_ids": self.position_ids}
        if users:
            if self.users is None:
                raise ValueError("the model reads each row's user; this batch has none")
            out["users"] = self.users
        if self.times is not None:
            out["times"] = self.times
        return out

    def index(self) -> torch.Tensor:
        """(M,) int64: the flat indices of `positions` into the B * L positions, row-major (the
        order of `targets`), found where the batch is (on the CPU, before it is moved)."""
        # numpy's: torch's CPU nonzero took 2.5 ms of a 16 ms GPU step's host time (H200 host)
        return torch.from_numpy(np.flatnonzero(self.positions.numpy()))

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`. To a GPU the copies are queued without waiting (the host
        arrays are staged at once, so they may be reused), and the device runs them in order
        before the kernels queued after them."""
        non_blocking = torch.device(device).type == "cuda"

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else put(t)

        return Batch(
            put(self.inputs),
            put(self.positions),
            put(self.targets),
            move(self.negatives),
            self.loss_scale,
            move(self.segments),
            move(self.position_ids),
            self.n_sequences,
            move(self.users),
            move(self.times),
        )


class ClozeSampler:
    """Cloze batches over a set of training sequences, one fresh masking per epoch."""

    def __init__(
        self,
        train: Sequences,
        *,
        max_len: int,
        cfg: ClozeConfig | None = None,
        batch_size: int = 256,
        seed: int = 0,
        n_negatives: int = 0,
        negatives_per: str = "position",
        negatives: NegativeSampler | None = None,
    ) -> None:
        """`negatives`: what the sampled losses draw (else `n_negatives` uniform ones per
        `negatives_per`)."""
        self.cfg = cfg = cfg or ClozeConfig()
        self.negatives = negatives or NegativeSampler(n_negatives, negatives_per)
        if self.negatives.per not in ("position", "batch"):
            raise ValueError(
                f"Cloze negatives_per must be position or batch, got {self.negatives.per!r}"
            )
        if not 0 < cfg.mask_prob <= 1:
            raise ValueError(f"cloze.mask_prob must be in (0, 1], got {cfg.mask_prob}")
        if cfg.max_predictions < 1:
            raise ValueError(f"cloze.max_predictions must be >= 1, got {cfg.max_predictions}")
        if cfg.last_item_ratio < 0:
            raise ValueError(f"cloze.last_item_ratio must be >= 0, got {cfg.last_item_ratio}")
        self.train = train
        self.max_len = max_len
        self.batch_size = batch_size
        self.seed = seed
        # per masked position, absent from the window; or per batch ("batch"), shared
        self.mask_id = train.n_items + 1
        lengths = train.lengths
        keep = np.flatnonzero(lengths > 0)
        row, start, end = sliding_windows(lengths[keep], max_len, cfg.sliding_step)
        base = train.offsets[keep[row]]
        self.win_start, self.win_end = base + start, base + end  # into train.items
        self.n_last = int(round(cfg.last_item_ratio * len(self.win_start)))

    @property
    def n_windows(self) -> int:
        return len(self.win_start)

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-(self.n_windows + self.n_last) // self.batch_size)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, epoch])
        n_win = self.n_windows
        # the samples of this epoch: every window as Cloze, n_last windows as mask-last
        last_pick = rng.choice(n_win, size=self.n_last, replace=self.n_last > n_win)
        window = np.concatenate([np.arange(n_win), last_pick])
        mask_last = np.concatenate([np.zeros(n_win, bool), np.ones(self.n_last, bool)])
        lengths = (self.win_end - self.win_start)[window]
        for rows in length_grouped(lengths, self.batch_size, self.cfg.bucket_batches, rng):
            yield self._make_batch(window[rows], mask_last[rows], rng)

    def _make_batch(
        self, window: np.ndarray, mask_last: np.ndarray, rng: np.random.Generator
    ) -> Batch:
        starts, ends = self.win_start[window], self.win_end[window]
        lengths = ends - starts
        width = int(lengths.max())
        items = left_pad(self.train.items, starts, ends, width)  # (B, L)
        real = np.arange(width)[None, :] >= width - lengths[:, None]
        # Cloze: round(ρ * length) positions (>= 1, <= max_predictions) chosen uniformly among
        # the real ones: the n smallest of i.i.d. uniform keys. Rounding half up, as Python 2's
        # round() in the original code.
        cfg = self.cfg
        n_mask = np.clip(np.floor(lengths * cfg.mask_prob + 0.5), 1, cfg.max_predictions)
        n_mask = np.minimum(n_mask, lengths).astype(np.int64)
        keys = np.where(real, rng.random(items.shape), 2.0)
        kth = np.take_along_axis(np.sort(keys, axis=1), n_mask[:, None] - 1, axis=1)
        masked = real & (keys <= kth)
        masked[mask_last] = False
        masked[mask_last, -1] = True  # the last item (left-padded: always the last column)
        inputs = np.where(masked, self.mask_id, items)
        if cfg.random_replace:
            # of the chosen positions: 10 % get a random item, 10 % keep theirs (BERT §3.1)
            u = rng.random(items.shape)
            cloze = masked & ~mask_last[:, None]
            rand_items = rng.integers(1, self.train.n_items + 1, size=items.shape)
            inputs = np.where(cloze & (u >= 0.8) & (u < 0.9), rand_items, inputs)
            inputs = np.where(cloze & (u >= 0.9), items, inputs)
        samples = items  # (B, L) each sample's items, for the negatives
        segments = position_ids = None
        if cfg.pack:
            items, inputs, masked, segments, position_ids = _pack_left_padded(
                lengths, self.max_len, items, inputs, masked
            )
        negatives, neg = None, self.negatives
        if neg.n and neg.shared:
            negatives = neg.draw_shared(rng, self.train.n_items)
        elif neg.n:
            rows = np.nonzero(masked)[0] if segments is None else segments[masked] - 1
            negatives = neg.draw_rows(rng, samples, rows, self.train.n_items)
        return Batch(
            inputs=torch.from_numpy(inputs),
            positions=torch.from_numpy(masked),
            targets=torch.from_numpy(items[masked]),
            negatives=None if negatives is None else torch.from_numpy(negatives),
            segments=None if segments is None else torch.from_numpy(segments),
            position_ids=None if position_ids is None else torch.from_numpy(position_ids),
            n_sequences=len(window),
        )


def _pack_left_padded(
    lengths: np.ndarray, max_len: int, *arrays: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Left-padded (B, W) arrays of samples of `lengths` -> the same arrays packed by
    `pack_rows` into (R, W') rows, followed by the (R, W') segments (sample b is segment b + 1,
    padding 0) and position ids (counted from each sample's end, as in a left-padded row of
    width `max_len`)."""
    W = arrays[0].shape[1]
    seq, t, dst, n_rows, width = packed_slots(lengths)
    src = seq * W + (W - lengths[seq]) + t  # flat index in the left-padded arrays
    out = []
    for a in arrays:
        packed = np.zeros(n_rows * width, dtype=a.dtype)
        packed[dst] = a.reshape(-1)[src]
        out.append(packed.reshape(n_rows, width))
    segments = np.zeros(n_rows * width, dtype=np.int64)
    segments[dst] = seq + 1
    position_ids = np.zeros(n_rows * width, dtype=np.int64)
    position_ids[dst] = max_len - lengths[seq] + t
    return (*out, segments.reshape(n_rows, width), position_ids.reshape(n_rows, width))


class NextItemSampler:
    """SASRec's shifted next-item batches (§III-E), one pass over the users per epoch."""

    def __init__(
        self,
        train: Sequences,
        *,
        max_len: int,
        cfg: NextItemConfig | None = None,
        batch_size: int = 128,
        seed: int = 0,
        n_negatives: int = 1,
        negatives_per: str = "position",
        negative_weights: np.ndarray | None = None,
        negatives: NegativeSampler | None = None,
        times: bool = False,
    ) -> None:
        """`negatives`: what the sampled losses draw (else `n_negatives` per `negatives_per`,
        in proportion to `negative_weights` (n_items + 1,) when given, e.g. the training
        counts, instead of uniformly). `times`: the batches hold their items' times (`train`
        must have them; rows unpacked)."""
        self.cfg = cfg = cfg or NextItemConfig()
        if times and (train.times is None or cfg.pack):
            raise ValueError("times: the sequences must have timestamps and rows be unpacked")
        self.times = times
        self.negatives = negatives or NegativeSampler(n_negatives, negatives_per, negative_weights)
        check_pack(cfg.pack, self.negatives.n, self.negatives.per)
        self.train = train
        self.max_len = max_len
        self.batch_size = batch_size
        self.seed = seed
        # a sample needs one (input, target) pair: windows over the T - 1 pairs of each user
        lengths = train.lengths
        keep = np.flatnonzero(lengths >= 2)
        row, start, end = sliding_windows(lengths[keep] - 1, max_len, cfg.sliding_step)
        base = train.offsets[keep[row]]
        self.win_start, self.win_end = base + start, base + end  # inputs; targets one later
        self.win_user = keep[row]  # the internal user index of each window
        self.user_start = train.offsets[keep[row]]  # the whole sequence, for the negatives
        self.user_end = train.offsets[keep[row] + 1]
        # target positions per batch, on average over an epoch (loss_norm = "epoch")
        self.mean_targets = (self.win_end - self.win_start).sum() / max(1, len(self))

    @property
    def n_windows(self) -> int:
        return len(self.win_start)

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.n_windows // self.batch_size)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, epoch])
        lengths = self.win_end - self.win_start
        for rows in length_grouped(lengths, self.batch_size, self.cfg.bucket_batches, rng):
            yield self._make_batch(rows, rng)

    def _make_batch(self, window: np.ndarray, rng: np.random.Generator) -> Batch:
        starts, ends = self.win_start[window], self.win_end[window]
        if self.cfg.pack:
            inputs, targets, segments, position_ids = self._packed(starts, ends)
            sample = segments - 1  # the sequence (index into `window`) of each slot
        else:
            width = int((ends - starts).max())
            inputs = left_pad(self.train.items, starts, ends, width)  # (B, L) s_1..s_{T-1}
            targets = left_pad(self.train.items, starts + 1, ends + 1, width)  # (B, L) s_2..s_T
            sample = np.broadcast_to(np.arange(len(window))[:, None], inputs.shape)
        times = None
        if self.times:  # the inputs' times and the last target's: s_1..s_T
            assert self.train.times is not None
            times = torch.from_numpy(
                left_pad(self.train.times, starts, ends + 1, inputs.shape[1] + 1)
            )
        positions = targets != 0
        negatives, neg = None, self.negatives
        if neg.n and neg.shared:
            negatives = neg.draw_shared(rng, self.train.n_items)
        elif neg.n:
            u_start, u_end = self.user_start[window], self.user_end[window]
            seen = left_pad(self.train.items, u_start, u_end, int((u_end - u_start).max()))
            # per sequence: (B, k), shared by its positions; per position: (M, k)
            rows = np.arange(len(window)) if neg.per == "sequence" else sample[positions]
            negatives = neg.draw_rows(rng, seen, rows, self.train.n_items)
        packed = self.cfg.pack
        return Batch(
            inputs=torch.from_numpy(inputs),
            positions=torch.from_numpy(positions),
            targets=torch.from_numpy(targets[positions]),
            negatives=None if negatives is None else torch.from_numpy(negatives),
            loss_scale=(
                float(positions.sum() / self.mean_targets) if self.cfg.loss_norm == "epoch" else 1.0
            ),
            segments=torch.from_numpy(segments) if packed else None,
            position_ids=torch.from_numpy(position_ids) if packed else None,
            n_sequences=len(window),
            users=None if packed else torch.from_numpy(self.win_user[window]),
            times=times,
        )

    def _packed(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
        """(inputs, targets, segments, position_ids), each (R, W), of the windows packed by
        `pack_rows`; segment b + 1 holds window b, its positions those of a left-padded row."""
        lengths = ends - starts
        seq, t, slot, n_rows, width = packed_slots(lengths)
        inputs, targets, segments, position_ids = (
            np.zeros(n_rows * width, dtype=np.int64) for _ in range(4)
        )
        inputs[slot] = self.train.items[starts[seq] + t]
        targets[slot] = self.train.items[starts[seq] + t + 1]
        segments[slot] = seq + 1
        position_ids[slot] = self.max_len - lengths[seq] + t
        shape = (n_rows, width)
        return tuple(a.reshape(shape) for a in (inputs, targets, segments, position_ids))
