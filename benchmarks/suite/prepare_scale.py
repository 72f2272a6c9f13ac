"""Preparation at ML-20M scale: a synthetic `ratings.csv` in the ML-20M format with 20,000,263
rows (138,493 users, 26,744 items, Zipf-like item popularity), prepared by `seqrec prepare` in a
separate process; reports wall time and peak resident memory of that process.

    python benchmarks/speed.py prepare-scale [--rows 20000263] [--seed 0] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from _common import write_results


def make_file(path: Path, rows: int, users: int, items: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # every user gets >= 20 ratings, like ML-20M; the rest spread with a heavy tail
    extra = rng.pareto(1.5, size=users)
    lengths = 20 + np.floor(extra / extra.sum() * (rows - 20 * users)).astype(np.int64)
    lengths[: rows - int(lengths.sum())] += 1
    pop = 1.0 / np.arange(1, items + 1) ** 1.1
    item = rng.choice(np.arange(1, items + 1), size=rows, p=pop / pop.sum())
    ts = 789_652_009 + rng.integers(0, 20 * 365 * 86_400, size=rows)
    pl.DataFrame(
        {
            "userId": np.repeat(np.arange(1, users + 1), lengths),
            "movieId": item,
            "rating": rng.integers(1, 11, size=rows) / 2,
            "timestamp": ts,
        }
    ).write_csv(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=20_000_263)
    ap.add_argument("--users", type=int, default=138_493)
    ap.add_argument("--items", type=int, default=26_744)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        src = Path(tmp) / "ratings.csv"
        t0 = time.perf_counter()
        make_file(src, args.rows, args.users, args.items, args.seed)
        gen_s = time.perf_counter() - t0
        size_mb = src.stat().st_size / 1e6
        cmd = [
            sys.executable,
            "-m",
            "seqrec",
            "prepare",
            "--data",
            str(src),
            "--out",
            str(Path(tmp) / "prepared"),
            "--quiet",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        if proc.returncode != 0:
            sys.exit(proc.stderr)
    md = (
        "# Preparing an ML-20M-sized file\n\n"
        f"Synthetic `ratings.csv` (ML-20M format): {args.rows:,} rows, {args.users:,} users, "
        f"{args.items:,} items, {size_mb:.0f} MB, seed {args.seed} "
        f"(generated in {gen_s:.1f} s).\n\n"
        "| step | wall time | peak RSS |\n|---|---|---|\n"
        f"| `seqrec prepare` (read, sort, 5-core, ids, split, 4x100 negatives, write) | "
        f"{wall:.1f} s | {peak_gib:.2f} GiB |\n\n"
        f"Target: < 120 s and < 4 GiB. Output: {proc.stdout.strip()}\n"
    )
    payload = {
        "rows": args.rows,
        "users": args.users,
        "items": args.items,
        "seed": args.seed,
        "file_mb": round(size_mb, 1),
        "prepare_seconds": round(wall, 2),
        "peak_rss_gib": round(peak_gib, 3),
        "output": proc.stdout.strip(),
    }
    paths = write_results("prepare_scale", payload, md, seeds={"synthetic_file": args.seed})
    print(md)
    print("wrote", *paths)
