"""Several trained runs scored as one: the weighted sum of the members' log-softmax scores over the
catalogue (a weighted product of their next-item distributions, renormalised).

Each member reads the most recent items its own model reads; the members must have been trained
on the same items in the same order (the runs of one prepared dataset), which `from_runs` checks.
Log-softmax puts the members on one scale: a model trained with cross-entropy gives log
probabilities, and any other model's scores become the distribution its ranking implies, so the
sum does not depend on a member's scale or shift.

    ens = Ensemble.from_runs(["runs/lrurec", "runs/sasrec"], weights=[0.6, 0.4])
    report = ds.evaluate(ens, "test")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from seqrec.evaluate import Scorer

__all__ = ["Ensemble"]


class Ensemble:
    """A `Scorer` over `members` (each a `Scorer`: a model, a run's model, a baseline), weighted
    by `weights` (non-negative, not all zero; default equal; normalised to sum to 1)."""

    def __init__(self, members: Sequence[Scorer], weights: Sequence[float] | None = None) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        w = [1.0] * len(members) if weights is None else [float(x) for x in weights]
        if len(w) != len(members):
            raise ValueError(f"{len(w)} weights for {len(members)} members")
        if any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0, got {w}")
        self.members = list(members)
        self.weights = [x / sum(w) for x in w]

    @classmethod
    def from_runs(
        cls,
        run_dirs: Sequence[str | Path],
        weights: Sequence[float] | None = None,
        device: str | torch.device = "cpu",
    ) -> Ensemble:
        """The best weights of each run (`checkpoint.load_run`); refused unless every run has
        the same item vocabulary."""
        from seqrec.checkpoint import load_run

        runs = [load_run(d, device) for d in run_dirs]
        for run in runs[1:]:
            if list(run.item_ids) != list(runs[0].item_ids):
                raise ValueError(
                    f"{run.path}: its items differ from {runs[0].path}'s; an ensemble's runs "
                    "must be trained on the same prepared data"
                )
        return cls([r.model for r in runs], weights)

    @property
    def max_len(self) -> int | None:
        """The longest history any member reads (None: one reads all)."""
        lens = [m.max_len for m in self.members]
        return None if any(n is None for n in lens) else max(n for n in lens if n is not None)

    @property
    def device(self) -> torch.device:
        return torch.device(getattr(self.members[0], "device", "cpu"))

    @torch.no_grad()
    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) histories -> (B, n_items + 1): Σ w_i log_softmax(member_i's scores of items
        1..n); column 0 is -inf. A member reading fewer items than L sees the last ones."""
        total: torch.Tensor | None = None
        for member, w in zip(self.members, self.weights, strict=True):
            if w == 0:
                continue
            n = member.max_len
            rows = histories if n is None or n >= histories.shape[1] else histories[:, -n:]
            part = w * torch.log_softmax(member.score(rows, users)[:, 1:].float(), dim=1)
            total = part if total is None else total + part
        assert total is not None  # some weight is > 0
        return torch.cat([torch.full_like(total[:, :1], -math.inf), total], dim=1)
