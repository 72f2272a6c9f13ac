"""`seqrec quickstart`: the main job (`make run`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from seqrec.cli.common import (
    DATA_DIR_ENV,
    _is_ml1m,
    _say_short_budget,
)
from seqrec.config import (
    RunConfig,
    load_config,
)
from seqrec.data import download
from seqrec.data.prepare import prepare, prepare_frame
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import DownloadError
from seqrec.evaluation.protocols import evaluate_split
from seqrec.evaluation.report import metrics_table, stats_table
from seqrec.models.baselines import Popularity
from seqrec.training.fit import fit


def _find_ml1m() -> tuple[str | None, str]:
    """The main job's data: the papers' ML-1M file from $SEQREC_DATA_DIR, else the cache or a
    download of the official ML-1M; (None, reason) when none is reachable."""
    root = os.environ.get(DATA_DIR_ENV)
    if root:
        for rel in ("bert4rec-paper/ml-1m.txt.gz", "ml-1m/ratings.dat"):
            if (Path(root) / rel).exists():
                return str(Path(root) / rel), f"${DATA_DIR_ENV}/{rel}"
    try:
        return str(download.fetch("ml-1m", retries=0, timeout=10)), "ml-1m (official, cached)"
    except DownloadError as e:
        return None, str(e)


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The main job: prepare ML-1M (or, offline, synthetic data), evaluate POP, train BERT4Rec
    briefly with the ML-1M recipe's settings (its schedule squeezed into the budget), print both
    tables."""
    if args.data:
        data, origin = args.data, args.data
    else:
        data, origin = _find_ml1m()
    if data is not None:
        cfg = load_config(RunConfig, "ml-1m-bert4rec")
        ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval)
    else:
        print(f"no ML-1M reachable ({origin}); running on SYNTHETIC data instead", file=sys.stderr)
        origin = "synthetic (seqrec.data.synthetic, seed 0)"
        cfg = load_config(RunConfig, "synthetic-bert4rec")
        ds = prepare_frame(
            synthetic_interactions(seed=0),
            download.cache_dir() / "prepared" / "synthetic-seed0",
            name="synthetic",
            data_cfg=cfg.data,
            eval_cfg=cfg.eval,
            replace=True,  # the cache's own folder
        )
    full_budget = cfg.train.time_budget
    cfg = load_config(
        RunConfig, None, [f"train.time_budget={json.dumps(args.time_budget)}"], base=cfg
    )
    paper = _is_ml1m(ds)
    print(f"data: {origin} -> {ds.path}\n")
    _say_short_budget(cfg)
    print(stats_table(ds.name, ds.stats) + "\n")
    pop = evaluate_split(
        ds,
        Popularity.fit(ds.split.train),
        "test",
        protocols=cfg.eval.protocols,
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
    )
    print(metrics_table(pop.metrics, model="pop", with_paper=paper) + "\n", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else download.cache_dir() / "runs" / f"quickstart-{stamp}"
    result = fit(ds, cfg, out, progress=not args.quiet, source={"data": origin})
    m = result.metrics
    print(metrics_table(m["test"], model="bert4rec", with_paper=paper))
    print(
        f"\nBERT4Rec: {m['epochs']} epochs in {m['train_time_s'] / 60:.1f} min "
        f"({m['seq_per_s']:.0f} seq/s), best epoch {m['best_epoch']} by {m['selected_on']} "
        f"-> {result.run_dir}"
    )
    if paper:
        print(
            f"A {args.time_budget} run of the recipe; its own budget ({full_budget}) buys more: "
            "seqrec train bert4rec --data ml-1m --out runs/b4r --config ml-1m-bert4rec "
            "(docs/results/bert4rec.md)."
        )
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "quickstart", help="the main job: prepare ML-1M, evaluate POP, train BERT4Rec briefly"
    )
    p.add_argument("--data", help="dataset name or file (default: find ML-1M, else synthetic)")
    p.add_argument(
        "--time-budget", default="5m", help="BERT4Rec's training budget on real data (5m)"
    )
    p.add_argument("--out", help="run directory (default: under the cache)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_quickstart)
