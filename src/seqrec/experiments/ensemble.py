"""Several trained runs scored as one: the weighted sum of the members' log-softmax scores over the
catalogue (a weighted product of their next-item distributions, renormalised).

Each member reads the most recent items its own model reads; the members must have been trained
on the same items in the same order (the runs of one prepared dataset), which `from_runs` checks.
Log-softmax puts the members on one scale: a model trained with cross-entropy gives log
probabilities, and any other model's scores become the distribution its ranking implies, so the
sum does not depend on a member's scale or shift.

    ens = Ensemble.from_runs(["runs/lrurec", "runs/sasrec"], weights=[0.6, 0.4])
    report = evaluate_split(ds, ens, "test")

The weights are chosen on the validation split (`choose_weights`: every weight vector on a grid,
each member scored once), never on the test split.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqrec.data.ids import check_items, same_items
from seqrec.evaluation.protocols import Scorer, evaluate_split

if TYPE_CHECKING:
    from seqrec.data.prepared import PreparedDataset
    from seqrec.training.checkpoint import Run

__all__ = [
    "Ensemble",
    "WeightChoice",
    "check_same_items",
    "choose_run_weights",
    "choose_weights",
    "evaluate_runs",
    "weight_grid",
]

# the most memory `choose_weights` holds for the members' scores of a chunk of validation users
CHOICE_BYTES = 2 << 30


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
        from seqrec.training.checkpoint import load_run

        runs = [load_run(d, device) for d in run_dirs]
        check_same_items(runs)
        return cls([r.model for r in runs], weights)

    @property
    def max_len(self) -> int | None:
        """The longest history any member reads (None: one reads all)."""
        lens = [m.max_len for m in self.members]
        return None if any(n is None for n in lens) else max(n for n in lens if n is not None)

    @property
    def device(self) -> torch.device:
        return torch.device(getattr(self.members[0], "device", "cpu"))

    @property
    def uses_times(self) -> bool:
        """Whether a member reads when the items happened (it is then given `times`)."""
        return any(getattr(m, "uses_times", False) for m in self.members)

    @torch.no_grad()
    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories -> (B, n_items + 1): Σ w_i log_softmax(member_i's scores of items
        1..n); column 0 is -inf. A member reading fewer items than L sees the last ones (and
        a member of time their times, `times` (B, L + 1), and the query's)."""
        total: torch.Tensor | None = None
        for member, w in zip(self.members, self.weights, strict=True):
            if w == 0:
                continue
            n = member.max_len
            if n is None or n >= histories.shape[1]:
                n = histories.shape[1]
            rows = histories[:, -n:]
            timed = {}
            if getattr(member, "uses_times", False):  # the window's times and the query's
                timed = {"times": None if times is None else times[:, -(n + 1) :]}
            part = w * torch.log_softmax(member.score(rows, users, **timed)[:, 1:].float(), dim=1)
            total = part if total is None else total + part
        assert total is not None  # some weight is > 0
        return torch.cat([torch.full_like(total[:, :1], -math.inf), total], dim=1)


def check_same_items(runs: Sequence[Run]) -> None:
    """Refuse (ValueError, one line) runs whose item vocabularies differ from the first's."""
    for run in runs[1:]:
        if not same_items(run.item_ids, runs[0].item_ids):
            raise ValueError(
                f"{run.path}: its items differ from {runs[0].path}'s; an ensemble's runs "
                "must be trained on the same prepared data"
            )


