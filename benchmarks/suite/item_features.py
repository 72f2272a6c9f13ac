"""Item features measured: warm quality with and without them on ML-1M, the cold-item protocol
(seqrec.experiments.cold_items) on ML-1M and on a synthetic log whose items' behaviour is
planted in their features.

    python benchmarks/analyses.py item-features warm [--seeds 0,1,2] [--epochs 20]
        [--id-dropout 0.0] [--data-dir DIR] [--runs-dir DIR] [--name NAME]
    python benchmarks/analyses.py item-features cold [--seed 0] [--share 0.1] [--epochs 20]
        [--id-dropout 0.5] [--recipe ml-1m-sasrec-ce] [--data-dir DIR] [--runs-dir DIR]
        [--name NAME]
    python benchmarks/analyses.py item-features planted [--seed 0] [--name NAME]
    python benchmarks/analyses.py item-features speed [--recipes ml-1m-sasrec-ce,...]
        [--repeats 3] [--name NAME]
    python benchmarks/analyses.py item-features models [--recipes ...]   # the cold files, one table

ML-1M is the papers' file (bert4rec-paper/ml-1m.txt.gz) joined to ml-1m/movies.dat through
ml-1m.item-map.txt: genres (categories), year (a number, from the title) and the title's text.
The recipe is ml-1m-sasrec-ce with a fixed number of epochs in place of its 10-minute budget
(the learning rate decays to 0 at the last epoch, as the budget's decay does), so that the
compared runs get the same training whatever the machine's load. The items table is written to
the runs folder (derived from the licensed files, it stays outside the project).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from _common import data_dir, paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import ItemsConfig, RunConfig, load_config
from seqrec.data.items_table import Feature, read_items_table
from seqrec.data.prepare import prepare
from seqrec.experiments.cold_items import (
    category_popularity_scorer,
    content_scorer,
    hold_out_items,
    rank_targets,
)
from seqrec.serving.recommender import Recommender

ML1M_FEATURES = ("genres:categories", "year:number", "title:text")
DEFAULT_RECIPE = "ml-1m-sasrec-ce"
SPEED_RECIPES = "ml-1m-sasrec-ce,ml-1m-bert4rec,ml-1m-lrurec,ml-1m-gru4rec-plus"


def ml1m_items(root: Path, out: Path) -> Path:
    """The papers' ML-1M items with movies.dat's genres, year and title, as a Parquet file."""
    path = out / "ml-1m-paper-items.parquet"
    if path.exists():
        return path
    movies, _ = read_items_table(
        root / "ml-1m" / "movies.dat", features=[Feature("title"), Feature("genres")]
    )
    pairs = (root / "bert4rec-paper" / "ml-1m.item-map.txt").read_text().split()
    mapping = pl.DataFrame(
        {"item": [int(p) for p in pairs[0::2]], "movie": [int(m) for m in pairs[1::2]]}
    )
    year = re.compile(r"\s*\((\d{4})\)\s*$")
    table = mapping.join(movies.rename({"item": "movie"}), on="movie", how="left").with_columns(
        pl.col("title").map_elements(lambda t: year.sub("", t), return_dtype=pl.String),
        pl.col("title").str.extract(r"\((\d{4})\)\s*$").cast(pl.Int64).alias("year"),
    )
    if table.get_column("title").null_count():
        raise SystemExit(f"{root}: items of the item map missing from movies.dat")
    out.mkdir(parents=True, exist_ok=True)
    table.select("item", "genres", "year", "title").write_parquet(path)
    return path


def recipe(
    seed: int,
    epochs: int,
    items: ItemsConfig | None,
    sets: list[str],
    name: str = "ml-1m-sasrec-ce",
) -> RunConfig:
    """The recipe `name` for `epochs` epochs (no budget), with `items` when given."""
    cfg = load_config(RunConfig, name, [f"train.seed={seed}", *sets])
    train = dataclasses.replace(cfg.train, time_budget=None, decay="epochs", max_epochs=epochs)
    return dataclasses.replace(cfg, train=train, items=items or ItemsConfig())


def warm(args: argparse.Namespace) -> None:
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    table = ml1m_items(data_dir(args.data_dir), runs)
    feats = ItemsConfig(str(table), features=ML1M_FEATURES, id_dropout=args.id_dropout)
    rows: list[dict[str, Any]] = []
    dirs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for variant, items in (("ids", None), ("features", feats)):
            cfg = recipe(seed, args.epochs, items, args.set)
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            tag = f"d{args.id_dropout:g}" if items else "ids"
            out = runs / f"features-warm-{tag}-e{args.epochs}-s{seed}"
            metrics, _ = train_or_reuse(ds, cfg, out, src)
            dirs.append(out)
            test = metrics["test"]["full"]
            rows.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "ndcg@10": test["ndcg@10"],
                    "hr@10": test["hr@10"],
                    "valid_ndcg@10": metrics["valid"]["full"]["ndcg@10"],
                    "seq_per_s": metrics["seq_per_s"],
                    "run": str(out),
                }
            )
            print(f"{variant} seed {seed}: test full NDCG@10 {test['ndcg@10']:.4f}", flush=True)
    summary = {}
    for variant in ("ids", "features"):
        values = [r["ndcg@10"] for r in rows if r["variant"] == variant]
        summary[variant] = {
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        }
    gap = summary["features"]["mean"] - summary["ids"]["mean"]
    lines = [
        f"# Item features on ML-1M, warm items: sasrec-ce for {args.epochs} epochs",
        "",
        "Test full NDCG@10 on the papers' ML-1M file (leave-one-out, every user, the state chosen",
        f"on validation). Features: {', '.join(ML1M_FEATURES)}; id dropout {args.id_dropout:g}.",
        "",
        "| variant | seed | test NDCG@10 | test HR@10 | valid NDCG@10 | seq/s |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['variant']} | {r['seed']} | {r['ndcg@10']:.4f} | {r['hr@10']:.4f} | "
            f"{r['valid_ndcg@10']:.4f} | {r['seq_per_s']:.0f} |"
            for r in rows
        ),
        "",
        f"Mean: ids {summary['ids']['mean']:.4f} ± {summary['ids']['std']:.4f}, features "
        f"{summary['features']['mean']:.4f} ± {summary['features']['std']:.4f} "
        f"(features − ids: {gap:+.4f}).",
    ]
    payload = {
        "rows": rows,
        "summary": summary,
        "gap": gap,
        "epochs": args.epochs,
        "id_dropout": args.id_dropout,
        "features": list(ML1M_FEATURES),
    }
    seeds = {"train": None, "candidates": 42}
    json_path, md_path = write_results(
        args.name or f"ml1m_warm_d{args.id_dropout:g}",
        payload,
        "\n".join(lines) + "\n",
        seeds=seeds,
        runs=dirs,
    )
    print("\n".join(lines), f"\n-> {md_path}", sep="\n")


def cold_report(rec: Recommender, split: Any, popularity: np.ndarray) -> dict[str, Any]:
    """The cold-item protocol for the model and the baselines over `rec`'s catalogue."""
    assert rec.run.items is not None
    features = rec.run.items[1]
    return {
        "model": rank_targets(split, rec.items, rec.scores),
        "content": rank_targets(split, rec.items, content_scorer(features)),
        "category_popularity": rank_targets(
            split, rec.items, category_popularity_scorer(features, popularity)
        ),
    }


