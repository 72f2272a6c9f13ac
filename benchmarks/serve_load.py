"""Serving figures for a trained run: the HTTP service under a bounded local load (N requests
from C concurrent clients, each a real history of the run's data; throughput, p50/p99 latency,
errors), and the library's batch scoring (histories/s) and one-history latency.

    python benchmarks/serve_load.py RUN_DIR [--requests 5000] [--clients 8] [--k 10]
        [--workers 1] [--min-seconds 0] [--name serve_load]

The server is started as a separate process (`seqrec serve`) on 127.0.0.1 and stopped at the end.
A soak: `--requests 20000 --clients 16 --min-seconds 120 --name soak` keeps sending until both
the count and the time are reached, and records the server's resident memory (RSS, from
/proc) after the warm-up and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from _common import write_results
from seqrec.recommender import Recommender


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float | None:
    """Resident memory of a process in MiB (Linux /proc), None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_cell(http: dict) -> str:
    if http["rss_growth"] is None:
        return "not measured"
    return (
        f"{http['rss_start_mib']:.0f} → {http['rss_end_mib']:.0f} MiB "
        f"({100 * http['rss_growth']:+.1f} %)"
    )


def _post(url: str, body: dict) -> tuple[int, float]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError:
        status = -1
    return status, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--min-seconds", type=float, default=0.0, help="keep sending this long")
    ap.add_argument("--name", default="serve_load")
    args = ap.parse_args()

    rec = Recommender.from_run(args.run)
    if rec.dataset is None:
        sys.exit(f"{args.run}: its prepared data is gone; the benchmark replays its histories")
    seqs = rec.dataset.sequences
    users = np.arange(seqs.n_users)
    external = [[rec.item_ids[i - 1] for i in seqs[u]] for u in users]

    # 1. the library: batch scoring of every user's full history, and one history at a time
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    rec.recommend_encoded([seqs[u] for u in users], args.k)
    batch_s = time.perf_counter() - start
    one = []
    for u in users[:500]:
        t = time.perf_counter()
        rec.recommend_encoded([seqs[u]], args.k)
        one.append(time.perf_counter() - t)

    # 2. the HTTP service in its own process
    port = _free_port()
    seqrec = Path(sys.executable).with_name("seqrec")
    cmd = [str(seqrec), "serve", args.run, "--port", str(port), "--workers", str(args.workers)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(external), size=args.requests)
        bodies = [{"history": external[i][-200:], "k": args.k} for i in picks]
        for b in bodies[:50]:  # warm-up
            _post(base + "/recommend", b)
        rss_start = _rss_mib(server.pid)
        start = time.perf_counter()
        results: list[tuple[int, float]] = []
        with ThreadPoolExecutor(args.clients) as pool:
            while len(results) < args.requests or time.perf_counter() - start < args.min_seconds:
                results += pool.map(lambda b: _post(base + "/recommend", b), bodies)
        wall = time.perf_counter() - start
        rss_end = _rss_mib(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    statuses = np.array([s for s, _ in results])
    lat = np.array([t for _, t in results]) * 1000
    http = {
        "requests": len(results),
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth": (rss_end / rss_start - 1) if rss_start and rss_end else None,
        "clients": args.clients,
        "server_workers": args.workers,
        "errors": int((statuses != 200).sum()),
        "requests_per_s": len(results) / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "wall_s": wall,
    }
    library = {
        "histories": int(len(users)),
        "batch_histories_per_s": len(users) / batch_s,
        "batch_s": batch_s,
        "one_history_p50_ms": float(np.percentile(one, 50) * 1000),
        "one_history_p99_ms": float(np.percentile(one, 99) * 1000),
    }
    md = (
        f"# Serving `{Path(args.run).name}` ({rec.run.config.model}, {rec.n_items:,} items, "
        f"max_len {rec.max_len})\n\n"
        "## HTTP service (`seqrec serve`, its own process, 127.0.0.1)\n\n"
        "| requests | clients | workers | seconds | errors | requests/s | p50 ms | p99 ms "
        "| server RSS start → end |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        f"| {http['requests']:,} | {http['clients']} | {http['server_workers']} | "
        f"{http['wall_s']:.0f} | {http['errors']} | {http['requests_per_s']:.0f} | "
        f"{http['p50_ms']:.1f} | {http['p99_ms']:.1f} | {_rss_cell(http)} |\n\n"
        "Each request: one real user's history (its last 200 items), top-"
        f"{args.k}, history items excluded.\n\n"
        "## Library (`Recommender`, in process)\n\n"
        "| batch scoring, every user's full history | one history p50 | one history p99 |\n"
        "|---|---|---|\n"
        f"| {library['batch_histories_per_s']:.0f} histories/s ({library['histories']:,} in "
        f"{library['batch_s']:.2f} s) | {library['one_history_p50_ms']:.2f} ms | "
        f"{library['one_history_p99_ms']:.2f} ms |\n"
    )
    payload = {"run": args.run, "http": http, "library": library}
    paths = write_results(args.name, payload, md, seeds={"requests": 0}, runs=[Path(args.run)])
    print(md)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