def weight_grid(n: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector of `n` members on the simplex in steps of `step` (1 / step whole)."""
    k = round(1 / step)
    if n < 1 or not 0 < step <= 1 or abs(k * step - 1) > 1e-9:
        raise ValueError(f"a weight grid needs members >= 1 and 1 / step whole, got {n}, {step}")
    return [
        tuple(x / k for x in c) for c in itertools.product(range(k + 1), repeat=n) if sum(c) == k
    ]


@dataclass(frozen=True)
class WeightChoice:
    """The weights `choose_weights` chose and the validation value of every grid point."""

    weights: tuple[float, ...]
    value: float
    grid: list[tuple[tuple[float, ...], float]]
    metric: str


class _Table:
    """A scorer reading stored rows of scores by user."""

    max_len = None

    def __init__(self, table: torch.Tensor, row_of_user: np.ndarray) -> None:
        self.table, self.row_of_user = table, torch.from_numpy(row_of_user)

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        assert users is not None
        return self.table[self.row_of_user[users.cpu()]]


class _Recorder:
    """A member's scorer that stores each user's log-softmax scores as it is evaluated."""

    def __init__(self, member: Scorer, table: torch.Tensor, row_of_user: np.ndarray) -> None:
        self.member, self.max_len = member, member.max_len
        self.uses_times = getattr(member, "uses_times", False)
        self.table, self.row_of_user = table, torch.from_numpy(row_of_user)

    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert users is not None
        timed = {"times": times} if self.uses_times else {}
        s = self.member.score(histories, users, **timed).float()
        self.table[self.row_of_user[users.cpu()], 1:] = torch.log_softmax(s[:, 1:], 1).cpu()
        return s


def choose_weights(
    members: Sequence[Scorer],
    ds: PreparedDataset,
    *,
    step: float = 0.1,
    protocol: str = "full",
    metric: str = "ndcg@10",
    sample_users: int = 0,
    seed: int = 42,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    max_bytes: int = CHOICE_BYTES,
) -> WeightChoice:
    """The grid point (`weight_grid`) with the best `metric` under `protocol` on the validation
    split (`sample_users`, `seed`: rank a sample of the users, as `PreparedDataset.eval_data`);
    ties go to the earlier point. Each member scores each user once: the users are taken a chunk
    at a time, the members' log-softmax scores of a chunk held (users x items x members floats,
    at most `max_bytes`) while every grid point ranks it."""
    from seqrec.evaluation.metrics import per_user
    from seqrec.evaluation.protocols import evaluate, parse_protocols

    protocol = parse_protocols(protocol)[0]
    per_user(np.zeros(1, dtype=np.int64), metric)  # a metric it knows, before any scoring
    grid = weight_grid(len(members), step)
    eval_set, negatives = ds.eval_data("valid", sample_users, seed)
    rows = len(eval_set.targets)
    per_row = (ds.n_items + 1) * 4 * len(members)
    chunk = max(1, min(rows, max_bytes // per_row))
    ranks = [np.zeros(rows, dtype=np.int64) for _ in grid]
    row_of_user = np.zeros(ds.n_users, dtype=np.int64)
    for lo in range(0, rows, chunk):
        part = np.arange(lo, min(lo + chunk, rows))
        part_set = eval_set.take(part)
        part_negs = {p: n[part] for p, n in negatives.items()}
        row_of_user[part_set.users] = np.arange(len(part))
        tables = []
        for member in members:
            table = torch.full((len(part), ds.n_items + 1), -math.inf)
            evaluate(
                _Recorder(member, table, row_of_user),
                part_set,
                protocols=(protocol,),
                negatives=part_negs,
                batch_size=batch_size,
                device=device,
            )
            tables.append(table)
        for i, w in enumerate(grid):
            total = sum((x * t for x, t in zip(w, tables, strict=True) if x > 0), torch.zeros(()))
            report = evaluate(
                _Table(total, row_of_user),
                part_set,
                protocols=(protocol,),
                negatives=part_negs,
                batch_size=batch_size,
            )
            ranks[i][part] = report.ranks[protocol]
    values = [(w, float(per_user(r, metric).mean())) for w, r in zip(grid, ranks, strict=True)]
    best = max(range(len(grid)), key=lambda i: (values[i][1], -i))
    return WeightChoice(grid[best], values[best][1], values, f"valid {protocol} {metric}")


def choose_run_weights(
    runs: Sequence[Run],
    ds: PreparedDataset,
    *,
    step: float = 0.1,
    device: str | torch.device | None = None,
) -> WeightChoice:
    """`choose_weights` for loaded runs of the same items (else refused), under the first run's
    evaluation settings (its sample of users, candidates' seed and batch size)."""
    check_same_items(runs)
    e = runs[0].config.eval
    return choose_weights(
        [r.model for r in runs],
        ds,
        step=step,
        sample_users=e.sample_users,
        seed=e.negative_seed,
        batch_size=e.batch_size,
        device=device,
    )


def evaluate_runs(
    run_dirs: Sequence[str | Path],
    ds: PreparedDataset,
    *,
    step: float = 0.1,
    device: str | torch.device | None = None,
    trust: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """The ensemble of finished runs as a recipe's last step: their weights chosen on the
    validation split (`choose_weights`, the first run's evaluation settings), then both splits
    evaluated at those weights under the first run's protocols and cut-offs. Returns
    {"weights", "grid": [{"weights", "valid"}], "choice", "valid", "test"} (metrics as a run's
    metrics.json holds them: protocol -> metric -> value). `device`: None for a GPU when there is
    one."""
    from seqrec.evaluation.protocols import parse_protocols
    from seqrec.training.checkpoint import load_run
    from seqrec.training.setup import resolve_device

    device = resolve_device("auto") if device is None else device

    runs = [load_run(d, device, trust=trust) for d in run_dirs]
    check_items(runs[0].item_ids, ds.item_ids, runs[0].path, "the dataset given", ValueError)
    choice = choose_run_weights(runs, ds, step=step, device=device)
    e = runs[0].config.eval
    ens = Ensemble([r.model for r in runs], choice.weights)
    out: dict[str, Any] = {
        "weights": list(choice.weights),
        "grid": [{"weights": list(w), "valid": v} for w, v in choice.grid],
        "choice": choice.metric,
    }
    for split in ("valid", "test"):
        report = evaluate_split(
            ds,
            ens,
            split,
            protocols=parse_protocols(e.protocols),
            ks=e.ks,
            batch_size=e.batch_size,
            device=device,
            progress=progress,
            sample_users=e.sample_users,
            seed=e.negative_seed,
        )
        out[split] = {p: dict(v) for p, v in report.metrics.items()}
    return out
