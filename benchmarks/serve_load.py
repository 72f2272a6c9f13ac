"""Serving figures for a trained run: the HTTP service under a bounded local load (N requests
from C concurrent clients, each a real history of the run's data; throughput, p50/p99 latency,
errors), and the library's batch scoring (histories/s) and one-history latency.

    python benchmarks/serve_load.py RUN_DIR [--clients 8] [--k 10] [--workers 1]
        [--client wrk|python] [--seconds 10] [--requests 5000] [--min-seconds 0]
        [--name serve_load] [--new-connections] [--serve 'SEQREC SERVE FLAGS' ...]

The server is started as a separate process (`seqrec serve`) on 127.0.0.1, once per `--serve`
setting (the same requests each time, so settings compare within one run), and stopped after
its load. The load: `--clients` concurrent clients, each sending its next request when its last
is answered, over a connection it keeps open; wrk (`apt install wrk`, a load generator in C,
for `--seconds`) when it is installed, else threads of this process (`--requests`;
`--new-connections`: a new connection per request). The server's resident memory (RSS, from
/proc) is read after the warm-up and at the end: a soak is a long run (`--seconds 60 --name
serve_soak`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from _common import write_results
from seqrec.serving.recommender import Recommender


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


def _batching(base: str, before: dict | None = None) -> dict | None:
    """The server's micro-batching counts (GET /model), less `before`'s; None if it has none."""
    try:
        with urllib.request.urlopen(base + "/model", timeout=30) as r:
            now = json.loads(r.read()).get("micro_batching")
    except (OSError, ValueError):
        return None
    if now is None or before is None:
        return now
    return {k: now[k] - before[k] for k in ("batches", "requests", "scoring_s")}


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of every core (/proc/stat); None where there is none."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _busy(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """The fraction of every core's time busy between two `_cpu_times`."""
    if before is None or after is None:
        return None
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9)


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


# wrk's script: every request the next of the benchmark's bodies (one JSON body a line)
STARTUP_S = 900  # seconds a server may take to load its run

