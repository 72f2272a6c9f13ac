"""Sparse logs to fit the defaults on (short histories over tens of thousands of items: the shape
of most shops' logs), and each estimator's defaults, or a probe of them, fitted on one of them as
a user would: `seqrec.SASRec()`, `seqrec.BERT4Rec()` or `seqrec.Model(name)`, then
`.fit(df, user_col=..., item_col=..., time_col=None)`, no budget.

    python benchmarks/sparse_logs.py make LOG [--data-dir DIR] [--out FILE]
    python benchmarks/sparse_logs.py fit LOG --model bert4rec [--set KEY=VALUE ...]
        [--seed 0] [--data-dir DIR] [--runs-dir DIR] [--name NAME]
    python benchmarks/sparse_logs.py table RUN_DIR ... --name NAME [--note TEXT]

The logs (each a CSV `user,item`, rows in each user's time order), built from the files under
the real-data folder (--data-dir, else $SEQREC_DATA_DIR):

- `beauty`: the BERT4Rec authors' Beauty file, whole (40,226 users, 54,542 items);
- `beauty-3core`: the same with users and items of at least 3 interactions, iterated until
  both hold (39,758 users, 28,975 items, 8.0 items a user);
- `beauty-5core`: likewise at 5 (22,363 users, 12,101 items);
- `ml1m-short`: the papers' ML-1M file with each user's history cut to their last 5 to 15 items
  (the cut drawn per user, seed 0): ML-1M's items and users, a shop's history lengths.

`fit` writes benchmarks/results/recipes/<NAME>.{json,md}: the estimator's resolved config, the
epochs it trained, its best epoch, why it stopped, the wall time and test full NDCG@10 / HR@10
(leave-one-out, every user), beside POP on the same split. `--set` takes the estimator's
parameters by name (`mask_prob=0.6`) to probe a rule before it becomes a default. `table`
puts finished runs side by side (their settings, validation by epoch, test) in one results file
that records each run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from _common import data_dir, paper_beauty, paper_ml1m, runs_dir, write_results

LOGS = ("beauty", "beauty-3core", "beauty-5core", "ml1m-short")


def read_pairs(path: Path) -> pl.DataFrame:
    """A papers' `user item` file as a frame (user, item), file order kept."""
    return pl.read_csv(
        path, separator=" ", has_header=False, new_columns=["user", "item"]
    ).with_columns(pl.col("user").cast(pl.Int64), pl.col("item").cast(pl.Int64))


def core(df: pl.DataFrame, k: int) -> pl.DataFrame:
    """Users and items with at least `k` interactions each, filtered again until both hold;
    each user's order kept."""
    while True:
        items = df.group_by("item").len().filter(pl.col("len") >= k).get_column("item")
        users = df.group_by("user").len().filter(pl.col("len") >= k).get_column("user")
        kept = df.filter(
            pl.col("item").is_in(items.implode()) & pl.col("user").is_in(users.implode())
        )
        if kept.height == df.height:
            return kept
        df = kept


def short_histories(df: pl.DataFrame, lo: int = 5, hi: int = 15, seed: int = 0) -> pl.DataFrame:
    """Each user's last n items, n drawn uniformly in lo..hi per user (seed): long histories
    cut to a shop's lengths, the most recent kept."""
    users = df.get_column("user").unique(maintain_order=True)
    rng = np.random.default_rng(seed)
    keep = pl.DataFrame({"user": users, "keep": rng.integers(lo, hi + 1, len(users))})
    ranked = df.with_columns(pl.int_range(pl.len()).reverse().over("user").alias("back"))
    return (
        ranked.join(keep, on="user", maintain_order="left")
        .filter(pl.col("back") < pl.col("keep"))
        .select("user", "item")
    )


