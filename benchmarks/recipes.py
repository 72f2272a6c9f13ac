"""The recipes for any log (`sasrec-ce`, `bert4rec`, `gru4rec-plus`, and LRURec's defaults
fitted to the data, as `seqrec.Model("lrurec")` trains) on three logs of different shapes, each
capped by the same time budget, beside POP: which to start with. And (`--own-data FILE`) the
README's "Your own data" snippet as written, no budget, on a MovieLens ratings file read as a
user's own log.

    python benchmarks/recipes.py [--data-dir DIR] [--runs-dir DIR] [--budget 5m]
        [--recipe sasrec-ce ...] [--log ml-1m|beauty|synthetic ...] [--name recipes]
    python benchmarks/recipes.py --own-data ratings_PARTIAL_users0001-2999.dat.gz [--name own_data]

The logs: the papers' ML-1M (6,040 users, 3,416 items, long histories), the papers' Beauty
(40,226 users, 54,542 items, short histories) and a synthetic long-tail log with string ids and
custom column names (written as a CSV under the runs directory: 20,000 users, 30,000 items,
Zipf popularity, histories of 3 to 60 items, half of the next items predictable). Each recipe
fits its sizes (and, beyond 32,768 items, its loss) to each log when the run starts (`adapt`);
the results record what it chose, and the epochs the budget was estimated to buy
(`seqrec.training.policy.epochs_bought`, timed before the run) beside the epochs it trained. A
finished run in RUNS_DIR/recipes-<log>-<recipe> is reported as it was trained.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import polars as pl

from _common import (
    paper_beauty,
    paper_ml1m,
    results_stem,
    runs_dir,
    train_or_reuse,
    write_results,
)
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.data.synthetic import synthetic_interactions
from seqrec.evaluation.protocols import evaluate_split
from seqrec.models.baselines.pop import Popularity
from seqrec.training.policy import ANY_LOG_ADAPT, adapt_to_data, epochs_bought
from seqrec.training.rundir import RunDir

RECIPES = ("sasrec-ce", "bert4rec", "gru4rec-plus", "lrurec")
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


def recipe_config(recipe: str, sets: list[str], budget: str) -> RunConfig:
    """A recipe's config for a log: a shipped recipe by name, or ("lrurec") the model's
    defaults with their sizes fitted to the data, as `seqrec.Model("lrurec")` trains."""
    overrides = [*sets, f"train.time_budget={json.dumps(budget)}"]
    if recipe in ("lrurec",):
        return load_config(RunConfig, None, [ANY_LOG_ADAPT, f"model={recipe!r}", *overrides])
    return load_config(RunConfig, recipe, overrides)


def estimate(ds: PreparedDataset, cfg: RunConfig) -> float:
    """The epochs the budget buys by `epochs_bought`'s timing, of the sizes the run fits."""
    fitted, _ = adapt_to_data(cfg, ds.split.training(cfg.train.train_on).lengths, ds.n_items)
    return epochs_bought(ds, fitted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--budget", default="5m")
    ap.add_argument("--recipe", action="append", choices=RECIPES, help="repeatable")
    ap.add_argument("--log", action="append", choices=LOGS, help="repeatable")
    ap.add_argument("--name", help="results file name (default: recipes, or own_data)")
    ap.add_argument("--own-data", metavar="FILE", help="the README snippet on a ratings file")
    args = ap.parse_args()
    if args.own_data:
        own_data(Path(args.own_data), args.name or "own_data")
        return
    rows: list[dict[str, Any]] = []
    runs = []
    # the estimates of runs this table reuses, as an earlier invocation timed them
    earlier = results_stem(args.name or "recipes").with_suffix(".json")
    timed = {
        (r["log"], r["recipe"]): r.get("epochs_estimate")
        for r in (json.loads(earlier.read_text())["rows"] if earlier.exists() else [])
    }
    for log in args.log or LOGS:
        src, sets = source(log, args)
        pop: dict[str, Any] | None = None
        for recipe in args.recipe or RECIPES:
            cfg = recipe_config(recipe, sets, args.budget)
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            if pop is None:  # POP on the same prepared data: the bar a model must clear
                report = evaluate_split(ds, Popularity.fit(ds.split.train), "test")
                pop = report.metrics["full"]
            out = runs_dir(args.runs_dir) / f"recipes-{log}-{recipe}"
            finished = RunDir(out, trust=True).finished
            bought = timed.get((log, recipe)) if finished else estimate(ds, cfg)
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
                    "dropout": getattr(getattr(trained, section), "dropout", None),
                    "batch_size": trained.train.batch_size,
                    "loss": trained.train.loss,
                    "n_negatives": trained.train.n_negatives
                    if trained.train.loss != "ce"
                    else None,
                    "epochs": m["epochs"],
                    "epochs_estimate": bought,
                    "stopped": m["stopped"],
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
        "recipes": list(args.recipe or RECIPES),
        "synthetic": SYNTHETIC,
        "data": {log: str(source(log, args)[0].name) for log in args.log or LOGS},
        "rows": rows,
        "best": _best(rows),
    }
    seeds = {"train": 0, "synthetic_log": 0}
    paths = write_results(args.name or "recipes", payload, md, seeds=seeds, runs=runs)
    print(md)
    print("wrote", *paths)