def _cold_table(report: dict[str, Any], id_only: dict[str, Any] | None) -> list[str]:
    lines = [
        "| scorer | cold HR@10 (whole catalogue) | cold NDCG@10 | cold HR@10 (among cold) | "
        "warm HR@10 | warm NDCG@10 |",
        "|---|---|---|---|---|---|",
    ]
    rows = dict(report)
    if id_only is not None:
        rows["id-only model"] = id_only
    for scorer, r in rows.items():
        lines.append(
            f"| {scorer} | {r['cold']['hr@10']:.4f} | {r['cold']['ndcg@10']:.4f} | "
            f"{r['cold_among_cold']['hr@10']:.4f} | {r['warm']['hr@10']:.4f} | "
            f"{r['warm']['ndcg@10']:.4f} |"
        )
    first = next(iter(report.values()))
    lines.append(
        f"| random (expected) | {first['cold']['random_hr@10']:.4f} | | "
        f"{first['cold_among_cold']['random_hr@10']:.4f} | | |"
    )
    return lines


def cold(args: argparse.Namespace) -> None:
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    table_path = ml1m_items(data_dir(args.data_dir), runs)
    base = recipe(args.seed, args.epochs, None, args.set, args.recipe)
    model_name = args.recipe.removeprefix("ml-1m-")
    prefix = "" if args.recipe == DEFAULT_RECIPE else f"{model_name}-"
    ds = prepare(src, data_cfg=base.data, eval_cfg=base.eval, progress=False)
    split = hold_out_items(ds, args.share, args.seed)
    # every warm item and user is kept as it is: no k-core on the log without the cold items
    data_cfg = dataclasses.replace(
        base.data, min_user_interactions=1, min_item_interactions=1, time_col=None
    )
    base = dataclasses.replace(base, data=data_cfg)
    train_ds = prepare(
        split.log,
        data_cfg=data_cfg,
        eval_cfg=base.eval,
        time_col=None,
        name=f"ml-1m-cold{args.share:g}-s{args.seed}",
        progress=False,
    )
    table = pl.read_parquet(table_path)
    cold_rows = table.filter(pl.col("item").is_in(split.cold))
    feats = ItemsConfig(str(table_path), features=ML1M_FEATURES, id_dropout=args.id_dropout)
    reports: dict[str, Any] = {}
    dirs = []
    variants = (("features", feats), ("ids", None))[: 1 if args.no_id_only else 2]
    for variant, items in variants:
        cfg = dataclasses.replace(base, items=items or ItemsConfig())
        tag = f"d{args.id_dropout:g}" if items else "ids"
        out = runs / f"features-cold{args.share:g}-{prefix}{tag}-e{args.epochs}-s{args.seed}"
        metrics, _ = train_or_reuse(train_ds, cfg, out, src)
        dirs.append(out)
        if items is not None:
            for k in (int(n) for n in args.neighbours.split(",")):
                rec = Recommender.from_run(out, trust=True)
                popularity = np.concatenate([rec.popularity, np.zeros(len(split.cold), np.float32)])
                rec.add_items(cold_rows, save=False, neighbours=k)
                reports[f"features-k{k}"] = cold_report(rec, split, popularity)
        else:  # it cannot score a cold item: the warm targets only
            reports["ids"] = _id_only(Recommender.from_run(out, trust=True), split)
        print(f"{variant}: {metrics['test']['full']['ndcg@10']:.4f} (its own test)", flush=True)
    first = int(args.neighbours.split(",")[0])
    report, id_only = reports[f"features-k{first}"], reports.get("ids")
    model = report["model"]["cold"]["hr@10"]
    content = report["content"]["cold"]["hr@10"]
    random = report["model"]["cold"]["random_hr@10"]
    lines = [
        f"# The cold-item protocol on ML-1M: {args.share:.0%} of the items held out of training",
        "",
        f"{len(split.cold):,} of {ds.n_items:,} items held out (seed {args.seed}); "
        f"{int(report['model']['cold']['users']):,} users' last item is one of them. {model_name} "
        f"for {args.epochs} epochs with item features ({', '.join(ML1M_FEATURES)}, id dropout "
        f"{args.id_dropout:g}); the held-out items added to the trained run from their features.",
        "",
        *_cold_table(
            {
                **{
                    f"{model_name} + features, a new item's id from {name[len('features-k') :]} "
                    "nearest item(s)": r["model"]
                    for name, r in reports.items()
                    if name.startswith("features-k")
                },
                "content (history features -> nearest items)": report["content"],
                "popularity within genres": report["category_popularity"],
            },
            id_only,
        ),
        "",
        f"Cold HR@10 over the whole catalogue ({first} neighbour(s)): model / content "
        f"{model / max(content, 1e-12):.2f}×, model / random {model / random:.1f}×.",
    ]
    payload = {
        "reports": reports,
        "share": args.share,
        "seed": args.seed,
        "epochs": args.epochs,
        "id_dropout": args.id_dropout,
        "recipe": args.recipe,
        "n_cold": len(split.cold),
        "ratio_content": model / max(content, 1e-12),
        "ratio_random": model / random,
    }
    json_path, md_path = write_results(
        args.name or f"ml1m_cold_{prefix.replace('-', '_')}d{args.id_dropout:g}",
        payload,
        "\n".join(lines) + "\n",
        seeds={"train": args.seed, "cold_items": args.seed},
        runs=dirs,
    )
    print("\n".join(lines), f"-> {md_path}", sep="\n")


