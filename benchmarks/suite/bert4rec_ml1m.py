"""Reproduce BERT4Rec on the papers' ML-1M file: train with a config (default: the documented
ML-1M recipe), then write the test metrics under pop100 beside the paper's Table 2 row, plus full
and uni100, wall time, epochs and sequences/s, and the JSON behind it.

    python benchmarks/reproduce.py bert4rec-ml1m [--data-dir DIR] [--config ml-1m-bert4rec]
        [--set train.lr=1e-4 ...] [--out RUN_DIR] [--name bert4rec_ml1m]

A finished run in --out is reported as it was trained (if its config is the requested one), an
interrupted one is resumed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import paper_ml1m, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data import download
from seqrec.data.prepare import prepare
from seqrec.evaluation.protocols import evaluate_split
from seqrec.evaluation.report import metrics_table
from seqrec.models.baselines import Popularity


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--config", default="ml-1m-bert4rec", help="a shipped config name or a path")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", help="run directory (default: under $SEQREC_HOME/runs)")
    ap.add_argument("--name", default="bert4rec_ml1m", help="results file name")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    cfg = load_config(RunConfig, args.config, args.set)
    ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
    out = Path(args.out) if args.out else download.cache_dir() / "runs" / args.name
    m, log = train_or_reuse(ds, cfg, out, src)
    pop = evaluate_split(ds, Popularity.fit(ds.split.train), "test", protocols=cfg.eval.protocols)
    curve = [(h["epoch"], h[k]) for h in log for k in h if k.startswith("valid_")]
    md = (
        "# BERT4Rec on ML-1M (papers' file), leave-one-out test split\n\n"
        f"Config: `{Path(args.config).name}` + {args.set or 'no overrides'}; "
        f"seed {cfg.train.seed}. "
        f"Best state chosen on validation {m['selected_on']} (epoch {m['best_epoch']}); "
        "test evaluated once, with that state.\n\n"
        + metrics_table(m["test"], model="bert4rec", with_paper=True)
        + "\n\n"
        + metrics_table(pop.metrics, model="pop")
        + "\n\n"
        f"Training: {m['epochs']} epochs, {m['steps']} steps, stopped by {m['stopped']}; "
        f"train time {m['train_time_s'] / 60:.1f} min, wall time {m['wall_time_s'] / 60:.1f} min, "
        f"{m['seq_per_s']:.0f} sequences/s on {m['device']}.\n\n"
        "Validation curve (epoch, value): " + ", ".join(f"({e}, {v:.4f})" for e, v in curve) + "\n"
    )
    payload = {
        "protocol": "leave-one-out test split; full / uni100 / pop100; 100 negatives, seed "
        f"{cfg.eval.negative_seed}",
        "dataset": src.name,
        "metrics": m,
        "pop_metrics": pop.metrics,
        "validation_curve": curve,
    }
    seeds = {"train": cfg.train.seed, "candidates": cfg.eval.negative_seed}
    paths = write_results(args.name, payload, md, seeds=seeds, runs=[out])
    print(md)
    print("wrote", *paths)
