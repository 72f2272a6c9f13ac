"""Collect probe runs (run directories trained by `seqrec train` with a common base config and a
few overrides each) into one table: what each probe changed against the base, its validation
curve at chosen epochs, its test metrics, speed and the commit it was trained at. Finished and
interrupted runs alike (an interrupted one reports its curve so far, no test).

    python benchmarks/analyses.py probes --base benchmarks/configs/bert4rec-probe-30ep.toml
        --runs-dir DIR --probe NAME [--probe NAME ...] [--at 9,19,29] [--name bert4rec_probes]
        [--set KEY=VALUE ...]

`--set` overrides the base, as `seqrec train --set` does: a base that fits sizes or its loss to
the data (`adapt`) is compared with each probe as that probe fitted them, so a probe that set one
of them shows no change unless the base states the value it fitted (`--set train.logq=true`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import write_results
from seqrec.config import RunConfig, config_diff, load_config
from seqrec.training.policy import as_trained
from seqrec.training.rundir import RunDir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", required=True, help="the config every probe starts from")
    ap.add_argument("--runs-dir", required=True)
    ap.add_argument("--probe", action="append", default=[], help="a run directory's name")
    ap.add_argument("--at", default="9,19,29", help="epochs whose validation value to show")
    ap.add_argument("--title", default="Probes")
    ap.add_argument("--name", default="probes")
    ap.add_argument("--area", help="the results folder (default: bert4rec)")
    ap.add_argument("--set", action="append", default=[], help="override the base: KEY=VALUE")
    args = ap.parse_args(argv)
    base = load_config(RunConfig, args.base, args.set)
    at = [int(e) for e in args.at.split(",")]
    rows: list[dict[str, Any]] = []
    curves: set[str] = set()  # the validation metrics the probes' curves follow ("full_hr@10")
    for name in args.probe:
        run = Path(args.runs_dir) / name
        run_dir = RunDir(run, trust=True)  # the benchmarks' own runs, some older than the manifest
        cfg = run_dir.config()
        changed = [
            d.split(": ")[0] + " = " + d.split(": ")[1].split(" vs ")[0]
            for d in config_diff(as_trained(cfg), as_trained(base, like=cfg))
        ]
        log = run_dir.log()
        key = next((k for h in log for k in h if k.startswith("valid_")), None)
        if key:
            curves.add(key.removeprefix("valid_"))
        curve = {h["epoch"]: h[key] for h in log if key and key in h}
        metrics = run_dir.metrics()
        rows.append(
            {
                "probe": name,
                "changed": changed,
                "epochs": len(log),
                # what the run's timing said its budget buys (epochs short-budget tiers)
                "epochs_bought": next(
                    (t.bought for t in cfg.short_budget if t.bought is not None), None
                ),
                "curve": curve,
                "best_valid": max(curve.values()) if curve else None,
                "best_epoch": metrics["best_epoch"] if metrics else None,
                "test": metrics["test"] if metrics else None,
                "valid": metrics.get("valid") if metrics else None,  # chosen state, every protocol
                "seq_per_s": (
                    sum(h["sequences"] for h in log) / max(1e-9, sum(h["epoch_s"] for h in log))
                ),
                "trained_at": metrics["git_commit"] if metrics else None,
                # of the wall-clock budget, the share spent training (the rest: validation)
                "train_min": metrics["train_time_s"] / 60 if metrics else None,
                "wall_min": metrics["wall_time_s"] / 60 if metrics else None,
                "finished": metrics is not None,
                "seed": cfg.train.seed,
                "run_dir": str(run),
            }
        )
    timed = any(r["epochs_bought"] is not None for r in rows)
    followed = " / ".join(
        f"{protocol} {metric.upper()}"
        for protocol, metric in (c.split("_", 1) for c in sorted(curves))
    )
    lines = [
        f"# {args.title}",
        "",
        f"Base: `{' '.join([args.base, *args.set])}`; every probe is the base with the "
        "settings shown changed. "
        f"Validation {followed or 'full NDCG@10'} at epochs {', '.join(map(str, at))} "
        "(0-based); test on the "
        "state chosen on validation (the last state where a probe trained on train+valid: "
        "nothing is validated). seq/s is wall-clock training speed, which other jobs on "
        "the machine slowed for some probes: compare quality, not speed, across rows.",
        "",
        "| probe | changed | epochs"
        + (" | epochs bought (timed)" if timed else "")
        + " | training / wall min | "
        + " | ".join(f"valid @{e}" for e in at)
        + " | best valid | test full NDCG@10 | test pop100 HR@10 | test pop100 NDCG@10 |",
        "|---|---|---|---|" + "---|" * (len(at) + timed) + "---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r['curve'][e]:.4f}" if e in r["curve"] else "" for e in at]
        t = r["test"]
        test = (
            [
                f"{t['full']['ndcg@10']:.4f}",
                f"{t['pop100']['hr@10']:.4f}",
                f"{t['pop100']['ndcg@10']:.4f}",
            ]
            if t
            else ["(stopped)", "", ""]
        )
        best = f"{r['best_valid']:.4f}" if r["best_valid"] is not None else ""
        minutes = f"{r['train_min']:.1f} / {r['wall_min']:.1f}" if r["finished"] else ""
        lines.append(
            f"| {r['probe']} | {', '.join(r['changed']) or '(the base)'} | {r['epochs']} | "
            + (
                f"{r['epochs_bought'] if r['epochs_bought'] is not None else ''} | "
                if timed
                else ""
            )
            + f"{minutes} | "
            + " | ".join(cells)
            + f" | {best} | "
            + " | ".join(test)
            + " |"
        )
    seeds = {
        "train": sorted({r["seed"] for r in rows})[0] if rows else None,
        "candidates": base.eval.negative_seed,
    }
    finished = [Path(r["run_dir"]) for r in rows if r["finished"]]
    write_results(
        args.name,
        {"base": args.base, "base_set": args.set, "probes": rows},
        "\n".join(lines),
        seeds=seeds,
        runs=finished,
        area=args.area,
    )
    print("\n".join(lines))
