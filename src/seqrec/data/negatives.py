"""The negatives of the sampled losses as one object: how many, what they are drawn for, from
which distribution, and which settings they combine with.

`train.n_negatives` items are drawn

- per **position** (`train.negatives_per = "position"`): k for every target position, none of
  them in the user's training sequence (SASRec §III-E, BERT4Rec's sampled variants);
- per **sequence** (`"sequence"`): k for a whole training row, shared by its positions and
  scored by one batched matmul (gSASRec's setting; not with `next_item.pack`);
- per **batch** (`"batch"`): k for the whole batch, shared by every target position, a row's
  own target left out by the loss (in-batch-style sampled softmax with the logQ correction);

uniformly over the catalogue or, with `train.negative_sampling = "popularity"`, in proportion to
the training counts. The full cross-entropy (`train.loss = "ce"`) draws none.

`NegativeSampler.check` holds every rule that ties these settings to the loss and the task, so
an invalid combination is one ConfigError line before anything is built or written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from seqrec.errors import ConfigError

if TYPE_CHECKING:
    from seqrec.config import TrainConfig
    from seqrec.data.batches import NextItemConfig

__all__ = ["NEGATIVES_PER", "SHARED_NEGATIVE_LOSSES", "NegativeSampler"]

NEGATIVES_PER = ("position", "sequence", "batch")
# the losses that take a -inf score (a row's own target among shared negatives) as "no negative"
SHARED_NEGATIVE_LOSSES = ("sampled_softmax", "bce", "gbce")


@dataclass(frozen=True, eq=False)
class NegativeSampler:
    """`n` negatives per `per` ("position", "sequence" or "batch"), uniform over items 1..V or in
    proportion to `weights` ((V + 1,), index 0 the padding; zero-weight items never drawn)."""

    n: int = 0
    per: str = "position"
    weights: np.ndarray | None = None
    cdf: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.per not in NEGATIVES_PER:
            raise ValueError(f"negatives_per must be position, sequence or batch, got {self.per!r}")
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=np.float64).copy()
            w[0] = 0.0  # the padding is never a negative
            object.__setattr__(self, "cdf", np.cumsum(w) / w.sum())

    @classmethod
    def from_config(cls, t: TrainConfig, item_counts: np.ndarray | None = None) -> NegativeSampler:
        """What the training config `t` asks for; `item_counts` (V + 1,): the training counts,
        the weights of popularity sampling (needed only for it)."""
        n = 0 if t.loss == "ce" else t.n_negatives
        popularity = n and t.negative_sampling == "popularity"
        if popularity and item_counts is None:
            raise ValueError("popularity sampling needs the training item counts")
        return cls(n, t.negatives_per, item_counts if popularity else None)

    @staticmethod
    def check(t: TrainConfig, task: NextItemConfig | None, model: str) -> None:
        """Every rule tying the negatives of the training config `t` to the loss and to model
        `model`'s task (`task`: its next-item section; None: it trains on another task, the
        Cloze); a ConfigError line."""
        if t.loss == "ce":
            return
        if t.n_negatives < 1:
            raise ConfigError(f"train.loss = {t.loss!r} needs train.n_negatives >= 1")
        if t.negatives_per == "batch" and t.loss not in SHARED_NEGATIVE_LOSSES:
            raise ConfigError(
                'train.negatives_per = "batch" works with train.loss '
                f"{', '.join(SHARED_NEGATIVE_LOSSES)}; got {t.loss!r}"
            )
        if t.negatives_per == "sequence" and task is None:
            raise ConfigError(
                f'train.negatives_per = "sequence" needs the next-item task; {model} has none'
            )
        if t.negative_sampling == "popularity":
            if task is None:
                raise ConfigError(
                    f'train.negative_sampling = "popularity" needs the next-item task; '
                    f"{model} has none"
                )
            if t.logq:
                raise ConfigError(
                    "train.logq corrects for uniform negatives; it does not combine with "
                    'train.negative_sampling = "popularity"'
                )
        check_pack(task is not None and task.pack, t.n_negatives, t.negatives_per)

    @property
    def shared(self) -> bool:
        """One set for the whole batch (per = "batch")."""
        return self.per == "batch"

    def draw_shared(self, rng: np.random.Generator, n_items: int) -> np.ndarray:
        """(n,) negatives for a whole batch (a row's own target is left out by the loss)."""

        return draw_shared_negatives(rng, self.n, n_items, self.cdf)

    def draw_rows(
        self, rng: np.random.Generator, seen: np.ndarray, rows: np.ndarray, n_items: int
    ) -> np.ndarray:
        """(len(rows), n) negatives, each row's absent from its sequence: `seen` (B, W) holds
        each sample's items (0 = padding), `rows` the sample of each target position (per
        position) or of each sequence (per sequence)."""

        return draw_negatives(rng, seen, rows, self.n, n_items, self.cdf)


def draw_negatives(
    rng: np.random.Generator,
    sequences: np.ndarray,
    rows: np.ndarray,
    k: int,
    n_items: int,
    cdf: np.ndarray | None = None,
) -> np.ndarray:
    """k items per target position, among the items absent from that position's sequence:
    uniform, or in proportion to weights given as their (n_items + 1,) cumulative distribution
    `cdf` (index 0, padding, and zero-weight items are never drawn).

    sequences (B, W): each sample's items (0 = padding); rows (M,): the sample of each target
    position. Returns (M, k) in 1..n_items. Rejection sampling, vectorised: draw, redraw the
    collisions (a sequence holding most of the catalogue would make this slow; ML-1M's longest
    holds 69 %).
    """
    seen = np.zeros((sequences.shape[0], n_items + 1), dtype=bool)
    seen[np.arange(sequences.shape[0])[:, None], sequences] = True
    seen[:, 0] = True
    if cdf is not None:
        seen |= np.diff(cdf, prepend=0.0)[None, :] <= 0  # weight 0: never a negative

    def draw(size: int | tuple[int, int]) -> np.ndarray:
        if cdf is None:
            return rng.integers(1, n_items + 1, size=size)
        return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), n_items)

    if seen[np.unique(rows)].all(axis=1).any():
        raise ValueError("a sequence holds every item: no negative can be drawn for it")
    out = draw((len(rows), k))
    bad = seen[rows[:, None], out]
    while bad.any():
        out[bad] = draw(int(bad.sum()))
        bad = seen[rows[:, None], out]
    return out


def draw_shared_negatives(
    rng: np.random.Generator, k: int, n_items: int, cdf: np.ndarray | None = None
) -> np.ndarray:
    """k items for a whole batch, shared by all its target positions (negatives_per = "batch"):
    k distinct items drawn uniformly from 1..n_items, so each is drawn with probability k / V
    (the logQ correction's q), or, given the (n_items + 1,) cumulative weights `cdf`, k draws
    in proportion to them. Nothing is excluded here; the loss leaves a row's own target out
    of its negatives. Returns (k,)."""
    if cdf is not None:
        return np.minimum(np.searchsorted(cdf, rng.random(k), side="right"), n_items)
    if k > n_items:
        raise ValueError(f"{k} shared negatives asked for, but the catalogue has {n_items} items")
    return rng.choice(n_items, size=k, replace=False) + 1


def check_pack(pack: bool, n_negatives: int, per: str) -> None:
    """Packed rows share a row between several sequences, so negatives drawn per sequence do not
    combine with them (a ConfigError line)."""
    if pack and n_negatives and per == "sequence":
        raise ConfigError('next_item.pack does not combine with train.negatives_per = "sequence"')
