"""Do the speed options change quality? For each shipped ML-1M config, train it as shipped and
with the speed options, the same number of epochs and the same schedule, and compare validation
full-ranking NDCG@10 epoch by epoch, test metrics under every protocol, and sequences/s.

    python benchmarks/analyses.py speed-options-quality [--data-dir DIR] [--pairs bce,ce,bert4rec]
        [--runs-dir DIR] [--name speed_options_quality]

Finished run directories (`<runs-dir>/q-<pair>-faithful`, `q-<pair>-fast`) are reported as
they were trained (pairs with the same config and schedule may share one faithful run: link
its directory); the two runs of a pair must not run at the same time as anything else if
their sequences/s are to be compared.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare

GROUPED = ["next_item.bucket_batches=32", "next_item.loss_norm=epoch"]
# pair -> (model, shipped config, overrides of both runs, overrides of the fast run only)
PAIRS: dict[str, tuple[str, str, list[str], list[str]]] = {
    "bce": (
        "sasrec",
        "ml-1m-sasrec",
        ["train.max_epochs=25", "train.eval_every=5"],
        ["sasrec.attn_dropout=0", "sasrec.dropout_impl=fast", *GROUPED],
    ),
    "ce": (
        "sasrec",
        "ml-1m-sasrec-ce",
        ["train.max_epochs=15", "train.eval_every=5", "train.decay=none"],
        ["train.loss_bf16=true", "sasrec.dropout_impl=fast", *GROUPED],
    ),
    # the CE pair's options one group at a time (which one costs quality per epoch?)
    "ce-drop-bf16": (
        "sasrec",
        "ml-1m-sasrec-ce",
        ["train.max_epochs=15", "train.eval_every=5", "train.decay=none"],
        ["train.loss_bf16=true", "sasrec.dropout_impl=fast"],
    ),
    "ce-group": (
        "sasrec",
        "ml-1m-sasrec-ce",
        ["train.max_epochs=15", "train.eval_every=5", "train.decay=none"],
        GROUPED,
    ),
    "b4r": (
        "bert4rec",
        "ml-1m-bert4rec",
        ["train.max_epochs=8", "train.eval_every=4", "train.decay=epochs"],
        ["bert4rec.dropout_impl=fast", "train.loss_bf16=true"],
    ),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--runs-dir", help="run directories (default: $SEQREC_HOME/runs)")
    ap.add_argument("--name", default="speed_options_quality")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    rows: list[dict[str, Any]] = []
    for pair in args.pairs.split(","):
        model, config, both, fast = PAIRS[pair]
        for kind, overrides in (("faithful", both), ("fast", [*both, *fast])):
            cfg = load_config(RunConfig, config, overrides)
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            out = runs / f"q-{pair}-{kind}"
            metrics, log = train_or_reuse(ds, cfg, out, src)
            key = "valid_full_ndcg@10"
            rows.append(
                {
                    "pair": pair,
                    "model": model,
                    "config": config,
                    "kind": kind,
                    "overrides": overrides,
                    "curve": [(h["epoch"], h[key]) for h in log if key in h],
                    "test": metrics["test"],
                    "epochs": metrics["epochs"],
                    "seq_per_s": metrics["seq_per_s"],
                    "seed": cfg.train.seed,
                    "run_dir": str(out),
                }
            )
        _write(args, rows)


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    lines = [
        "# Speed options against the faithful settings, ML-1M (papers' file)",
        "",
        "Each pair: the same config, schedule and number of epochs; the fast run adds the "
        "speed options listed. Validation: full-ranking NDCG@10 at the epochs shown. Test: the "
        "state chosen on validation, evaluated once. seq/s: the run's own training throughput "
        "(comparable within a pair only when nothing else ran beside it).",
        "",
        "| pair | run | speed options | validation NDCG@10 by epoch | test full NDCG@10 "
        "| test uni100 NDCG@10 | test pop100 NDCG@10 | seq/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        _, _, both, _ = PAIRS[r["pair"]]
        extra = [o for o in r["overrides"] if o not in both] or ["(none)"]
        curve = ", ".join(f"{e}: {v:.4f}" for e, v in r["curve"])
        t = r["test"]
        lines.append(
            f"| {r['pair']} (`{r['config']}`) | {r['kind']} | {', '.join(extra)} | {curve} "
            f"| {t['full']['ndcg@10']:.4f} | {t['uni100']['ndcg@10']:.4f} "
            f"| {t['pop100']['ndcg@10']:.4f} | {r['seq_per_s']:.0f} |"
        )
    runs = [Path(r["run_dir"]) for r in rows]
    seeds = {"train": sorted({r["seed"] for r in rows})[0] if rows else None}
    write_results(args.name, {"rows": rows}, "\n".join(lines), seeds=seeds, runs=runs)