def _id_only(rec: Recommender, split: Any) -> dict[str, Any]:
    """The id-only model: its warm targets ranked; every cold target missed (it has no vector
    for a cold item: 0 by construction)."""
    known = [i for i, t in enumerate(split.targets) if rec.items.lookup(t) is not None]
    sub = dataclasses.replace(
        split,
        users=[split.users[i] for i in known],
        histories=[split.histories[i] for i in known],
        targets=[split.targets[i] for i in known],
        cold=[],
    )
    warm = rank_targets(sub, rec.items, rec.scores)["warm"]
    zero = {"hr@10": 0.0, "ndcg@10": 0.0}
    return {"cold": zero, "cold_among_cold": zero, "warm": warm}


def planted(args: argparse.Namespace) -> None:
    """A synthetic log: 1,200 items in 24 genres, each user picks items of two genres (no item
    twice, uniformly within them: nothing but the genre tells items apart); 10 % of the
    items held out; SASRec with the genre (and a text naming it) as features."""
    from seqrec.estimator import SASRec

    rng = np.random.default_rng(args.seed)
    n_items, n_genres, n_users = 1200, 24, 3000
    genre = rng.integers(0, n_genres, n_items + 1)
    rows = []
    for u in range(n_users):
        liked = rng.choice(n_genres, 2, replace=False)
        pool = np.flatnonzero(np.isin(genre, liked))
        pool = pool[pool > 0]
        for t, i in enumerate(rng.choice(pool, size=int(rng.integers(8, 30)), replace=False)):
            rows.append((u, int(i), t))
    log = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    table = pl.DataFrame(
        {"item": list(range(1, n_items + 1)), "genre": [f"g{g}" for g in genre[1:]]}
    )
    ds = prepare(log, progress=False, name=f"planted-s{args.seed}")
    split = hold_out_items(ds, 0.1, args.seed)
    model = SASRec(
        d_model=32,
        max_epochs=args.epochs,
        patience=0,
        seed=args.seed,
        set=[f"items.id_dropout={args.id_dropout}"],
    )
    model.fit(
        split.log,
        time_col=None,
        items=table.filter(~pl.col("item").is_in(split.cold)),
        item_features=["genre:category"],
        progress=False,
    )
    rec = model.recommender_
    popularity = np.concatenate([rec.popularity, np.zeros(len(split.cold), np.float32)])
    rec.add_items(table.filter(pl.col("item").is_in(split.cold)), save=False)
    report = cold_report(rec, split, popularity)
    cold_hr, warm_hr = report["model"]["cold"]["hr@10"], report["model"]["warm"]["hr@10"]
    lines = [
        "# The cold-item protocol on a planted log",
        "",
        f"{n_items:,} items in {n_genres} genres, {n_users:,} users each keeping to two genres "
        f"(seed {args.seed}); 10 % of the items held out of training and added from their genre. "
        f"SASRec (d 32, {args.epochs} epochs, id dropout {args.id_dropout:g}).",
        "",
        *_cold_table(
            {
                "sasrec + genre": report["model"],
                "content": report["content"],
                "popularity within genres": report["category_popularity"],
            },
            None,
        ),
        "",
        f"Cold recall@10 / warm recall@10 of the model: {cold_hr / warm_hr:.2f}.",
    ]
    payload = {
        "report": report,
        "cold_over_warm": cold_hr / warm_hr,
        "seed": args.seed,
        "epochs": args.epochs,
        "id_dropout": args.id_dropout,
    }
    json_path, md_path = write_results(
        args.name or "planted_cold",
        payload,
        "\n".join(lines) + "\n",
        seeds={"data": args.seed, "train": args.seed},
    )
    print("\n".join(lines), f"-> {md_path}", sep="\n")


