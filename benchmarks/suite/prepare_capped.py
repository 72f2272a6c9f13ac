"""A log larger than the memory it is prepared in: the ML-20M-format synthetic `ratings.csv` of
benchmarks/speed.py prepare-scale (20,000,263 rows) with one more column of text per row (a
`comment` of --extra-bytes characters, as logs carry fields a recommender never reads),
prepared by `seqrec prepare` with each reader (`data.reader` = memory, then stream) inside a
memory cgroup capped at --cap GiB. Reports for each: completed or killed by the cap, wall time,
peak RSS.

    python benchmarks/speed.py prepare-capped [--cap 3] [--extra-bytes 40] [--workdir DIR]

Needs a writable cgroup memory controller (v1 `/sys/fs/cgroup/memory` or v2), i.e. root in a
container or a machine that allows it; it stops with one line otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from _common import write_results
from suite.prepare_scale import make_file


def _cgroup(cap_bytes: int) -> Path:
    """A fresh memory cgroup limited to `cap_bytes` (swap included where v1 can say so)."""
    for root, limit in (
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),  # v1
        (Path("/sys/fs/cgroup"), "memory.max"),  # v2
    ):
        group = root / f"seqrec-capped-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / limit).write_text(str(cap_bytes))
        except OSError:
            continue
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            with contextlib.suppress(OSError):
                swap.write_text(str(cap_bytes))
        return group
    sys.exit("prepare_capped: no writable cgroup memory controller here (root is needed)")


def _prepare(src: Path, out: Path, reader: str, group: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "seqrec", "prepare", "--data", str(src), "--out", str(out)]
    cmd += ["--user-col", "userId", "--item-col", "movieId", "--quiet", "--force"]
    cmd += ["--set", f'data.reader="{reader}"']

    def enter() -> None:  # the child joins the cgroup before it runs seqrec
        (group / "cgroup.procs").write_text(str(os.getpid()))

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=enter)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    outcome = "completed" if code == 0 else ("killed by the cap" if code == -9 else "failed")
    return {
        "reader": reader,
        "outcome": outcome,
        "returncode": code,
        "wall_s": round(wall, 1),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),
        "error": (err.strip().splitlines() or [""])[-1][:200] if code else None,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cap", type=float, default=3.0, help="GiB")
    ap.add_argument("--extra-bytes", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir")
    args = ap.parse_args(argv)
    group = _cgroup(int(args.cap * 2**30))
    try:
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            base, src = Path(tmp) / "base.csv", Path(tmp) / "log.csv"
            make_file(base, 20_000_263, 138_493, 26_744, args.seed)
            (pl.scan_csv(base).with_columns(comment=pl.lit("x" * args.extra_bytes)).sink_csv(src))
            base.unlink()
            size_gib = src.stat().st_size / 2**30
            rows = [
                _prepare(src, Path(tmp) / f"prepared-{r}", r, group) for r in ("memory", "stream")
            ]
    finally:
        group.rmdir()
    table = "".join(
        f"| {r['reader']} | {r['outcome']} | {r['wall_s']:.1f} s | {r['peak_rss_gib']:.2f} GiB |\n"
        for r in rows
    )
    md = (
        f"# Preparing a log larger than its memory: {args.cap:g} GiB cap\n\n"
        f"Synthetic ML-20M-format log (20,000,263 rows, 138,493 users, 26,744 items) with a "
        f"{args.extra_bytes}-character `comment` column: {size_gib:.2f} GiB of CSV, read as a "
        "generic CSV (`--user-col userId --item-col movieId`). `seqrec prepare` in a memory "
        "cgroup of "
        f"{args.cap:g} GiB, once per reader:\n\n"
        "| data.reader | outcome | wall time | peak RSS |\n|---|---|---|---|\n"
        f"{table}"
    )
    payload = {"cap_gib": args.cap, "file_gib": round(size_gib, 3), "rows": rows}
    paths = write_results("prepare_capped", payload, md, seeds={"synthetic_file": args.seed})
    print(md)
    print("wrote", *paths)