def build(log: str, folder: Path) -> pl.DataFrame:
    if log == "ml1m-short":
        return short_histories(read_pairs(paper_ml1m(str(folder))))
    df = read_pairs(paper_beauty(str(folder)))
    if log == "beauty":
        return df
    return core(df, 3 if log == "beauty-3core" else 5)


def stats(df: pl.DataFrame) -> dict[str, Any]:
    users = df.get_column("user").n_unique()
    return {
        "users": users,
        "items": df.get_column("item").n_unique(),
        "interactions": df.height,
        "items_per_user": round(df.height / users, 2),
    }


def cmd_make(args: argparse.Namespace) -> None:
    df = build(args.log, data_dir(args.data_dir))
    out = Path(args.out or f"{args.log}.csv")
    df.write_csv(out)
    print(f"{out}: {stats(df)}")


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def cmd_fit(args: argparse.Namespace) -> None:
    import seqrec
    from seqrec.evaluation.protocols import evaluate_split
    from seqrec.models.baselines.pop import Popularity
    from seqrec.training.rundir import RunDir

    df = build(args.log, data_dir(args.data_dir))
    params = dict(kv.split("=", 1) for kv in args.set)
    kwargs = {k: _value(v) for k, v in params.items()}
    # the estimator a user writes: seqrec.SASRec(), seqrec.BERT4Rec() (their recipes), else
    # seqrec.Model(name) (the model's defaults)
    cls = {"sasrec": seqrec.SASRec, "bert4rec": seqrec.BERT4Rec}.get(args.model)
    est = (
        cls(**kwargs, seed=args.seed) if cls else seqrec.Model(args.model, **kwargs, seed=args.seed)
    )
    runs = runs_dir(args.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    name = (
        args.name
        or f"sparse-{args.log}-{args.model}"
        + "".join(f"-{k}{v}" for k, v in params.items())
        + f"-s{args.seed}"
    )
    out = Path(tempfile.mkdtemp(prefix=name + "-", dir=runs)) / "run"
    start = time.perf_counter()
    est.fit(df, user_col="user", item_col="item", time_col=None, out=out)
    wall = time.perf_counter() - start
    run = RunDir(out)
    metrics = run.metrics() or {}
    ds = est.dataset_
    pop = evaluate_split(ds, Popularity.fit(ds.split.train), "test", protocols=["full"]).metrics
    test = metrics.get("test", {}).get("full", {})
    log = run.log()
    row = {
        "log": args.log,
        "log_stats": stats(df),
        "model": args.model,
        "params": params,
        "seed": args.seed,
        "epochs": len(log),
        "best_epoch": metrics.get("best_epoch"),
        "stopped": metrics.get("stopped"),
        "wall_s": round(wall, 1),
        "valid_full_ndcg@10": metrics.get("valid", {}).get("full", {}).get("ndcg@10"),
        "test_full_ndcg@10": test.get("ndcg@10"),
        "test_full_hr@10": test.get("hr@10"),
        "pop_test_full_ndcg@10": pop["full"]["ndcg@10"],
        "config": run.config_dict(),
        "val_by_epoch": [r.get("val") for r in log],
        "loss_by_epoch": [r.get("loss") for r in log],
    }
    md = (
        f"# {name}\n\n| log | model | params | seed | epochs | best | stopped | wall s | "
        "test full NDCG@10 | HR@10 | POP NDCG@10 |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {args.log} | {args.model} | {params or 'defaults'} | {args.seed} | {row['epochs']} | "
        f"{row['best_epoch']} | {row['stopped']} | {row['wall_s']} | "
        f"{_fmt(row['test_full_ndcg@10'])} | {_fmt(row['test_full_hr@10'])} | "
        f"{_fmt(row['pop_test_full_ndcg@10'])} |\n"
    )
    write_results(name, row, md, seeds={"train": args.seed}, runs=[out], area="recipes")
    print(md)


# the settings a probe table shows for each run (section, key)
SHOWN = (
    ("train", "batch_size"),
    ("train", "lr"),
    ("cloze", "mask_prob"),
    ("cloze", "last_item_ratio"),
    ("bert4rec", "d_model"),
    ("bert4rec", "dropout"),
)


def cmd_table(args: argparse.Namespace) -> None:
    """Finished runs side by side: their settings, validation by epoch, test, and POP on the
    same split."""
    from seqrec.data.prepared import load_prepared
    from seqrec.evaluation.protocols import evaluate_split
    from seqrec.models.baselines.pop import Popularity
    from seqrec.training.rundir import RunDir

    rows, pops = [], {}
    for path in map(Path, args.runs):
        run = RunDir(path)
        cfg, metrics, log = run.config_dict(), run.metrics() or {}, run.log()
        prepared = str(run.source().get("prepared"))
        if prepared not in pops:  # POP on the same split, once a prepared log
            ds = load_prepared(prepared)
            pop = evaluate_split(ds, Popularity.fit(ds.split.train), "test", protocols=["full"])
            pops[prepared] = pop.metrics["full"]["ndcg@10"]
        key = f"valid_{cfg['train']['val_protocol']}_{cfg['train']['val_metric']}"
        rows.append(
            {
                "run": path.parent.name.rsplit("-", 1)[0],
                "settings": {f"{sec}.{k}": cfg.get(sec, {}).get(k) for sec, k in SHOWN},
                "epochs": len(log),
                "best_epoch": metrics.get("best_epoch"),
                "stopped": metrics.get("stopped"),
                "wall_min": round(float(metrics.get("wall_time_s", 0.0)) / 60, 1),
                "val_by_epoch": [r.get(key) for r in log],
                "loss_by_epoch": [round(r["loss"], 3) for r in log],
                "valid_full_ndcg@10": metrics.get("valid", {}).get("full", {}).get("ndcg@10"),
                "test_full_ndcg@10": metrics.get("test", {}).get("full", {}).get("ndcg@10"),
                "pop_test_full_ndcg@10": pops[prepared],
            }
        )
    head = [f"{sec}.{k}" for sec, k in SHOWN]
    columns = [*head, "epochs", "best", "stopped", "minutes", "loss (last)", "valid by epoch"]
    md = [f"# {args.name}\n", f"{args.note}\n" if args.note else ""]
    md += ["| run | " + " | ".join([*columns, "test full NDCG@10", "POP"]) + " |"]
    md += ["|---" * (len(columns) + 3) + "|"]
    for r in rows:
        vals = ", ".join(f"{v:.4f}" for v in r["val_by_epoch"] if v is not None)
        cells = [str(r["settings"][k]) for k in head]
        cells += [str(r[k]) for k in ("epochs", "best_epoch", "stopped", "wall_min")]
        cells += [str(r["loss_by_epoch"][-1] if r["loss_by_epoch"] else "-"), vals]
        cells += [_fmt(r["test_full_ndcg@10"]), _fmt(r["pop_test_full_ndcg@10"])]
        md.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    text = "\n".join(md) + "\n"
    runs = [Path(p) for p in args.runs]
    write_results(args.name, {"runs": rows}, text, seeds={"train": 0}, runs=runs, area="recipes")
    print(text)


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make", help="write a sparse log as a CSV")
    p.add_argument("log", choices=LOGS)
    p.add_argument("--data-dir")
    p.add_argument("--out")
    p.set_defaults(func=cmd_make)
    p = sub.add_parser("fit", help="fit an estimator's defaults (or a probe) on a sparse log")
    p.add_argument("log", choices=LOGS)
    p.add_argument("--model", default="sasrec")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir")
    p.add_argument("--runs-dir")
    p.add_argument("--name")
    p.set_defaults(func=cmd_fit)
    p = sub.add_parser("table", help="finished probe runs side by side, as a results file")
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--name", required=True)
    p.add_argument("--note", default="", help="a line under the title: what was probed")
    p.set_defaults(func=cmd_table)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