WRK_SCRIPT = """
local bodies = {}
for line in io.lines(os.getenv("SEQREC_BODIES")) do bodies[#bodies + 1] = line end
local i = 0
local headers = {["Content-Type"] = "application/json"}
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/recommend", headers, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format("SEQREC %d %d %d %d %f %f\\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout, summary.errors.status, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _load(args: argparse.Namespace, flags: list[str], bodies: list[dict]) -> dict:
    """`seqrec serve RUN flags` in its own process under the load: its figures."""
    port = _free_port()
    seqrec = Path(sys.executable).with_name("seqrec")
    cmd = [str(seqrec), "serve", args.run, "--port", str(port), "--workers", str(args.workers)]
    cmd += ["--no-access-log", *flags]
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # a catalogue of millions takes a minute or more to load (its model and index files
        # read and verified): wait for it, and say so if the server never answers
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    err = server.communicate()[1].decode(errors="replace")[-2000:]
                    said = f"seqrec serve did not come up ({' '.join(cmd)}):\n{err}"
                    raise SystemExit(said) from None
                time.sleep(0.2)
        for b in bodies[:50]:  # warm-up
            _post(base + "/recommend", b)
        drive = _drive_wrk if args.client == "wrk" else _drive_python
        rss_start = _rss_mib(server.pid)
        batched, cpu = _batching(base), _cpu_times()
        http = drive(args, port, bodies)
        batched, cpu_busy = _batching(base, batched), _busy(cpu, _cpu_times())
        rss_end = _rss_mib(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    if args.workers > 1:  # /model answers for one worker process: its counts are not the load's
        batched = None
    if batched is not None and batched["batches"]:
        batched = {
            "mean_batch": batched["requests"] / batched["batches"],
            "ms_per_batch": 1000 * batched["scoring_s"] / batched["batches"],
            "scoring_busy": batched["scoring_s"] / http["wall_s"],
        }
    return {
        "serve_flags": " ".join(flags),
        **http,
        "micro_batching": batched,  # the load's batches: size, scoring time, the model's busy share
        "cpu_busy": cpu_busy,  # the machine's cores busy during the load (Linux), a fraction of all
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth": (rss_end / rss_start - 1) if rss_start and rss_end else None,
        "clients": args.clients,
        "client": args.client,
        "connections": "new" if args.new_connections else "keep-alive",
        "server_workers": args.workers,
    }


def _drive_python(args: argparse.Namespace, port: int, bodies: list[dict]) -> dict:
    """Client threads of this process, each one request at a time, until `--requests` (and
    `--min-seconds`) are reached."""

    def post(body: dict) -> tuple[int, float]:
        if args.new_connections:
            return _post(f"http://127.0.0.1:{port}/recommend", body)
        return _post_keep_alive(port, body)

    start = time.perf_counter()
    results: list[tuple[int, float]] = []
    with ThreadPoolExecutor(args.clients) as pool:
        while len(results) < args.requests or time.perf_counter() - start < args.min_seconds:
            results += pool.map(post, bodies)
        wall = time.perf_counter() - start
        list(pool.map(lambda _: _close_connection(), range(args.clients)))
    statuses = np.array([s for s, _ in results])
    lat = np.array([t for _, t in results]) * 1000
    return {
        "requests": len(results),
        "errors": int((statuses != 200).sum()),
        "requests_per_s": len(results) / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "wall_s": wall,
    }


def _drive_wrk(args: argparse.Namespace, port: int, bodies: list[dict]) -> dict:
    """wrk (a C load generator: one thread, `--clients` keep-alive connections, each one
    request at a time) for `--seconds`, cycling through the same bodies."""
    with tempfile.TemporaryDirectory() as tmp:
        script, lines = Path(tmp) / "bodies.lua", Path(tmp) / "bodies.jsonl"
        script.write_text(WRK_SCRIPT)
        lines.write_text("".join(json.dumps(b) + "\n" for b in bodies))
        cmd = ["wrk", "-t", "1", "-c", str(args.clients), "-d", f"{args.seconds:g}s"]
        cmd += ["-s", str(script), f"http://127.0.0.1:{port}/recommend"]
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "SEQREC_BODIES": str(lines)},
        ).stdout
    fields = next(line for line in out.splitlines() if line.startswith("SEQREC ")).split()[1:]
    requests, socket_errors, status_errors = (int(x) for x in fields[:3])
    duration_us, p50_us, p99_us = (float(x) for x in fields[3:])
    return {
        "requests": requests,
        "errors": socket_errors + status_errors,
        "requests_per_s": requests / (duration_us / 1e6),
        "p50_ms": p50_us / 1000,
        "p99_ms": p99_us / 1000,
        "wall_s": duration_us / 1e6,
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
        "--client",
        choices=["wrk", "python"],
        default="wrk" if shutil.which("wrk") else "python",
        help="the load generator: wrk (C, when installed; --seconds) or client threads of this "
        "process (--requests)",
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="wrk: how long to send")
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
        f"| `{h['serve_flags'] or '(defaults)'}` | {h['client']} | {h['requests']:,} | "
        f"{h['clients']} | {h['connections']} | {h['server_workers']} | {h['wall_s']:.0f} | "
        f"{h['errors']} | "
        f"{h['requests_per_s']:.0f} | {h['p50_ms']:.1f} | {h['p99_ms']:.1f} | {_rss_cell(h)} |\n"
        for h in rows
    )
    md = (
        f"# Serving `{Path(args.run).name}` ({rec.run.config.model}, {rec.n_items:,} items, "
        f"max_len {rec.max_len})\n\n"
        "## HTTP service (`seqrec serve`, its own process, 127.0.0.1)\n\n"
        "| serve flags | load generator | requests | clients | connections | workers | seconds "
        "| errors | requests/s | p50 ms | p99 ms | server RSS start → end |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{table}\n"
        "Each request: one real user's history (its last 200 items), top-"
        f"{args.k}, history items excluded; the load generator runs on the same cores as the "
        "server (wrk: one thread of C; python: threads of the benchmark's process); "
        "`--no-access-log` throughout.\n\n"
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
