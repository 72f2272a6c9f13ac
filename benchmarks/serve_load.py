"""Serving figures for a trained run: the HTTP service under a bounded local load (N requests
from C concurrent clients, each a real history of the run's data; throughput, p50/p99 latency,
errors), and the library's batch scoring (histories/s) and one-history latency.

    python benchmarks/serve_load.py RUN_DIR [--requests 5000] [--clients 8] [--k 10]
        [--workers 1] [--min-seconds 0] [--name serve_load] [--new-connections]
        [--serve 'SEQREC SERVE FLAGS' ...]

The server is started as a separate process (`seqrec serve`) on 127.0.0.1, once per `--serve`
setting (the same requests each time, so settings compare within one run), and stopped after
its load. Each client thread keeps one connection open (`--new-connections`: a new one per
request). A soak: `--requests 20000 --name serve_soak` keeps sending until both the count and
`--min-seconds` are reached, and records the server's resident memory (RSS, from /proc) after
the warm-up and at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
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
    """One request on a new connection (urllib)."""
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


_CONNECTIONS = threading.local()


def _post_keep_alive(port: int, body: dict) -> tuple[int, float]:
    """One request on this client thread's persistent connection (as a reverse proxy or an
    HTTP client library keeps them), opened again when the server closed it."""
    data = json.dumps(body).encode()
    start = time.perf_counter()
    for attempt in (0, 1):
        conn = getattr(_CONNECTIONS, "conn", None)
        if conn is None:
            conn = _CONNECTIONS.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/recommend", data, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.getheader("connection", "").lower() == "close":
                conn.close()
                _CONNECTIONS.conn = None
            return r.status, time.perf_counter() - start
        except (http.client.HTTPException, OSError):
            conn.close()
            _CONNECTIONS.conn = None  # closed by the server between requests: once more
            if attempt:
                return -1, time.perf_counter() - start
    return -1, time.perf_counter() - start


def _load(args: argparse.Namespace, flags: list[str], bodies: list[dict]) -> dict:
    """`seqrec serve RUN flags` in its own process under the load: its figures."""
    port = _free_port()
    seqrec = Path(sys.executable).with_name("seqrec")
    cmd = [str(seqrec), "serve", args.run, "--port", str(port), "--workers", str(args.workers)]
    cmd += ["--no-access-log", *flags]
    base = f"http://127.0.0.1:{port}"

    def post(body: dict) -> tuple[int, float]:
        if args.new_connections:
            return _post(base + "/recommend", body)
        return _post_keep_alive(port, body)

    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        for b in bodies[:50]:  # warm-up
            post(b)
        rss_start = _rss_mib(server.pid)
        start = time.perf_counter()
        results: list[tuple[int, float]] = []
        with ThreadPoolExecutor(args.clients) as pool:
            while len(results) < args.requests or time.perf_counter() - start < args.min_seconds:
                results += pool.map(post, bodies)
            wall = time.perf_counter() - start
            rss_end = _rss_mib(server.pid)
            # each client thread's connection closes with it
            list(pool.map(lambda _: _close_connection(), range(args.clients)))
    finally:
        server.terminate()
        server.wait(timeout=30)
    statuses = np.array([s for s, _ in results])
    lat = np.array([t for _, t in results]) * 1000
    return {
        "serve_flags": " ".join(flags),
        "requests": len(results),
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth": (rss_end / rss_start - 1) if rss_start and rss_end else None,
        "clients": args.clients,
        "connections": "new" if args.new_connections else "keep-alive",
        "server_workers": args.workers,
        "errors": int((statuses != 200).sum()),
        "requests_per_s": len(results) / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "wall_s": wall,
    }


def _close_connection() -> None:
    conn = getattr(_CONNECTIONS, "conn", None)
    if conn is not None:
        conn.close()
        _CONNECTIONS.conn = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--min-seconds", type=float, default=0.0, help="keep sending this long")
    ap.add_argument("--name", default="serve_load")
    ap.add_argument(
        "--new-connections", action="store_true", help="a new connection per request (urllib)"
    )
    ap.add_argument(
        "--serve",
        action="append",
        default=[],
        metavar="FLAGS",
        help="`seqrec serve` flags of one server setting, measured in turn (repeatable; "
        "none: the defaults), e.g. --serve '--micro-batch 1' --serve '--threads 1'",
    )
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

    # 2. the HTTP service in its own process, once per server setting, the same requests
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(external), size=args.requests)
    bodies = [{"history": external[i][-200:], "k": args.k} for i in picks]
    settings = args.serve or [""]
    rows = [_load(args, flags.split(), bodies) for flags in settings]
    library = {
        "histories": int(len(users)),
        "batch_histories_per_s": len(users) / batch_s,
        "batch_s": batch_s,
        "one_history_p50_ms": float(np.percentile(one, 50) * 1000),
        "one_history_p99_ms": float(np.percentile(one, 99) * 1000),
    }
    table = "".join(
        f"| `{h['serve_flags'] or '(defaults)'}` | {h['requests']:,} | {h['clients']} | "
        f"{h['connections']} | {h['server_workers']} | {h['wall_s']:.0f} | {h['errors']} | "
        f"{h['requests_per_s']:.0f} | {h['p50_ms']:.1f} | {h['p99_ms']:.1f} | {_rss_cell(h)} |\n"
        for h in rows
    )
    md = (
        f"# Serving `{Path(args.run).name}` ({rec.run.config.model}, {rec.n_items:,} items, "
        f"max_len {rec.max_len})\n\n"
        "## HTTP service (`seqrec serve`, its own process, 127.0.0.1)\n\n"
        "| serve flags | requests | clients | connections | workers | seconds | errors "
        "| requests/s | p50 ms | p99 ms | server RSS start → end |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{table}\n"
        "Each request: one real user's history (its last 200 items), top-"
        f"{args.k}, history items excluded; the clients are threads of the benchmark's process "
        "on the same cores as the server; `--no-access-log` throughout.\n\n"
        "## Library (`Recommender`, in process)\n\n"
        "| batch scoring, every user's full history | one history p50 | one history p99 |\n"
        "|---|---|---|\n"
        f"| {library['batch_histories_per_s']:.0f} histories/s ({library['histories']:,} in "
        f"{library['batch_s']:.2f} s) | {library['one_history_p50_ms']:.2f} ms | "
        f"{library['one_history_p99_ms']:.2f} ms |\n"
    )
    payload = {"run": args.run, "http": rows[0], "settings": rows, "library": library}
    paths = write_results(args.name, payload, md, seeds={"requests": 0}, runs=[Path(args.run)])
    print(md)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