def speed(args: argparse.Namespace) -> None:
    """Training sequences/s of each recipe with and without the ML-1M item features: the real
    step (batches from the real sampler, loss, backward, optimizer), one whole epoch per timed
    window, the two variants' windows alternating (ids, features, ids, ...) so that a change in
    the machine's speed falls on both; the median window of each is kept."""
    import time

    from seqrec.training.setup import setup

    src = paper_ml1m(args.data_dir)
    table = ml1m_items(data_dir(args.data_dir), runs_dir(args.runs_dir))
    feats = ItemsConfig(str(table), features=ML1M_FEATURES, id_dropout=args.id_dropout)
    rows: list[dict[str, Any]] = []
    for name in args.recipes.split(","):
        trainings = {}
        for variant, items in (("ids", None), ("features", feats)):
            cfg = load_config(RunConfig, name, [f"train.seed={args.seed}", *args.set])
            cfg = dataclasses.replace(cfg, items=items or ItemsConfig())
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            trainings[variant] = setup(ds, cfg)
            warm = trainings[variant].sampler.epoch(0)
            for _ in range(3):
                trainings[variant].step(next(warm))
        rates: dict[str, list[float]] = {"ids": [], "features": []}
        for epoch in range(1, args.repeats + 1):
            for variant, training in trainings.items():
                n_seq, t0 = 0, time.perf_counter()
                for batch in training.sampler.epoch(epoch):
                    loss = training.step(batch)
                    n_seq += batch.size
                float(loss)
                rates[variant].append(n_seq / (time.perf_counter() - t0))
        ids, features = statistics.median(rates["ids"]), statistics.median(rates["features"])
        rows.append(
            {
                "recipe": name,
                "ids_seq_per_s": ids,
                "features_seq_per_s": features,
                "ids_runs": rates["ids"],
                "features_runs": rates["features"],
                "cost": 1 - features / ids,
            }
        )
        print(f"{name}: ids {ids:.0f} seq/s, features {features:.0f} ({1 - features / ids:.1%})")
    lines = [
        "# Training throughput with and without item features on ML-1M",
        "",
        f"Features: {', '.join(ML1M_FEATURES)} (id dropout {args.id_dropout:g}). Sequences/s of",
        "the training step, one epoch per window, the variants' windows alternating; the median",
        f"of {args.repeats} windows each.",
        "",
        "| recipe | ids seq/s | features seq/s | cost |",
        "|---|---|---|---|",
        *(
            f"| {r['recipe']} | {r['ids_seq_per_s']:.0f} | {r['features_seq_per_s']:.0f} | "
            f"{r['cost']:.1%} |"
            for r in rows
        ),
    ]
    payload = {"rows": rows, "repeats": args.repeats, "features": list(ML1M_FEATURES)}
    _, md_path = write_results(
        args.name or "ml1m_speed", payload, "\n".join(lines) + "\n", seeds={"train": args.seed}
    )
    print("\n".join(lines), f"-> {md_path}", sep="\n")


