"""Time to quality on the papers' ML-1M file: each model's shipped config trained under a series
of wall-clock budgets (its learning-rate schedule adapts to the budget), and the test full NDCG@10
of the state chosen on validation at each budget, as a curve (PNG) and a table; several seeds at
chosen budgets give a mean and standard deviation.

    python benchmarks/speed.py time-to-quality [--data-dir DIR]
        [--model bert4rec:ml-1m-bert4rec[:5,10,15] ...] [--budgets 5,10,15,30,60,90]
        [--seeds bert4rec:15:0,1,2 ...] [--set KEY=VALUE ...] [--runs-dir DIR]
        [--name time_to_quality]

A model's own budget list (minutes) may follow its config; else --budgets. Seed 0 runs at every
budget; --seeds adds training seeds for one model at one budget.

Every point is a run directory (`ttq-<config>-<budget>m-s<seed>`): finished points are reused
after checking their config, an interrupted one resumes, and the results file is rewritten after
each point, so a sweep stopped at any point keeps what it has. Needs matplotlib (`bench` extra).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from _common import paper_ml1m, results_stem, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare

DEFAULT_MODELS = ("bert4rec:ml-1m-bert4rec", "sasrec:ml-1m-sasrec-ce")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        budgets = sorted({r["budget_min"] for r in mine})
        means = [
            statistics.mean(r["test_full_ndcg@10"] for r in mine if r["budget_min"] == b)
            for b in budgets
        ]
        line = ax.plot(budgets, means, marker="o", label=label)[0]
        for r in mine:  # every seed as a dot
            ax.plot(r["budget_min"], r["test_full_ndcg@10"], ".", color=line.get_color())
    ax.set_xlabel("training budget (minutes of wall clock, validation included)")
    ax.set_ylabel("test NDCG@10, full ranking")
    ax.set_title("ML-1M: the best model each budget buys on this machine")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)  # never a half-written figure


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--model", action="append", default=[], metavar="MODEL:CONFIG[:BUDGETS]")
    ap.add_argument("--budgets", default="5,10,15,30,60,90", help="minutes")
    ap.add_argument(
        "--seeds",
        action="append",
        default=[],
        metavar="MODEL:BUDGET:SEED,SEED",
        help="extra training seeds of a model at a budget (seed 0 runs at every budget)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="all runs")
    ap.add_argument("--runs-dir", help="run directories (default: $SEQREC_HOME/runs)")
    ap.add_argument("--name", default="time_to_quality")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    extra: dict[tuple[str, int], list[int]] = {}
    for spec in args.seeds:
        name, b, seed_list = spec.split(":")
        extra[(name, int(b))] = [int(x) for x in seed_list.split(",") if int(x) != 0]
    rows: list[dict[str, Any]] = []
    run_dirs: list[Path] = []
    for spec in args.model or DEFAULT_MODELS:
        model, config, *own = spec.split(":")
        budgets = [int(b) for b in (own[0] if own else args.budgets).split(",")]
        seeds = {b: [0, *extra.get((model, b), [])] for b in budgets}
        for budget in sorted(seeds):
            for seed in seeds[budget]:
                overrides = [f"train.time_budget='{budget}m'", f"train.seed={seed}", *args.set]
                cfg = load_config(RunConfig, config, overrides)
                if cfg.model != model:
                    raise SystemExit(f"{config} trains {cfg.model}, not {model}")
                ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
                out = runs / f"ttq-{config}-{budget}m-s{seed}"
                metrics, log = train_or_reuse(ds, cfg, out, src)
                run_dirs.append(out)
                test = metrics["test"]
                rows.append(
                    {
                        "label": f"{model} ({config})",
                        "config": config,
                        "budget_min": budget,
                        "seed": seed,
                        "candidate_seed": cfg.eval.negative_seed,
                        "overrides": overrides,
                        "test_full_ndcg@10": test["full"]["ndcg@10"],
                        "test_full_hr@10": test["full"]["hr@10"],
                        "test_pop100_ndcg@10": test["pop100"]["ndcg@10"],
                        "test_pop100_hr@10": test["pop100"]["hr@10"],
                        # None for a train+valid run (train.train_on): nothing validated
                        "best_valid_full_ndcg@10": (
                            metrics["valid"]["full"]["ndcg@10"] if "valid" in metrics else None
                        ),
                        "epochs": metrics["epochs"],
                        "best_epoch": metrics["best_epoch"],
                        "train_min": metrics["train_time_s"] / 60,
                        "seq_per_s": metrics["seq_per_s"],
                        "run_dir": str(out),
                    }
                )
                print(
                    f"{config} {budget}m seed {seed}: test full NDCG@10 "
                    f"{test['full']['ndcg@10']:.4f}",
                    flush=True,
                )
                _write(args, rows, run_dirs)


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (model, budget): mean and standard deviation over its seeds."""
    out = []
    for key in dict.fromkeys((r["label"], r["budget_min"]) for r in rows):
        group = [r for r in rows if (r["label"], r["budget_min"]) == key]
        line: dict[str, Any] = {"label": key[0], "budget_min": key[1], "seeds": len(group)}
        for m in ("test_full_ndcg@10", "test_pop100_ndcg@10", "test_pop100_hr@10"):
            values = [r[m] for r in group]
            line[m] = statistics.mean(values)
            line[f"{m}_std"] = statistics.stdev(values) if len(values) > 1 else None
        line["epochs"] = statistics.mean(r["epochs"] for r in group)
        line["seq_per_s"] = statistics.mean(r["seq_per_s"] for r in group)
        out.append(line)
    return out


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], run_dirs: list[Path]) -> None:
    stem = results_stem(args.name)
    png = stem.with_name(stem.name + ".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, png)
    summary = _summary(rows)

    def cell(line: dict[str, Any], m: str) -> str:
        std = line[f"{m}_std"]
        return f"{line[m]:.4f}" + ("" if std is None else f" ± {std:.4f}")

    lines = [
        "# Time to quality, ML-1M (papers' file): test metrics against the training budget",
        "",
        f"![test NDCG@10 against the budget]({png.name})",
        "",
        "| model | budget | seeds | epochs | seq/s | full NDCG@10 | pop100 NDCG@10 "
        "| pop100 HR@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in summary:
        lines.append(
            f"| {line['label']} | {line['budget_min']} min | {line['seeds']} "
            f"| {line['epochs']:.0f} | {line['seq_per_s']:.0f} "
            f"| {cell(line, 'test_full_ndcg@10')} | {cell(line, 'test_pop100_ndcg@10')} "
            f"| {cell(line, 'test_pop100_hr@10')} |"
        )
    lines += [
        "",
        "Mean ± sample standard deviation over the training seeds (the candidates are the same "
        "for every run: the prepared dataset's). Each "
        "run: the shipped config with `train.time_budget` set, the learning-rate schedule fitted "
        "to that budget; the best state chosen on validation full NDCG@10, the test split "
        "evaluated once with it.",
        "",
        "| model | budget | seed | epochs | best epoch | full NDCG@10 | full HR@10 "
        "| pop100 NDCG@10 | pop100 HR@10 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['budget_min']} min | {r['seed']} | {r['epochs']} "
            f"| {r['best_epoch']} | {r['test_full_ndcg@10']:.4f} | {r['test_full_hr@10']:.4f} "
            f"| {r['test_pop100_ndcg@10']:.4f} | {r['test_pop100_hr@10']:.4f} |"
        )
    seeds = {f"train_{Path(r['run_dir']).name}": r["seed"] for r in rows}
    seeds.update({f"candidates_{Path(r['run_dir']).name}": r["candidate_seed"] for r in rows})
    payload = {"runs": rows, "summary": summary, "figure": png.name}
    write_results(args.name, payload, "\n".join(lines), seeds=seeds, runs=run_dirs)
