"""Reproduce SASRec on the papers' ML-1M file with each loss: the paper's BCE with one negative
(uni100 beside SASRec Table III, pop100 beside BERT4Rec Table 2's SASRec row), full-softmax CE
(full ranking beside SASRec+, 0.1821) and gBCE (beside gSASRec, 0.1726). One Markdown + JSON
result, rewritten after each variant, with wall time, epochs and sequences/s per variant.

    python benchmarks/reproduce.py sasrec-ml1m [--data-dir DIR] [--variants bce,ce,gbce]
        [--set KEY=VALUE ...] [--set-ce KEY=VALUE ...] [--runs-dir DIR] [--name sasrec_ml1m]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.evaluation.report import metrics_table

# variant -> (shipped config, label in the tables, the published number it is compared with)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "bce": (
        "ml-1m-sasrec",
        "sasrec",
        "SASRec Table III uni100 HR@10 0.8245 NDCG@10 0.5905; BERT4Rec Table 2 pop100 HR@10 "
        "0.6629 NDCG@10 0.4368",
    ),
    "ce": (
        "ml-1m-sasrec-ce",
        "sasrec+ce",
        "SASRec+ (Klenitskiy & Vasilev 2023) full NDCG@10 0.1821",
    ),
    "gbce": (
        "ml-1m-sasrec-gbce",
        "sasrec+gbce",
        "gSASRec (Petrov & Macdonald 2023) full NDCG@10 0.1726",
    ),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--variants", default="bce,ce,gbce")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="all variants")
    for v in VARIANTS:
        ap.add_argument(f"--set-{v}", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs-dir", help="run directories (default: $SEQREC_HOME/runs)")
    ap.add_argument("--name", default="sasrec_ml1m", help="results file name")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    runs = runs_dir(args.runs_dir)
    done: dict[str, Any] = {}
    for variant in args.variants.split(","):
        config, label, published = VARIANTS[variant]
        overrides = [*args.set, *getattr(args, f"set_{variant}")]
        cfg = load_config(RunConfig, config, overrides)
        ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        out = runs / f"{args.name}-{variant}"
        metrics, log = train_or_reuse(ds, cfg, out, src)
        done[variant] = {
            "config": config,
            "overrides": overrides,  # the run's config is the shipped one with these
            "candidate_seed": cfg.eval.negative_seed,
            "label": label,
            "published": published,
            "run_dir": str(out),
            "metrics": metrics,
            "validation_curve": [
                (h["epoch"], round(h["elapsed_s"], 1), h[k])
                for h in log
                for k in h
                if k.startswith("valid_")
            ],
        }
        _write(args, src, done)


def _write(args: argparse.Namespace, src: Path, done: dict[str, Any]) -> None:
    parts = ["# SASRec on ML-1M (papers' file) with each loss, leave-one-out test split\n"]
    summary = [
        "| variant | loss | full NDCG@10 | full HR@10 | uni100 NDCG@10 | uni100 HR@10 | "
        "pop100 NDCG@10 | pop100 HR@10 | epochs | train min | seq/s | published |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, r in done.items():
        m = r["metrics"]
        t = m["test"]
        summary.append(
            f"| {r['label']} | {variant} | {t['full']['ndcg@10']:.4f} | {t['full']['hr@10']:.4f} | "
            f"{t['uni100']['ndcg@10']:.4f} | {t['uni100']['hr@10']:.4f} | "
            f"{t['pop100']['ndcg@10']:.4f} | {t['pop100']['hr@10']:.4f} | {m['epochs']} | "
            f"{m['train_time_s'] / 60:.1f} | {m['seq_per_s']:.0f} | {r['published']} |"
        )
    parts.append("\n".join(summary) + "\n")
    for r in done.values():
        m = r["metrics"]
        parts.append(
            f"## {r['label']} (`{r['config']}` + {r['overrides'] or 'no overrides'})\n\n"
            + metrics_table(m["test"], model=r["label"], with_paper=True)
            + f"\n\n{m['epochs']} epochs, {m['steps']} steps, stopped by {m['stopped']}; "
            f"best state on validation {m['selected_on']} (epoch {m['best_epoch']}), test "
            f"evaluated once with it; train {m['train_time_s'] / 60:.1f} min, wall "
            f"{m['wall_time_s'] / 60:.1f} min, {m['seq_per_s']:.0f} sequences/s on {m['device']}."
            "\n\nValidation curve (epoch, seconds, value): "
            + ", ".join(f"({e}, {s:.0f}, {v:.4f})" for e, s, v in r["validation_curve"])
            + "\n"
        )
    payload = {
        "protocol": "leave-one-out test split; full / uni100 / pop100; 100 negatives per user, "
        "drawn once per prepared dataset",
        "dataset": src.name,
        "variants": done,
    }
    runs = [Path(r["run_dir"]) for r in done.values()]
    seeds = {f"train_{v}": r["metrics"]["seed"] for v, r in done.items()}
    seeds.update({f"candidates_{v}": r["candidate_seed"] for v, r in done.items()})
    paths = write_results(args.name, payload, "\n".join(parts), seeds=seeds, runs=runs)
    print("\n".join(parts))
    print("wrote", *paths, flush=True)
