"""Does an ensemble of trained runs rank better than its members? Each member is a recipe under a
budget, trained (or reused) in the runs folder; the members' weights are chosen on validation
full NDCG@10 over a grid, and the test split is read once, at the chosen weights.

    python benchmarks/reproduce.py ensemble --data ml-1m --member lrurec=ml-1m-lrurec:30m \\
        --member sasrec-ce=ml-1m-sasrec-ce:10m [--seeds 0,1,2] [--runs-dir DIR] [--step 0.1]
        [--name NAME]

`--data`: ml-1m or beauty (the papers' files under --data-dir / $SEQREC_DATA_DIR). A member is
NAME=CONFIG:BUDGET[:KEY=VALUE,...]; its run is <runs-dir>/NAME, or NAME-s<seed> with
train.seed=<seed> for a seed other than 0 (a finished run with the same config is reused as it
was trained). Each seed is one ensemble of its members' runs of that seed, with its own weights.
The score is `seqrec.experiments.ensemble.Ensemble`'s: the weighted sum of the members'
log-softmax scores.
The grid: every weight vector on the simplex in steps of `--step`
(`seqrec.experiments.ensemble.choose_weights`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from _common import budgeted_row, paper_beauty, paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.evaluation.protocols import PROTOCOLS, evaluate_split
from seqrec.experiments.ensemble import Ensemble, choose_weights


def _metrics(report: Any) -> dict[str, dict[str, float]]:
    return {p: dict(v) for p, v in report.metrics.items()}


def _seeded(spec: str, seed: int) -> str:
    """A member's spec for a training seed: seed 0 as written, another as NAME-s<seed> with
    train.seed=<seed> added."""
    if seed == 0:
        return spec
    name, _, rest = spec.partition("=")
    config, _, rest = rest.partition(":")
    budget, _, sets = rest.partition(":")
    sets = ",".join(x for x in (sets, f"train.seed={seed}") if x)
    return f"{name}-s{seed}={config}:{budget}:{sets}"


def _one_seed(
    specs: list[str], seed: int, ds: PreparedDataset, src: Path, root: Path, step: float
) -> dict[str, Any]:
    """Train (or reuse) the members of one seed, choose their weights on validation, test."""
    from seqrec.training.checkpoint import load_run

    members = [budgeted_row(_seeded(spec, seed)) for spec in specs]
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
                "seed": cfg.train.seed,
                "run": str(out),
                "epochs": m["epochs"],
                "best_epoch": m["best_epoch"],
                "train_time_s": m["train_time_s"],
                "test_as_trained": m["test"],
            }
        )
    models = [load_run(r).model for r in runs]
    for member, row in zip(models, trained, strict=True):
        for split in ("valid", "test"):
            row[split] = _metrics(evaluate_split(ds, member, split))
    start = time.perf_counter()
    choice = choose_weights(models, ds, step=step)
    equal_w = tuple([1 / len(models)] * len(models))
    out = {
        "seed": seed,
        "members": trained,
        "runs": runs,
        "grid": [{"weights": list(w), "valid": v} for w, v in choice.grid],
        "weights": list(choice.weights),
        "valid": choice.value,
        "test": _metrics(evaluate_split(ds, Ensemble(models, choice.weights), "test")),
        "equal_weights": {
            "valid": evaluate_split(
                ds, Ensemble(models, equal_w), "valid", protocols=("full",)
            ).metrics["full"]["ndcg@10"],
            "test": _metrics(evaluate_split(ds, Ensemble(models, equal_w), "test")),
        },
    }
    out["choose_and_test_s"] = time.perf_counter() - start
    return out


def _row(label: str, weights: str, valid: float, test: dict[str, dict[str, float]]) -> str:
    f, u, p = (test[x] for x in PROTOCOLS)
    return (
        f"| {label} | {weights} | {valid:.4f} | {f['hr@10']:.4f} | {f['ndcg@10']:.4f} | "
        f"{u['ndcg@10']:.4f} | {p['ndcg@10']:.4f} |"
    )


def _mean_std(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "values": values,  # type: ignore[dict-item]
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", choices=("ml-1m", "beauty"), default="ml-1m")
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--member", action="append", required=True)
    ap.add_argument("--seeds", default="0", help="comma-separated training seeds")
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument("--name", default="ensemble_ml1m")
    args = ap.parse_args(argv)
    src = (paper_ml1m if args.data == "ml-1m" else paper_beauty)(args.data_dir)
    seeds = [int(s) for s in args.seeds.split(",")]
    cfgs = [budgeted_row(spec)[3] for spec in args.member]  # every spec checked before training
    if len({(c.data, c.eval) for c in cfgs}) != 1:
        raise SystemExit("ensemble: every member must prepare the data the same way")
    ds = prepare(src, data_cfg=cfgs[0].data, eval_cfg=cfgs[0].eval, progress=False)
    root = runs_dir(args.runs_dir)
    results = [_one_seed(args.member, s, ds, src, root, args.step) for s in seeds]

    names = [t["name"] for t in results[0]["members"]]
    lines = [
        f"# An ensemble on {args.data}: {' + '.join(names)}\n",
        "Members trained (or reused) under their budgets; per seed, the weights chosen on "
        f"validation full NDCG@10 over a grid of step {args.step} (each member's log-softmax "
        "scores, weighted and summed: `seqrec.experiments.ensemble.Ensemble`) and the test split "
        "read at "
        "the chosen weights. Member rows: each run's own scores, recomputed here.\n",
        "| system | weights | valid full NDCG@10 | test full HR@10 | test full NDCG@10 | "
        "test uni100 NDCG@10 | test pop100 NDCG@10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for t in r["members"]:
            label = f"{t['name']} (`{t['config']}`, {t['budget']}; {t['epochs']} epochs)"
            lines.append(_row(label, "—", t["valid"]["full"]["ndcg@10"], t["test"]))
        w = ", ".join(f"{x:.2f}" for x in r["weights"])
        lines.append(_row(f"**ensemble, seed {r['seed']}**", w, r["valid"], r["test"]))
        eq = r["equal_weights"]
        w = ", ".join(f"{1 / len(names):.2f}" for _ in names)
        lines.append(_row(f"ensemble, seed {r['seed']}, equal weights", w, eq["valid"], eq["test"]))
    summary = {
        p: {k: _mean_std([r["test"][p][k] for r in results]) for k in ("hr@10", "ndcg@10")}
        for p in PROTOCOLS
    }
    members_summary = {
        name: _mean_std([r["members"][i]["test"]["full"]["ndcg@10"] for r in results])
        for i, name in enumerate(names)
    }
    lines.append("")
    if len(results) > 1:
        s = summary["full"]["ndcg@10"]
        lines.append(
            f"Over {len(results)} seeds ({args.seeds}): the ensemble's test full NDCG@10 "
            f"{s['mean']:.4f} ± {s['std']:.4f} (mean ± std); its members' "
            + ", ".join(f"{n} {m['mean']:.4f} ± {m['std']:.4f}" for n, m in members_summary.items())
            + ".\n"
        )
    for r in results:
        grid = r["grid"]
        shown = sorted(grid, key=lambda g: -g["valid"])[:12] if len(grid) > 12 else grid
        lines.append(
            f"Seed {r['seed']}, validation full NDCG@10 over the grid "
            f"({'the best 12 of ' if len(grid) > 12 else ''}{len(grid)} points; weights in "
            "member order; all in the JSON): "
            + ", ".join(
                f"({', '.join(f'{x:.1f}' for x in g['weights'])}) {g['valid']:.4f}" for g in shown
            )
            + ".\n"
        )
    train_min = [sum(t["train_time_s"] for t in r["members"]) / 60 for r in results]
    lines.append(
        "Members' training per seed: "
        + ", ".join(f"{m:.1f}" for m in train_min)
        + " min; choosing the weights and testing: "
        + ", ".join(f"{r['choose_and_test_s']:.0f}" for r in results)
        + " s."
    )
    md = "\n".join(lines) + "\n"
    runs = [p for r in results for p in r["runs"]]
    for r in results:
        r["runs"] = [str(p) for p in r["runs"]]
    payload = {
        "protocol": "leave-one-out; full ranking and 100 sampled negatives; weights on valid",
        "data": args.data,
        "members": args.member,
        "training_seeds": seeds,
        "per_seed": results,
        "summary": summary,
        "members_summary": members_summary,
    }
    paths = write_results(
        args.name,
        payload,
        md,
        seeds={
            **{f"train_{i}": x for i, x in enumerate(seeds)},
            "candidates": cfgs[0].eval.negative_seed,
        },
        runs=runs,
    )
    print(md)
    print("wrote", *paths)
