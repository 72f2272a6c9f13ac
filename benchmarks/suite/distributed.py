"""Data-parallel training on one machine: one process with T threads against N ranks (torchrun,
gloo) with T / N threads each, the same config and time budget, the same global batch; their
speed (sequences/s), quality (test full NDCG@10) and the cost of one all-reduce of the model's
gradients between the ranks.

    python benchmarks/speed.py distributed [--data-dir DIR] [--config ml-1m-sasrec-ce]
        [--budget 3m] [--ranks 2] [--threads 2] [--runs-dir DIR] [--name distributed]

Both runs train from scratch into --runs-dir (default $SEQREC_HOME/runs/distributed-*); the
all-reduce is timed in a separate torchrun of this script (`--time-all-reduce`), on a tensor of
the model's parameter count, as DDP sends it (float32).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import paper_ml1m, runs_dir, write_results
from seqrec.training.rundir import RunDir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
    ]


def _train(args: argparse.Namespace, data: Path, out: Path, ranks: int) -> dict:
    """One run: `ranks` processes (1: no torchrun), args.threads in all."""
    if out.exists():
        shutil.rmtree(out)
    threads = args.threads // ranks
    cmd = ["-m", "seqrec", "train", "sasrec", "--data", str(data), "--out", str(out)]
    cmd += ["--config", args.config, "--time-budget", args.budget, "--quiet"]
    cmd += ["--set", f"train.threads={threads}"]
    launcher = [sys.executable] if ranks == 1 else _torchrun(ranks)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    subprocess.run([*launcher, *cmd], check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    run = RunDir(out)
    log, metrics = run.log(), run.metrics() or {}
    speeds = [x["seq_per_s"] for x in log[1:]] or [x["seq_per_s"] for x in log]
    return {
        "ranks": ranks,
        "threads_per_rank": threads,
        "epochs": len(log),
        "steps": log[-1]["step"] if log else 0,
        "seq_per_s": statistics.median(speeds),
        "train_time_s": metrics.get("train_time_s"),
        "wall_s": wall,
        "test_full_ndcg@10": metrics["test"]["full"]["ndcg@10"],
        "test_full_hr@10": metrics["test"]["full"]["hr@10"],
        "run": str(out),
    }


def _time_all_reduce(numel: int, reps: int) -> None:
    """Under torchrun: time `reps` all-reduces of `numel` float32 values; rank 0 prints ms."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    grad = torch.randn(numel)
    for _ in range(5):
        dist.all_reduce(grad)
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(grad)
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(json.dumps({"all_reduce_ms": 1000 * statistics.median(times), "numel": numel}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--config", default="ml-1m-sasrec-ce")
    ap.add_argument("--budget", default="3m")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads in all, per setting")
    ap.add_argument("--runs-dir")
    ap.add_argument("--name", default="distributed")
    ap.add_argument("--time-all-reduce", type=int, metavar="NUMEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.time_all_reduce:
        return _time_all_reduce(args.time_all_reduce, reps=50)

    data = paper_ml1m(args.data_dir)
    root = runs_dir(args.runs_dir)
    rows = [
        _train(args, data, root / f"distributed-{n}x{args.threads // n}", n)
        for n in (1, args.ranks)
    ]
    import torch

    weights = torch.load(Path(rows[0]["run"]) / "model.pt", map_location="cpu", weights_only=True)
    numel = sum(t.numel() for t in weights.values() if t.is_floating_point())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [*_torchrun(args.ranks), __file__, "--time-all-reduce", str(numel)],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    reduce = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    table = "".join(
        f"| {r['ranks']} | {r['threads_per_rank']} | {r['epochs']} | {r['steps']:,} | "
        f"{r['seq_per_s']:.0f} | {r['test_full_hr@10']:.4f} | {r['test_full_ndcg@10']:.4f} |\n"
        for r in rows
    )
    md = (
        f"# Data-parallel training on one machine: `{args.config}`, {args.budget} each\n\n"
        "| processes (ranks) | threads each | epochs | steps | seq/s (median epoch) | "
        "test full HR@10 | test full NDCG@10 |\n|---|---|---|---|---|---|---|\n"
        f"{table}\n"
        f"Speed ratio (ranks / one process): {rows[1]['seq_per_s'] / rows[0]['seq_per_s']:.2f}. "
        f"One all-reduce of the model's {numel:,} float32 gradients between {args.ranks} ranks "
        f"(gloo, 127.0.0.1): {reduce['all_reduce_ms']:.2f} ms (median of 50).\n\n"
        "The global batch is the config's in both (each rank trains on its share of every "
        "batch); the ranks' processes are launched by torchrun.\n"
    )
    payload = {"config": args.config, "budget": args.budget, "rows": rows, **reduce}
    paths = write_results(
        args.name,
        payload,
        md,
        seeds={"train": 0},
        runs=[Path(r["run"]) for r in rows],
    )
    print(md)
    print("wrote", *paths)
