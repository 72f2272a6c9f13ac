"""The named recipes for any log (`sasrec-ce`, `bert4rec`, `gru4rec-plus`) on three logs of
different shapes, each at the same time budget, beside POP: which to start with.

    python benchmarks/recipes.py [--data-dir DIR] [--runs-dir DIR] [--budget 5m]
        [--recipe sasrec-ce ...] [--log ml-1m|beauty|synthetic ...] [--name recipes]

The logs: the papers' ML-1M (6,040 users, 3,416 items, long histories), the papers' Beauty
(40,226 users, 54,542 items, short histories) and a synthetic long-tail log with string ids and
custom column names (written as a CSV under the runs directory: 20,000 users, 30,000 items,
Zipf popularity, histories of 3 to 60 items, half of the next items predictable). Each recipe
fits its sizes to each log when the run starts (`adapt`); the results record what it chose. A
finished run in RUNS_DIR/recipes-<log>-<recipe> is reported as it was trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import polars as pl

from _common import paper_beauty, paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import prepare
from seqrec.data.synthetic import synthetic_interactions
from seqrec.models.baselines.pop import Popularity
from seqrec.rundir import RunDir

RECIPES = ("sasrec-ce", "bert4rec", "gru4rec-plus")
LOGS = ("ml-1m", "beauty", "synthetic")
SYNTHETIC = {"n_users": 20_000, "n_items": 30_000, "min_len": 3, "max_len": 60, "p_next": 0.5}


def synthetic_log(folder: Path) -> Path:
    """A long-tail log with string ids and its own column names (seed 0), as a CSV."""
    path = folder / "synthetic-longtail.csv"
    if not path.exists():
        df = synthetic_interactions(**SYNTHETIC, seed=0)  # type: ignore[arg-type]
        folder.mkdir(parents=True, exist_ok=True)
        df.select(
            pl.format("user_{}", pl.col("user")).alias("user_id"),
            pl.format("sku-{}", pl.col("item")).alias("sku"),
            pl.col("timestamp").alias("ts"),
        ).write_csv(path)
    return path


def source(log: str, args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The log's file and the data settings it is read with."""
    if log == "ml-1m":
        return paper_ml1m(args.data_dir), []
    if log == "beauty":
        return paper_beauty(args.data_dir), []
    sets = ['data.user_col="user_id"', 'data.item_col="sku"', 'data.time_col="ts"']
    return synthetic_log(runs_dir(args.runs_dir) / "data"), sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--budget", default="5m")
    ap.add_argument("--recipe", action="append", choices=RECIPES, help="repeatable")
    ap.add_argument("--log", action="append", choices=LOGS, help="repeatable")
    ap.add_argument("--name", default="recipes", help="results file name")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    runs = []
    for log in args.log or LOGS:
        src, sets = source(log, args)
        pop: dict[str, Any] | None = None
        for recipe in args.recipe or RECIPES:
            cfg = load_config(
                RunConfig, recipe, [*sets, f"train.time_budget={json.dumps(args.budget)}"]
            )
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            if pop is None:  # POP on the same prepared data: the bar a model must clear
                report = ds.evaluate(Popularity.fit(ds.split.train), "test")
                pop = report.metrics["full"]
            out = runs_dir(args.runs_dir) / f"recipes-{log}-{recipe}"
            m, _ = train_or_reuse(ds, cfg, out, src)
            runs.append(out)
            trained = RunDir(out, trust=True).config()  # the sizes it fitted, as recorded
            section = next(n for n, s in trained.sections if hasattr(s, "max_len"))
            rows.append(
                {
                    "log": log,
                    "recipe": recipe,
                    "users": ds.n_users,
                    "items": ds.n_items,
                    "max_len": getattr(trained, section).max_len,
                    "batch_size": trained.train.batch_size,
                    "epochs": m["epochs"],
                    "seq_per_s": m["seq_per_s"],
                    "train_time_s": m["train_time_s"],
                    "test": m["test"]["full"],
                    "pop": pop,
                    "above_pop": m["test"]["full"]["ndcg@10"] > pop["ndcg@10"],
                }
            )
            print(json.dumps(rows[-1]["test"]), log, recipe, flush=True)
    md = _markdown(rows, args.budget)
    payload = {
        "protocol": "leave-one-out test split, full ranking, state chosen on validation full "
        "NDCG@10",
        "budget": args.budget,
        "synthetic": SYNTHETIC,
        "data": {log: str(source(log, args)[0].name) for log in args.log or LOGS},
        "rows": rows,
        "best": _best(rows),
    }
    paths = write_results(args.name, payload, md, seeds={"train": 0, "synthetic_log": 0}, runs=runs)
    print(md)
    print("wrote", *paths)


def _best(rows: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for log in dict.fromkeys(r["log"] for r in rows):
        mine = [r for r in rows if r["log"] == log]
        out[log] = max(mine, key=lambda r: r["test"]["ndcg@10"])["recipe"]
    return out


def _markdown(rows: list[dict[str, Any]], budget: str) -> str:
    lines = [
        f"# The recipes for any log, {budget} each",
        "",
        "Test split, full ranking (every item a candidate), the state chosen on validation; "
        "POP on the same data beside each log.",
        "",
        "| log | users | items | recipe | max_len | batch | epochs | seq/s | HR@10 | NDCG@10 "
        "| POP NDCG@10 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["test"]
        lines.append(
            f"| {r['log']} | {r['users']:,} | {r['items']:,} | {r['recipe']} | {r['max_len']} "
            f"| {r['batch_size']} | {r['epochs']} | {r['seq_per_s']:.0f} | {t['hr@10']:.4f} "
            f"| {t['ndcg@10']:.4f} | {r['pop']['ndcg@10']:.4f} |"
        )
    best = _best(rows)
    lines += ["", "Best per log: " + "; ".join(f"{k}: {v}" for k, v in best.items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
