"""Confirm a close call with more seeds: train a shipped config with several training seeds
(each run reused from benchmarks/speed.py time-to-quality's run directory of the same config, budget
and seed when there is one), evaluate every run against the candidates of several candidate
seeds, and report each metric's mean ± standard deviation beside its target, saying plainly
whether the target holds on the mean.

    python benchmarks/reproduce.py seed-confirmation --config ml-1m-sasrec-ce --budget 10
        [--seeds 0,1,2] [--candidate-seeds 42,43]
        [--target test.full.ndcg@10=0.18 ...] [--runs-dir DIR] [--name NAME] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import Any

from _common import paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.evaluation.protocols import PROTOCOLS
from seqrec.training.checkpoint import load_run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--config", required=True)
    ap.add_argument("--budget", type=int, help="minutes (default: the config's own budget)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--candidate-seeds", default="42,43")
    ap.add_argument("--target", action="append", default=[], metavar="PROTOCOL.METRIC=VALUE")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs-dir", help="run directories (default: $SEQREC_HOME/runs)")
    ap.add_argument("--name")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    targets = {k: float(v) for k, _, v in (t.partition("=") for t in args.target)}
    cand_seeds = [int(s) for s in args.candidate_seeds.split(",")]
    budget = f"{args.budget}m" if args.budget else None
    rows: list[dict[str, Any]] = []
    run_dirs: list[Path] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        overrides = [f"train.seed={seed}", *args.set]
        if budget:
            overrides.insert(0, f"train.time_budget='{budget}'")
        cfg = load_config(RunConfig, args.config, overrides)
        ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        tag = budget or cfg.train.time_budget or "default"
        out = runs / f"ttq-{args.config}-{tag}-s{seed}"
        metrics, _ = train_or_reuse(ds, cfg, out, src)
        run_dirs.append(out)
        model = load_run(out, trust=True).model  # the benchmarks' own runs
        model.eval()
        for cand in cand_seeds:
            if cand == cfg.eval.negative_seed:
                test = metrics["test"]
            else:
                eval_cfg = dataclasses.replace(cfg.eval, negative_seed=cand)
                other = prepare(src, data_cfg=cfg.data, eval_cfg=eval_cfg, progress=False)
                test = other.evaluate(model, "test", protocols=PROTOCOLS).metrics  # type: ignore[arg-type]
            rows.append(
                {
                    "train_seed": seed,
                    "candidate_seed": cand,
                    "test": test,
                    "epochs": metrics["epochs"],
                    "run_dir": str(out),
                }
            )
            print(
                f"seed {seed}, candidates {cand}: full NDCG@10 {test['full']['ndcg@10']:.4f}, "
                f"pop100 HR@10 {test['pop100']['hr@10']:.4f} NDCG@10 "
                f"{test['pop100']['ndcg@10']:.4f}",
                flush=True,
            )
        _write(args, rows, run_dirs, targets, cand_seeds)


def _write(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    run_dirs: list[Path],
    targets: dict[str, float],
    cand_seeds: list[int],
) -> None:
    metrics = [(p, m) for p in PROTOCOLS for m in ("hr@10", "ndcg@10")]
    summary: dict[str, dict[str, Any]] = {}  # protocol -> metric -> statistics
    for p, m in metrics:
        values = [r["test"][p][m] for r in rows]
        by_train = [
            statistics.mean(r["test"][p][m] for r in rows if r["train_seed"] == s)
            for s in dict.fromkeys(r["train_seed"] for r in rows)
        ]
        target = targets.get(f"test.{p}.{m}")
        summary.setdefault(p, {})[m] = {
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
            "std_over_training_seeds": statistics.stdev(by_train) if len(by_train) > 1 else None,
            "min": min(values),
            "max": max(values),
            "target": target,
            "holds_on_mean": None if target is None else statistics.mean(values) >= target,
        }
    lines = [
        f"# Seed confirmation: `{args.config}`"
        + (f", {args.budget}-minute budget" if args.budget else ", its own budget"),
        "",
        f"{len({r['train_seed'] for r in rows})} training seeds x {len(cand_seeds)} candidate "
        "seeds (the sampled protocols' negatives), test split, state chosen on validation.",
        "",
        "| metric | mean ± std (all runs) | std over training seeds | min | max | target "
        "| holds on the mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, s in ((f"{p}.{m}", v) for p, row in summary.items() for m, v in row.items()):
        std = "" if s["std"] is None else f" ± {s['std']:.4f}"
        tstd = "" if s["std_over_training_seeds"] is None else f"{s['std_over_training_seeds']:.4f}"
        target = "" if s["target"] is None else f"{s['target']}"
        holds = "" if s["holds_on_mean"] is None else ("yes" if s["holds_on_mean"] else "**no**")
        lines.append(
            f"| {key} | {s['mean']:.4f}{std} | {tstd} | {s['min']:.4f} "
            f"| {s['max']:.4f} | {target} | {holds} |"
        )
    lines += [
        "",
        "| training seed | candidate seed | full NDCG@10 | pop100 HR@10 "
        "| pop100 NDCG@10 | uni100 NDCG@10 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["test"]
        lines.append(
            f"| {r['train_seed']} | {r['candidate_seed']} | {t['full']['ndcg@10']:.4f} "
            f"| {t['pop100']['hr@10']:.4f} | {t['pop100']['ndcg@10']:.4f} "
            f"| {t['uni100']['ndcg@10']:.4f} |"
        )
    seeds = {f"train_{i}": s for i, s in enumerate(dict.fromkeys(r["train_seed"] for r in rows))}
    seeds.update({f"candidates_{i}": s for i, s in enumerate(cand_seeds)})
    name = args.name or f"seeds_{args.config.replace('-', '_')}"
    payload = {"config": args.config, "budget_min": args.budget, "rows": rows, "summary": summary}
    area = next((m for m in ("sasrec", "bert4rec") if m in args.config), "baselines")
    write_results(name, payload, "\n".join(lines), seeds=seeds, runs=run_dirs, area=area)
