"""Does an ensemble of trained runs rank better than its members? Each member is a recipe under a
budget, trained (or reused) in the runs folder; the members' weights are chosen on validation
full NDCG@10 over a grid, and the test split is read once, at the chosen weights.

    python benchmarks/ensemble.py --data ml-1m --member lrurec=ml-1m-lrurec:30m \\
        --member sasrec-ce=ml-1m-sasrec-ce:10m [--runs-dir DIR] [--step 0.1] [--name NAME]

`--data`: ml-1m or beauty (the papers' files under --data-dir / $SEQREC_DATA_DIR). A member is
NAME=CONFIG:BUDGET[:KEY=VALUE,...]; its run is <runs-dir>/NAME (a finished run with the same
config is reused as it was trained). The score is `seqrec.ensemble.Ensemble`'s: the weighted sum
of the members' log-softmax scores. The grid: every weight vector on the simplex in steps of
`--step`. The chosen weights' test numbers are computed twice, from the members' stored scores
and by `Ensemble.from_runs` from the runs, and must agree.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import torch

from _common import budgeted_row, paper_beauty, paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.data.prepared import PreparedDataset, prepare
from seqrec.ensemble import Ensemble
from seqrec.evaluate import PROTOCOLS, Scorer

KEY = ("full", "ndcg@10")


class Table:
    """A scorer reading a stored (n_users, n_items + 1) score table by user."""

    max_len = None

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        assert users is not None
        return self.table[users]


class Recorder:
    """A member's scorer that also stores log_softmax of its scores by user."""

    def __init__(self, member: Scorer, n_users: int, n_items: int) -> None:
        self.member = member
        self.max_len = member.max_len
        self.table = torch.full((n_users, n_items + 1), -torch.inf)

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        assert users is not None
        s = self.member.score(histories, users).float()
        self.table[users, 1:] = torch.log_softmax(s[:, 1:], dim=1)
        return s


def _grid(n: int, step: float) -> list[tuple[float, ...]]:
    k = round(1 / step)
    out = []
    for c in itertools.product(range(k + 1), repeat=n):
        if sum(c) == k:
            out.append(tuple(x / k for x in c))
    return out


