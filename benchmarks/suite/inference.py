"""Inference speed of a trained run, in fp32 and under bf16 autocast: batch scoring of every
user's full history (all items, history items excluded, top-k), one history at a time (p50 /
p99 latency), evaluation of the test split under full / uni100 / pop100, and the top-k agreement
of bf16 with fp32 on the same histories.

    python benchmarks/speed.py inference RUN_DIR [--k 10] [--repeats 3] [--requests 1000]
        [--name inference]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _common import write_results
from seqrec.evaluation.protocols import PROTOCOLS, evaluate_split
from seqrec.serving.recommender import Recommender
from seqrec.training.setup import ModelScorer


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    """The median wall time of `repeats` calls (after one warm-up) and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure(rec: Recommender, histories: list[np.ndarray], args: argparse.Namespace) -> Any:
    n = len(histories)
    batch_s, top = timed(lambda: rec.recommend_encoded(histories, args.k), args.repeats)
    rng = np.random.default_rng(0)
    one = []
    for u in rng.integers(0, n, size=args.requests):
        start = time.perf_counter()
        rec.recommend_encoded([histories[u]], args.k)
        one.append(time.perf_counter() - start)
    ds = rec.dataset
    assert ds is not None
    scorer = ModelScorer(rec.model, rec.bf16, rec.device)
    eval_s, report = timed(
        lambda: evaluate_split(ds, scorer, "test", protocols=PROTOCOLS, device=rec.device),
        args.repeats,
    )
    row = {
        "histories": n,
        "batch_histories_per_s": n / batch_s,
        "batch_s": batch_s,
        "one_p50_ms": float(np.percentile(one, 50) * 1000),
        "one_p99_ms": float(np.percentile(one, 99) * 1000),
        "eval_all_protocols_s": eval_s,
        "test_ndcg@10": {p: report.metrics[p]["ndcg@10"] for p in PROTOCOLS},
    }
    return row, [[item for item, _ in r] for r in top]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000, help="single-history requests")
    ap.add_argument("--name", default="inference")
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    rows: dict[str, Any] = {}
    tops: dict[str, list[list[Any]]] = {}
    for precision in ("fp32", "bf16"):
        rec = Recommender.from_run(args.run, bf16=precision == "bf16")
        if rec.dataset is None:
            sys.exit(f"{args.run}: its prepared data is gone; the benchmark replays its histories")
        seqs = rec.dataset.sequences
        histories = [seqs[u] for u in range(seqs.n_users)]
        rows[precision], tops[precision] = measure(rec, histories, args)
        print(precision, rows[precision], flush=True)
    same_set = [len(set(a) & set(b)) / args.k for a, b in zip(*tops.values(), strict=True)]
    same_list = [a == b for a, b in zip(*tops.values(), strict=True)]
    agreement = {
        "mean_overlap": float(np.mean(same_set)),
        "identical_lists": float(np.mean(same_list)),
    }
    model = rec.run.config.model
    lines = [
        f"# Inference, `{Path(args.run).name}` ({model}, {rec.n_items:,} items, "
        f"max_len {rec.max_len}, {len(histories):,} users)",
        "",
        f"Batch: every user's full history, top-{args.k} over all items, history items "
        f"excluded (median of {args.repeats}). One history: {args.requests} random users, one "
        "call each. Evaluation: the test split under full, uni100 and pop100 "
        f"(median of {args.repeats}).",
        "",
        "| precision | batch histories/s | one history p50 ms | p99 ms | evaluation, 3 protocols "
        "| test full NDCG@10 |",
        "|---|---|---|---|---|---|",
    ]
    for precision, r in rows.items():
        lines.append(
            f"| {precision} | {r['batch_histories_per_s']:.0f} | {r['one_p50_ms']:.2f} "
            f"| {r['one_p99_ms']:.2f} | {r['eval_all_protocols_s']:.2f} s "
            f"| {r['test_ndcg@10']['full']:.4f} |"
        )
    lines += [
        "",
        f"bf16 against fp32: top-{args.k} overlap {agreement['mean_overlap']:.4f} (mean share "
        f"of common items), identical ordered lists for {100 * agreement['identical_lists']:.1f} "
        "% of users.",
    ]
    payload = {"run": args.run, "model": model, "rows": rows, "bf16_agreement": agreement}
    write_results(
        args.name, payload, "\n".join(lines), seeds={"requests": 0}, runs=[Path(args.run)]
    )