def own_data(path: Path, name: str) -> None:
    """The README's "Your own data" snippet as written, on a MovieLens `ratings.dat` read into
    a DataFrame as a user's log (user, item, rating, time: the rating unused): fit with no
    budget, the test split under full ranking beside POP's on the same prepared data, and the
    whole call timed (preparation and evaluation included)."""
    import seqrec

    started = time.perf_counter()
    raw = pl.read_csv(path, separator=":", has_header=False)  # "::" -> empty columns between
    df = raw.select(
        pl.col("column_0").alias("user_id"),
        pl.col("column_2").alias("sku"),
        pl.col("column_6").alias("ts"),
    )
    # the snippet
    model = seqrec.SASRec().fit(df, user_col="user_id", item_col="sku", time_col="ts")
    metrics = model.evaluate()  # test split: full, uni100, pop100
    wall = time.perf_counter() - started
    ds = model.dataset_
    pop = evaluate_split(ds, Popularity.fit(ds.split.train), "test").metrics
    m = model.metrics_ or {}
    cfg = RunDir(model.run_dir_).config()
    section = next(s for n, s in cfg.sections if hasattr(s, "max_len"))
    ratio = metrics["full"]["ndcg@10"] / pop["full"]["ndcg@10"]
    payload = {
        "protocol": "leave-one-out test split (full, uni100, pop100), the state chosen on "
        "validation full NDCG@10; the log kept whole (no k-core)",
        "data": path.name,
        "snippet": 'seqrec.SASRec().fit(df, user_col="user_id", item_col="sku", time_col="ts")',
        "users": ds.n_users,
        "items": ds.n_items,
        "actions": ds.stats["actions"],
        "max_len": section.max_len,
        "batch_size": cfg.train.batch_size,
        "epochs": m.get("epochs"),
        "best_epoch": m.get("best_epoch"),
        "stopped": m.get("stopped"),
        "lr_reductions": m.get("lr_reductions"),
        "steps_set_by": m.get("steps_set_by"),
        "wall_s": round(wall, 1),
        "train_time_s": m.get("train_time_s"),
        "seq_per_s": m.get("seq_per_s"),
        "test": metrics,
        "pop": pop,
        "ratio_to_pop": ratio,
        "config": cfg.to_dict(),
    }
    md = "\n".join(
        [
            "# The README's own-data snippet, no budget",
            "",
            f"`{payload['snippet']}` on `{path.name}` ({ds.n_users:,} users, {ds.n_items:,} "
            f"items, {ds.stats['actions']:,} interactions, kept whole).",
            "",
            "| | full NDCG@10 | full HR@10 | pop100 NDCG@10 |",
            "|---|---|---|---|",
            f"| SASRec (sasrec-ce) | {metrics['full']['ndcg@10']:.4f} | "
            f"{metrics['full']['hr@10']:.4f} | {metrics['pop100']['ndcg@10']:.4f} |",
            f"| POP | {pop['full']['ndcg@10']:.4f} | {pop['full']['hr@10']:.4f} | "
            f"{pop['pop100']['ndcg@10']:.4f} |",
            "",
            f"{m.get('epochs')} epochs ({m.get('stopped')}, the state of epoch "
            f"{m.get('best_epoch')}), the rate halved after epochs {m.get('lr_reductions')}; "
            f"the whole snippet took {wall / 60:.1f} minutes (training "
            f"{float(m.get('train_time_s') or 0) / 60:.1f}); {ratio:.1f} x POP's full NDCG@10.",
        ]
    )
    paths = write_results(name, payload, md, seeds={"train": 0}, runs=[model.run_dir_])
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
        "| log | users | items | recipe | max_len | dropout | batch | loss | epochs (estimated) "
        "| stopped | seq/s | HR@10 | NDCG@10 | POP NDCG@10 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["test"]
        loss = r.get("loss", "")
        if r.get("n_negatives"):
            loss = f"{loss} ({r['n_negatives']:,})"
        est = r.get("epochs_estimate")
        epochs = f"{r['epochs']}" + (f" ({est:.1f})" if est is not None else "")
        lines.append(
            f"| {r['log']} | {r['users']:,} | {r['items']:,} | {r['recipe']} | {r['max_len']} "
            f"| {r.get('dropout', '')} | {r['batch_size']} | {loss} | {epochs} "
            f"| {r.get('stopped', '')} "
            f"| {r['seq_per_s']:.0f} | {t['hr@10']:.4f} | {t['ndcg@10']:.4f} "
            f"| {r['pop']['ndcg@10']:.4f} |"
        )
    best = _best(rows)
    lines += ["", "Best per log: " + "; ".join(f"{k}: {v}" for k, v in best.items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
