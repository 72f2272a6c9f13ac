"""Beauty end to end (issue 17, item 1): POP, SASRec (the paper's BCE), SASRec+CE and BERT4Rec
on the BERT4Rec authors' Beauty file, each trained (or reused) from a shipped config with a time
budget, evaluated on the test split with the state chosen on validation under full / uni100 /
pop100, beside the paper's Table 2 Beauty rows (pop100) and the best published full-ranking
numbers on this file.

    python benchmarks/reproduce.py beauty [--data-dir DIR] [--runs-dir DIR]
        [--row sasrec=beauty-sasrec:20m ...] [--name beauty]

A finished run in RUNS_DIR/beauty-<row> is reported as it was trained (if its config is the
requested one), an interrupted one is resumed.
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import budgeted_row, paper_beauty, runs_dir, train_or_reuse, write_results
from seqrec.data.prepare import prepare
from seqrec.evaluation.protocols import evaluate_split
from seqrec.evaluation.reference import PAPER_ROWS_BEAUTY
from seqrec.models.baselines import Popularity

ROWS = (
    "sasrec=beauty-sasrec:20m",
    "sasrec-ce=beauty-sasrec-ce:20m",
    "bert4rec=beauty-bert4rec:30m",
)
PAPER = {"pop": "pop", "sasrec": "sasrec", "bert4rec": "bert4rec"}  # row -> Table 2 row
PUBLISHED_FULL = {"sasrec-ce": ("SASRec+", 0.0327), "bert4rec": ("BERT4Rec", 0.0187)}
SHOWN = ("hr@10", "ndcg@10")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--row", action="append", metavar="NAME=CONFIG:BUDGET", help="repeatable")
    ap.add_argument("--name", default="beauty", help="results file name")
    args = ap.parse_args(argv)
    src = paper_beauty(args.data_dir)
    rows: dict[str, dict[str, Any]] = {}
    runs = []
    ds = None
    for spec in args.row or ROWS:
        name, config, budget, cfg = budgeted_row(spec)
        if ds is None:
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            pop = evaluate_split(
                ds, Popularity.fit(ds.split.train), "test", protocols=cfg.eval.protocols
            )
            rows["pop"] = {"config": None, "budget": None, "test": pop.metrics}
        out = runs_dir(args.runs_dir) / f"beauty-{name}"
        m, log = train_or_reuse(ds, cfg, out, src)
        runs.append(out)
        curve = [(h["epoch"], h[k]) for h in log for k in h if k.startswith("valid_")]
        rows[name] = {
            "config": config,
            "budget": budget,
            "test": m["test"],
            "epochs": m["epochs"],
            "best_epoch": m["best_epoch"],
            "train_time_s": m["train_time_s"],
            "seq_per_s": m["seq_per_s"],
            "validation_curve": curve,
        }
    assert ds is not None
    md = _markdown(rows, ds.stats)
    payload = {
        "protocol": "leave-one-out test split, state chosen on validation full NDCG@10; "
        "full / uni100 / pop100, 100 negatives",
        "dataset": src.name,
        "stats": ds.stats,
        "rows": rows,
        "paper": {k: PAPER_ROWS_BEAUTY[v][1] for k, v in PAPER.items()},
        "published_full_ndcg@10": {k: v[1] for k, v in PUBLISHED_FULL.items()},
    }
    seeds = {"train": 0, "candidates": 42}
    paths = write_results(args.name, payload, md, seeds=seeds, runs=runs)
    print(md)
    print("wrote", *paths)


def _markdown(rows: dict[str, dict[str, Any]], stats: dict[str, Any]) -> str:
    lines = [
        "# Beauty (the BERT4Rec authors' file), leave-one-out test split",
        "",
        f"{stats['users']:,} users, {stats['items']:,} items, {stats['actions']:,} actions. "
        "Each model's state chosen on validation full NDCG@10; test evaluated once.",
        "",
        "| model | config | budget | epochs | pop100 HR@10 | pop100 NDCG@10 | paper HR@10 | "
        "paper NDCG@10 | uni100 NDCG@10 | full HR@10 | full NDCG@10 | published full NDCG@10 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        t = r["test"]
        paper = PAPER_ROWS_BEAUTY[PAPER[name]][1] if name in PAPER else {}
        pub = PUBLISHED_FULL.get(name)
        cells = [
            name,
            f"`{r['config']}`" if r["config"] else "(training counts)",
            r["budget"] or "",
            str(r.get("epochs", "")),
            f"{t['pop100']['hr@10']:.4f}",
            f"{t['pop100']['ndcg@10']:.4f}",
            f"{paper['hr@10']:.4f}" if paper else "",
            f"{paper['ndcg@10']:.4f}" if paper else "",
            f"{t['uni100']['ndcg@10']:.4f}",
            f"{t['full']['hr@10']:.4f}",
            f"{t['full']['ndcg@10']:.4f}",
            f"{pub[1]:.4f} ({pub[0]})" if pub else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name, r in rows.items():
        if "train_time_s" in r:
            lines.append(
                f"- {name}: {r['epochs']} epochs in {r['train_time_s'] / 60:.1f} min "
                f"({r['seq_per_s']:.0f} sequences/s), best epoch {r['best_epoch']}; validation "
                "curve " + ", ".join(f"({e}, {v:.4f})" for e, v in r["validation_curve"])
            )
    return "\n".join(lines) + "\n"