def models(args: argparse.Namespace) -> None:
    """One table of the cold-item protocol's results files, a row per model (the files of
    `cold --id-dropout 0` for each recipe, read as they are)."""
    import json

    from _common import RESULTS

    rows = []
    for recipe in args.recipes.split(","):
        prefix = "" if recipe == DEFAULT_RECIPE else recipe.removeprefix("ml-1m-") + "-"
        path = RESULTS / "features" / f"ml1m_cold_{prefix.replace('-', '_')}d0.json"
        data = json.loads(path.read_text())
        model = data["reports"]["features-k1"]["model"]
        rows.append(
            {
                "recipe": recipe,
                "epochs": data["epochs"],
                "cold_hr@10": model["cold"]["hr@10"],
                "cold_among_cold_hr@10": model["cold_among_cold"]["hr@10"],
                "ratio_content": data["ratio_content"],
                "ratio_random": data["ratio_random"],
                "warm_hr@10": model["warm"]["hr@10"],
                "id_only_warm_hr@10": data["reports"].get("ids", {}).get("warm", {}).get("hr@10"),
                "file": path.name,
            }
        )
    lines = [
        "# The cold-item protocol on ML-1M, every model that reads item features",
        "",
        "10 % of the items held out (seed 0), id dropout 0, a new item's id from its nearest",
        "trained item; from the results file of each (its command and runs are there).",
        "",
        "| model | epochs | cold HR@10 (whole catalogue) | × content | × random | cold HR@10 "
        "(among cold) | warm HR@10 | id-only warm HR@10 |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['recipe']} | {r['epochs']} | {r['cold_hr@10']:.4f} | "
            f"{r['ratio_content']:.2f} | {r['ratio_random']:.1f} | "
            f"{r['cold_among_cold_hr@10']:.4f} | {r['warm_hr@10']:.4f} | "
            + (
                "not run |"
                if r["id_only_warm_hr@10"] is None
                else f"{r['id_only_warm_hr@10']:.4f} |"
            )
            for r in rows
        ),
    ]
    _, md_path = write_results(
        args.name or "ml1m_cold_models",
        {"rows": {r["recipe"]: r for r in rows}},
        "\n".join(lines) + "\n",
        seeds={"train": 0, "cold_items": 0},
    )
    print("\n".join(lines), f"-> {md_path}", sep="\n")


def _or(row: dict[str, Any]) -> str:
    value = row["id_only_warm_hr@10"]
    return "not run" if value is None else f"{value:.4f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("part", choices=["warm", "cold", "planted", "speed", "models"])
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--id-dropout", type=float)
    ap.add_argument("--recipe", default=DEFAULT_RECIPE, help="cold: the model's ML-1M recipe")
    ap.add_argument(
        "--no-id-only", action="store_true", help="cold: without the id-only run (0 on cold items)"
    )
    ap.add_argument("--recipes", default=SPEED_RECIPES, help="speed: the recipes timed")
    ap.add_argument("--repeats", type=int, default=3, help="speed: timed epochs per variant")
    ap.add_argument("--neighbours", default="1,10", help="cold: the ids of how many neighbours")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--name")
    args = ap.parse_args(argv)
    if args.id_dropout is None:
        args.id_dropout = 0.0 if args.part in ("warm", "speed") else 0.5
    parts = {"warm": warm, "cold": cold, "planted": planted, "speed": speed, "models": models}
    parts[args.part](args)