def _metrics(report: Any) -> dict[str, dict[str, float]]:
    return {p: dict(v) for p, v in report.metrics.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", choices=("ml-1m", "beauty"), default="ml-1m")
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--member", action="append", required=True)
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument("--name", default="ensemble_ml1m")
    args = ap.parse_args()
    src = (paper_ml1m if args.data == "ml-1m" else paper_beauty)(args.data_dir)
    members = [budgeted_row(spec) for spec in args.member]
    datas = {(c.data, c.eval) for *_, c in members}
    if len(datas) != 1:
        raise SystemExit("ensemble: every member must prepare the data the same way")
    cfg0 = members[0][3]
    ds: PreparedDataset = prepare(src, data_cfg=cfg0.data, eval_cfg=cfg0.eval, progress=False)
    root = runs_dir(args.runs_dir)
    runs: list[Path] = []
    trained: list[dict[str, Any]] = []
    for name, config, budget, cfg in members:
        out = root / name
        m, _ = train_or_reuse(ds, cfg, out, src)
        runs.append(out)
        trained.append(
            {
                "name": name,
                "config": config,
                "budget": budget,
                "run": str(out),
                "epochs": m["epochs"],
                "best_epoch": m["best_epoch"],
                "train_time_s": m["train_time_s"],
                "test_as_trained": m["test"],
            }
        )

    from seqrec.checkpoint import load_run

    models = [load_run(r).model for r in runs]
    n_users, n_items = ds.n_users, ds.n_items
    tables: dict[str, list[torch.Tensor]] = {}
    for split in ("valid", "test"):
        tables[split] = []
        for member, row in zip(models, trained, strict=True):
            rec = Recorder(member, n_users, n_items)
            report = ds.evaluate(rec, split, protocols=PROTOCOLS)
            row[split] = _metrics(report)
            tables[split].append(rec.table)

    def ensemble_report(split: str, w: tuple[float, ...]) -> dict[str, dict[str, float]]:
        total = sum(x * t for x, t in zip(w, tables[split], strict=True))
        assert isinstance(total, torch.Tensor)
        total[:, 0] = -torch.inf
        protocols = PROTOCOLS if split == "test" else ("full",)
        return _metrics(ds.evaluate(Table(total), split, protocols=protocols))

    start = time.perf_counter()
    grid = []
    for w in _grid(len(models), args.step):
        v = ensemble_report("valid", w)
        grid.append({"weights": list(w), "valid": v[KEY[0]][KEY[1]]})
    best = max(grid, key=lambda g: g["valid"])
    weights = tuple(best["weights"])
    test = ensemble_report("test", weights)
    direct = _metrics(ds.evaluate(Ensemble.from_runs(runs, weights), "test"))
    for p in PROTOCOLS:
        for k, v in test[p].items():
            assert abs(direct[p][k] - v) < 1e-3, (p, k, direct[p][k], v)
    equal = ensemble_report("test", tuple([1 / len(models)] * len(models)))
    grid_s = time.perf_counter() - start

    names = [t["name"] for t in trained]
    lines = [
        f"# An ensemble on {args.data}: {' + '.join(names)}\n",
        "Members trained (or reused) under their budgets; the weights chosen on validation full "
        f"NDCG@10 over a grid of step {args.step} (each member's log-softmax scores, weighted "
        "and summed: `seqrec.ensemble.Ensemble`); the test split read at the chosen weights.\n",
        "| system | weights | valid full NDCG@10 | test full HR@10 | test full NDCG@10 | "
        "test uni100 NDCG@10 | test pop100 NDCG@10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in trained:
        f, u, p = (t["test"][x] for x in PROTOCOLS)
        lines.append(
            f"| {t['name']} (`{t['config']}`, {t['budget']}; {t['epochs']} epochs) | — | "
            f"{t['valid']['full']['ndcg@10']:.4f} | {f['hr@10']:.4f} | {f['ndcg@10']:.4f} | "
            f"{u['ndcg@10']:.4f} | {p['ndcg@10']:.4f} |"
        )
    for label, w, res in (
        ("ensemble, weights chosen on validation", weights, test),
        ("ensemble, equal weights", tuple([1 / len(models)] * len(models)), equal),
    ):
        valid = (
            next(g["valid"] for g in grid if tuple(g["weights"]) == w)
            if label.endswith("validation")
            else ensemble_report("valid", w)["full"]["ndcg@10"]
        )
        f, u, p = (res[x] for x in PROTOCOLS)
        lines.append(
            f"| {label} | {', '.join(f'{x:.2f}' for x in w)} | {valid:.4f} | {f['hr@10']:.4f} | "
            f"{f['ndcg@10']:.4f} | {u['ndcg@10']:.4f} | {p['ndcg@10']:.4f} |"
        )
    lines.append("")
    lines.append(
        "Validation full NDCG@10 over the grid (weights in member order): "
        + ", ".join(
            f"({', '.join(f'{x:.1f}' for x in g['weights'])}) {g['valid']:.4f}" for g in grid
        )
        + "."
    )
    lines.append("")
    lines.append(
        f"Members' training: {sum(t['train_time_s'] for t in trained) / 60:.1f} min in all; "
        f"scoring the grid and the test: {grid_s:.0f} s. Member rows are the members' own "
        "scores recomputed here in float32 (their runs' metrics.json hold the numbers as "
        "trained)."
    )
    md = "\n".join(lines) + "\n"
    payload = {
        "protocol": "leave-one-out; full ranking and 100 sampled negatives; weights on valid",
        "data": args.data,
        "members": trained,
        "grid": grid,
        "weights": list(weights),
        "test": test,
        "test_equal_weights": equal,
        "grid_s": grid_s,
    }
    paths = write_results(
        args.name,
        payload,
        md,
        seeds={"train": cfg0.train.seed, "candidates": cfg0.eval.negative_seed},
        runs=runs,
    )
    print(md)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
