"""Time to quality on the papers' ML-1M file: train each model with its shipped config under a
wall-clock budget, validating every epoch, and report the validation full-ranking NDCG@10
against wall-clock time (a PNG, one curve per model) and the test NDCG@10 of the state chosen
on validation, beside the target of each model.

    python benchmarks/time_to_quality.py [--data-dir DIR]
        [--run MODEL:CONFIG:BUDGET:TARGET ...] [--set KEY=VALUE ...] [--runs-dir DIR]
        [--name time_to_quality]

Default runs: BERT4Rec (ml-1m-bert4rec, 15 minutes, target 0.152) and SASRec+CE
(ml-1m-sasrec-ce, 10 minutes, target 0.18). Needs the `bench` extra (matplotlib) for the PNG.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import RESULTS, paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import prepare

DEFAULT_RUNS = ("bert4rec:ml-1m-bert4rec:15m:0.152", "sasrec:ml-1m-sasrec-ce:10m:0.18")


Curves = dict[str, list[tuple[float, float]]]  # label -> (seconds, validation NDCG@10)


def plot(curves: Curves, targets: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for (label, points), color in zip(curves.items(), colors, strict=False):
        minutes = [t / 60 for t, _ in points]
        ax.plot(minutes, [v for _, v in points], marker=".", color=color, label=label)
        ax.axhline(targets[label], color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("wall-clock training time (minutes, validation included)")
    ax.set_ylabel("validation NDCG@10, full ranking")
    ax.set_title("ML-1M: time to quality on this machine (dotted: targets, on test)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)  # never a half-written figure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--run", action="append", default=[], metavar="MODEL:CONFIG:BUDGET:TARGET")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="all runs")
    ap.add_argument("--runs-dir", help="run directories (default: $SEQREC_HOME/runs)")
    ap.add_argument("--name", default="time_to_quality")
    args = ap.parse_args()
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    results: list[dict[str, Any]] = []
    curves: Curves = {}
    targets: dict[str, float] = {}
    for spec in args.run or DEFAULT_RUNS:
        model, config, budget, target = spec.split(":")
        overrides = [
            f"train.time_budget={budget}",
            "train.eval_every=1",
            "train.patience=0",
            *args.set,
        ]
        cfg = load_config(RunConfig, config, overrides)
        if cfg.model != model:
            raise SystemExit(f"{config} trains {cfg.model}, not {model}")
        ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        out = runs / f"{args.name}-{config}"
        metrics, log = train_or_reuse(ds, cfg, out, src)
        key = "valid_full_ndcg@10"
        curve = [(h["elapsed_s"], h[key]) for h in log if key in h]
        label = f"{model} ({config})"
        curves[label], targets[label] = curve, float(target)
        test = metrics["test"]["full"]["ndcg@10"]
        first = next((t for t, v in curve if v >= float(target)), None)
        results.append(
            {
                "model": model,
                "config": config,
                "overrides": overrides,
                "budget": budget,
                "target_test_full_ndcg@10": float(target),
                "test_full_ndcg@10": test,
                "reached": test >= float(target),
                "best_valid_full_ndcg@10": max(v for _, v in curve),
                "first_valid_at_target_s": first,
                "epochs": len(log),
                "seq_per_s": metrics.get("seq_per_s"),
                "curve": curve,
                "run_dir": str(out),
            }
        )
        print(f"{label}: test full NDCG@10 {test:.4f} (target {target})", flush=True)
    png = RESULTS / f"{args.name}.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(curves, targets, png)
    lines = [
        "# Time to quality, ML-1M (papers' file), full ranking",
        "",
        f"![validation NDCG@10 against time]({png.name})",
        "",
        "| model | config | budget | epochs | seq/s | best valid NDCG@10 | test NDCG@10 | target "
        "| reached |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = f"{r['seq_per_s']:.0f}" if r["seq_per_s"] else "-"
        lines.append(
            f"| {r['model']} | {r['config']} | {r['budget']} | {r['epochs']} | {rate} "
            f"| {r['best_valid_full_ndcg@10']:.4f} | {r['test_full_ndcg@10']:.4f} "
            f"| {r['target_test_full_ndcg@10']} | {'yes' if r['reached'] else 'no'} |"
        )
    lines += [
        "",
        "Validation every epoch, inside the budget; the test split is evaluated once, with the "
        "state chosen on validation.",
    ]
    write_results(args.name, {"runs": results, "figure": png.name}, "\n".join(lines))


if __name__ == "__main__":
    main()
