"""The chunked full-softmax CE (seqrec.training.losses) at several chunk heights: forward +
backward time for M target positions against catalogues of ML-1M's and Beauty's sizes, and the
height the library picks (`ce_chunk_rows`). Random features and weights; the best of `--repeats`
runs.

    python benchmarks/speed.py ce-chunks [--rows 2500] [--repeats 3] [--name ce_chunks]
"""

from __future__ import annotations

import argparse
import time

import torch

from _common import write_results
from seqrec.training import losses

CATALOGUES = {"ML-1M": 3416, "Beauty": 54542}
HEIGHTS = (512, 256, 128, 64, 32, 16)


def _time(z: torch.Tensor, w: torch.Tensor, b: torch.Tensor, t: torch.Tensor, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        z.grad = w.grad = b.grad = None
        start = time.perf_counter()
        losses.full_cross_entropy(z, w, b, t).backward()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=2500, help="target positions M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="ce_chunks")
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    results: dict[str, dict[str, float]] = {}
    for label, V in CATALOGUES.items():
        z = torch.randn(args.rows, 64, generator=g).requires_grad_()
        w = torch.randn(V, 64, generator=g).requires_grad_()
        b = torch.zeros(V).requires_grad_()
        t = torch.randint(1, V + 1, (args.rows,), generator=g)
        picked = losses.ce_chunk_rows(V)
        row: dict[str, float] = {}
        for h in (*HEIGHTS, picked):
            orig = losses.CE_CHUNK_ELEMENTS, losses.CE_CHUNK_ROWS
            losses.CE_CHUNK_ELEMENTS, losses.CE_CHUNK_ROWS = h * V, h  # force height h
            try:
                row[str(h)] = _time(z, w, b, t, args.repeats)
            finally:
                losses.CE_CHUNK_ELEMENTS, losses.CE_CHUNK_ROWS = orig
        row["picked"] = float(picked)
        row["speedup_picked_vs_512"] = row["512"] / row[str(picked)]
        results[label] = row
    lines = [
        f"# Chunked CE: forward + backward seconds for M = {args.rows}, D = 64",
        "",
        "| catalogue | items | " + " | ".join(f"{h} rows" for h in HEIGHTS) + " | picked | "
        "picked vs 512 |",
        "|---|---|" + "---|" * (len(HEIGHTS) + 2),
    ]
    for label, row in results.items():
        cells = [f"{row[str(h)]:.3f}" for h in HEIGHTS]
        lines.append(
            f"| {label} | {CATALOGUES[label]:,} | " + " | ".join(cells) + f" | {int(row['picked'])}"
            f" ({row[str(int(row['picked']))]:.3f}) | {row['speedup_picked_vs_512']:.2f}x |"
        )
    paths = write_results(
        args.name,
        {"rows": args.rows, "d": 64, "results": results},
        "\n".join(lines) + "\n",
        seeds={"data": 0},
    )
    print("\n".join(lines))
    print("wrote", *paths)
