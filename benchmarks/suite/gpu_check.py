"""The GPU check: what one CUDA GPU gives with the shipped recipes, in under 10 minutes.

    python benchmarks/gpu.py check --data-dir DIR [--budget 60s] [--out DIR] [--device cuda]
        [--deadline 540] [--window 3] [--recipes NAME,...] [--skip-tests]

1. time to quality: `seqrec train` of recipes of `RECIPES` (default: the shipped configs, no
   flag, and `sasrec-ce-ddp1`, the SASRec+CE one launched by torchrun as one NCCL rank: the
   distributed path on the GPU; `lrurec-5m`, the single model for 5 minutes, on request) on the
   papers' ML-1M file under --budget or the recipe's own (`BUDGETS`): test NDCG@10 and HR@10
   under the three protocols, epochs, sequences/s and the GPU's utilisation (nvidia-smi,
   sampled every 0.5 s) during the run;
2. throughput (in one process, no run directory): `ml-1m-bert4rec` and `ml-1m-sasrec-ce`
   training steps at several batch sizes, with and without batches built ahead
   (`train.prefetch`), bf16 autocast and packing: sequences/s over about --window seconds of
   whole epochs after a warm-up epoch, the loop's own way (losses read every 50 steps), and the
   GPU memory it took;
3. the CUDA tests (tests/test_cuda.py and the training, loss and evaluation tests, whose runs
   take the GPU when there is one) in the time left before --deadline.

Writes benchmarks/results/performance/gpu_check.{md,json} after each part (and copies them to
--out, the device tool's $OUT), so a run cut short still returns what it measured.
benchmarks/gpu_check.sh runs it on a device machine (carried wheels, the data folder).
--device cpu --budget 10s --window 2 is its dry run on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import copy_results, device_info, paper_ml1m, write_results

ROOT = Path(__file__).resolve().parents[1]

# The runs, by name: (model, config, settings). The shipped configs as they are (on a GPU
# their `device = "cuda"` tier applies), and the probes that chose those tiers: a batch, its
# learning rate by the square-root rule from the CPU recipe's, warm-up steps by its inverse,
# validation and checkpoints less often (an epoch is a fraction of a second there).
GPU_COMMON = ("train.prefetch=4", "train.fused_adamw=true", "train.checkpoint_every=20")
SHIPPED = ("bert4rec", "sasrec-ce")


def _bert4rec_probe(
    batch: int, lr: float, warmup: int, *more: str
) -> tuple[str, str, tuple[str, ...]]:
    """`ml-1m-bert4rec` at a batch, learning rate and warm-up, validated every 20 epochs."""
    sets = (f"train.batch_size={batch}", f"train.lr={lr}", f"train.warmup_steps={warmup}")
    return ("bert4rec", "ml-1m-bert4rec", (*sets, "train.eval_every=20", *more, *GPU_COMMON))


# nn.Dropout (one fused kernel on CUDA) instead of the recipe's CPU-cheap mask
TORCH_DROPOUT = "bert4rec.dropout_impl=torch"
RECIPES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "bert4rec": ("bert4rec", "ml-1m-bert4rec", ()),
    "sasrec-ce": ("sasrec", "ml-1m-sasrec-ce", ()),
    # the shipped GPU recipe under other training seeds
    "bert4rec-s1": ("bert4rec", "ml-1m-bert4rec", ("train.seed=1",)),
    "bert4rec-s2": ("bert4rec", "ml-1m-bert4rec", ("train.seed=2",)),
    "bert4rec-b512": _bert4rec_probe(512, 0.004, 100),
    "bert4rec-b1024": _bert4rec_probe(1024, 0.00566, 71),
    "bert4rec-b1024-lr4": _bert4rec_probe(1024, 0.004, 100),
    "bert4rec-b768": _bert4rec_probe(768, 0.004, 100),
    "bert4rec-b768-td": _bert4rec_probe(768, 0.004, 100, TORCH_DROPOUT),
    "bert4rec-b1024-td": _bert4rec_probe(1024, 0.004, 100, TORCH_DROPOUT),
    "sasrec-ce-b128": (
        "sasrec",
        "ml-1m-sasrec-ce",
        ("train.eval_every=10", *GPU_COMMON),
    ),
    "sasrec-ce-b256": (
        "sasrec",
        "ml-1m-sasrec-ce",
        ("train.batch_size=256", "train.eval_every=10", *GPU_COMMON),
    ),
    # LRURec (its authors' recipe, the best single model on ML-1M on a CPU: 0.1938 in 60 minutes
    # on two cores) for 5 minutes on the GPU: the single model meant to pass 0.19 there
    "lrurec-5m": ("lrurec", "ml-1m-lrurec", ("train.prefetch=4", "train.checkpoint_every=20")),
}

# recipes with a budget of their own (the others: --budget)
BUDGETS = {"lrurec-5m": "5m"}

# recipes launched by torchrun, by name: the number of ranks (NCCL on the GPU). One rank on one
# GPU: the distributed path (process group, DDP's gradient hooks, rank-0 writing) end to end,
# beside the same recipe in one plain process; several ranks need as many GPUs.
LAUNCHED = {"sasrec-ce-ddp1": 1}
RECIPES["sasrec-ce-ddp1"] = RECIPES["sasrec-ce"]

# throughput rows: (config, settings)
_B = "ml-1m-bert4rec"
_S = "ml-1m-sasrec-ce"
THROUGHPUT: list[tuple[str, tuple[str, ...]]] = [
    (_B, ("train.batch_size=128", "train.prefetch=0")),
    (_B, ("train.batch_size=128", "train.prefetch=4")),
    (_B, ("train.batch_size=512", "train.prefetch=0")),
    (_B, ("train.batch_size=512", "train.prefetch=4")),
    (_B, ("train.batch_size=1024", "train.prefetch=4")),
    (_B, ("train.batch_size=2048", "train.prefetch=4")),
    (_B, ("train.batch_size=1024", "train.prefetch=4", "train.bf16=true")),
    (_B, ("train.batch_size=1024", "train.prefetch=4", "cloze.pack=false")),
    (_B, ("train.batch_size=512", "train.prefetch=4", "bert4rec.dropout_impl=torch")),
    (_B, ("train.batch_size=768", "train.prefetch=4")),
    (_B, ("train.batch_size=768", "train.prefetch=4", "bert4rec.dropout_impl=torch")),
    (_B, ("train.batch_size=1024", "train.prefetch=4", "bert4rec.dropout_impl=torch")),
    (_S, ("train.batch_size=128", "train.prefetch=0")),
    (_S, ("train.batch_size=128", "train.prefetch=4")),
    (_S, ("train.batch_size=256", "train.prefetch=4")),
    (_S, ("train.batch_size=512", "train.prefetch=4")),
]


def _train_seeds(recipes: str) -> dict[str, int | None]:
    """The training seeds of the recipes run (0 unless a recipe's settings name another):
    {"train": 0} for one, {"train_0": 0, "train_1": 1, ...} for several."""
    seeds = set()
    for name in recipes.split(","):
        sets = RECIPES[name][2] if name in RECIPES else ()
        named = [int(x.split("=", 1)[1]) for x in sets if x.startswith("train.seed=")]
        seeds.add(named[-1] if named else 0)
    if len(seeds) == 1:
        return {"train": seeds.pop()}
    return {f"train_{i}": x for i, x in enumerate(sorted(seeds))}


class GpuMonitor:
    """nvidia-smi's utilisation and memory, sampled every 0.5 s into a file, read by window."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "500",
                ],
                stdout=path.open("wb"),
                stderr=subprocess.DEVNULL,
            )

    def window(self, start: float, end: float) -> dict[str, float] | None:
        """Mean utilisation (%) and peak memory (MiB) of the samples between two time.time()s."""
        if self.proc is None or not self.path.exists():
            return None
        util, mem = [], []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                u, m = float(parts[1]), float(parts[2])
            except (ValueError, IndexError):
                continue
            if start <= stamp <= end:
                util.append(u)
                mem.append(m)
        if not util:
            return None
        return {"util_mean": round(sum(util) / len(util), 1), "mem_peak_mib": max(mem)}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def throughput(
    data: Path, config: str, sets: tuple[str, ...], device: str, window: float
) -> dict[str, Any]:
    """Sequences/s of training steps of `config` with `sets`: whole epochs after a warm-up
    epoch until `window` seconds have passed, the losses read every LOSS_READ_EVERY steps."""
    import torch

    from seqrec.config import RunConfig, load_config
    from seqrec.data.prepare import prepare
    from seqrec.training.loop import LOSS_READ_EVERY, _epochs, prefetched
    from seqrec.training.setup import resolve_device, setup, torch_settings

    cfg = load_config(RunConfig, config, [f'train.device="{device}"', *sets])
    ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
    dev = resolve_device(cfg.train.device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with torch_settings(cfg.train, dev):
        training = setup(ds, cfg, dev)

        # one builder across the epochs' ends, as the training loop's
        stream = prefetched(_epochs(training.sampler, 0, 10**6), cfg.train.prefetch)

        def epoch(e: int, until: float) -> int:
            n, pending = 0, []
            for e_batch, batch in stream:
                if e_batch < e:
                    continue
                if batch is None:
                    break
                pending.append(training.step(batch))
                n += batch.size
                if len(pending) >= LOSS_READ_EVERY:
                    float(torch.stack(pending).sum())
                    pending = []
                if time.perf_counter() > until:
                    break
            if pending:
                float(torch.stack(pending).sum())
            return n

        epoch(0, math.inf)  # warm-up
        start, n_seq, e = time.perf_counter(), 0, 1
        while time.perf_counter() - start < window:
            n_seq += epoch(e, start + 4 * window)
            e += 1
        seconds = time.perf_counter() - start
        stream.close()
    out = {
        "config": config,
        "sets": list(sets),
        "seq_per_s": round(n_seq / seconds),
        "sequences": n_seq,
        "seconds": round(seconds, 2),
        "precision": {k: training.precision[k] for k in ("bf16", "loss_bf16")},
    }
    if dev.type == "cuda":
        out["gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        del training
        torch.cuda.empty_cache()  # the training runs that follow are other processes
    return out


def time_to_quality(
    name: str, data: Path, out: Path, budget: str, device: str, monitor: GpuMonitor
) -> dict[str, Any]:
    """One `seqrec train` run of recipe `name` from scratch, for its own budget (`BUDGETS`) or
    `budget`: what its metrics record."""
    model, config, sets = RECIPES[name]
    budget = BUDGETS.get(name, budget)
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable]
    if name in LAUNCHED:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        cmd += [str(LAUNCHED[name])]
    cmd += ["-m", "seqrec", "train", model, "--data", str(data), "--out", str(out)]
    cmd += ["--config", config, "--time-budget", budget, "--quiet"]
    for s in (f'train.device="{device}"', *sets):
        cmd += ["--set", s]
    start, wall = time.perf_counter(), time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    row: dict[str, Any] = {"recipe": name, "config": config, "sets": list(sets), "budget": budget}
    row["ranks"] = LAUNCHED.get(name, 0)  # 0: one plain process, no torchrun
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-3:]}
    m = json.loads((out / "metrics.json").read_text())
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return {
        **row,
        "wall_s": round(time.perf_counter() - start, 1),
        "epochs": m["epochs"],
        "best_epoch": m.get("best_epoch"),
        "train_time_s": m["train_time_s"],
        "seq_per_s": m["seq_per_s"],
        "epoch_seq_per_s_median": sorted(x["seq_per_s"] for x in log)[len(log) // 2],
        "precision": m.get("precision"),
        "gpu": monitor.window(wall, time.time()),
        "test": {p: {k: m["test"][p][k] for k in ("hr@10", "ndcg@10")} for p in m["test"]},
    }


def run_tests(device: str, seconds: float) -> dict[str, Any]:
    files = [
        "tests/test_cuda.py",
        "tests/test_train.py",
        "tests/test_losses.py",
        "tests/test_evaluate.py",
    ]
    env = {**os.environ, **({"SEQREC_TEST_DEVICE": device} if device != "cuda" else {})}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts="]
    cmd += ["-n", "8", *files] if (os.cpu_count() or 1) >= 8 else files  # pytest-xdist there
    start = time.perf_counter()
    rc: int | str
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=max(seconds, 1)
        )
        stdout, rc = done.stdout, done.returncode
    except subprocess.TimeoutExpired as e:
        raw = e.stdout or b""
        stdout = raw.decode() if isinstance(raw, bytes) else raw
        rc = "timeout"
    final = re.compile(r"\d+ (passed|failed|skipped|errors?)\b.* in [\d.]+s")
    counts = [x for x in stdout.splitlines() if final.search(x)]
    failed = [x for x in stdout.splitlines() if x.startswith(("FAILED", "ERROR"))]
    return {
        "files": files,
        "returncode": rc,
        "summary": counts[-1:] or [f"pytest: {rc}"],
        "failed": failed[:20],
        "seconds": round(time.perf_counter() - start, 1),
    }


def _markdown(result: dict[str, Any], budget: str) -> str:
    dev = result["device"]

    def cell(r: dict[str, Any], p: str, k: str = "ndcg@10") -> str:
        return f"{r['test'][p][k]:.4f}" if "test" in r else "error"

    md = f"# The GPU check: {dev.get('name', dev['device'])}, torch {dev['torch']}\n\n"
    rows = result.get("throughput", [])
    if rows:
        md += (
            "## Training throughput (one process, whole epochs after a warm-up epoch)\n\n"
            "| config | settings | sequences/s | GPU memory GiB | bf16, loss bf16 |\n"
            "|---|---|---|---|---|\n"
        )
        for r in rows:
            if "error" in r:
                md += f"| `{r['config']}` | {' '.join(r['sets'])} | error: {r['error']} | | |\n"
                continue
            p = r["precision"]
            md += (
                f"| `{r['config']}` | {' '.join(r['sets'])} | {r['seq_per_s']:,} | "
                f"{r.get('gpu_mem_gib', '')} | {p['bf16']}, {p['loss_bf16']} |\n"
            )
        md += "\n"
    ttq = result.get("time_to_quality", [])
    if ttq:
        md += (
            f"## Time to quality ({budget} of training unless the recipe has its own budget, "
            "test split, training seed 0 unless the settings name another)\n\n"
            "| recipe | settings | budget | epochs | seq/s | GPU util % | test full NDCG@10 | "
            "HR@10 | uni100 NDCG@10 | pop100 NDCG@10 |\n|---|---|---|---|---|---|---|---|---|---|\n"
        )
        for r in ttq:
            if "skipped" in r or "error" in r:
                md += f"| {r['recipe']} | {r.get('skipped') or r.get('error')} |\n"
                continue
            gpu = (r.get("gpu") or {}).get("util_mean", "")
            sets = " ".join(r["sets"]) or "as shipped"
            if r.get("ranks"):
                sets += f"; torchrun, {r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"
            md += (
                f"| {r['recipe']} (`{r['config']}`) | {sets} | {r.get('budget', budget)} | "
                f"{r.get('epochs', '')} | {r.get('seq_per_s', 0):,.0f} | {gpu} | "
                f"{cell(r, 'full')} | {cell(r, 'full', 'hr@10')} | {cell(r, 'uni100')} | "
                f"{cell(r, 'pop100')} |\n"
            )
        md += "\n"
    tests = result.get("tests")
    if tests:
        md += f"CUDA tests ({', '.join(tests['files'])}): {' '.join(tests['summary'][-1:])}\n\n"
    return md + f"Total {result.get('seconds', 0):.0f} s.\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--budget", default="60s")
    ap.add_argument("--window", type=float, default=3.0, help="seconds per throughput row")
    ap.add_argument("--recipes", default=",".join([*SHIPPED, "sasrec-ce-ddp1"]))
    ap.add_argument("--rows", help="throughput rows to measure, by index (default: all)")
    ap.add_argument("--out", help="also copy the results here (the device tool's $OUT)")
    ap.add_argument("--runs", default="/tmp/seqrec-gpu-check")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for all three parts")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--name", default="gpu_check")
    args = ap.parse_args(argv)
    unknown = [n for n in args.recipes.split(",") if n not in RECIPES]
    if unknown:
        ap.error(f"--recipes: unknown {', '.join(unknown)}; expected some of {', '.join(RECIPES)}")
    data = paper_ml1m(args.data_dir)
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    monitor = GpuMonitor(runs / "nvidia-smi.csv")
    result: dict[str, Any] = {"device": device_info(args.device)}
    print(json.dumps(result["device"]), flush=True)

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - start, 1)
        paths = write_results(
            args.name,
            result,
            _markdown(result, args.budget),
            seeds={**_train_seeds(args.recipes), "candidates": 42},
            area="performance",
        )
        copy_results(paths, args.out)

    try:
        result["time_to_quality"] = []
        from seqrec.config import parse_duration

        for name in args.recipes.split(","):
            need = parse_duration(BUDGETS.get(name, args.budget)) + 30
            if time.perf_counter() - start + need > args.deadline:
                result["time_to_quality"].append({"recipe": name, "skipped": "out of time"})
                continue
            row = time_to_quality(name, data, runs / name, args.budget, args.device, monitor)
            result["time_to_quality"].append(row)
            print(json.dumps(row), flush=True)
            save()
        if not args.skip_throughput:
            result["throughput"] = []
            picked = [int(i) for i in args.rows.split(",")] if args.rows else None
            for i, (config, sets) in enumerate(THROUGHPUT):
                if picked is not None and i not in picked:
                    continue
                if time.perf_counter() - start + 4 * args.window > args.deadline - 60:
                    row = {"config": config, "sets": list(sets), "error": "out of time"}
                else:
                    try:
                        row = throughput(data, config, sets, args.device, args.window)
                    except Exception as err:  # one row's failure is reported, the rest run
                        row = {"config": config, "sets": list(sets), "error": repr(err)[:300]}
                result["throughput"].append(row)
                print(json.dumps(row), flush=True)
            save()
        if not args.skip_tests:
            left = args.deadline - (time.perf_counter() - start)
            result["tests"] = run_tests(args.device, left)
            print("tests:", result["tests"]["summary"], result["tests"]["failed"], flush=True)
    finally:
        monitor.close()
        save()
    print(_markdown(result, args.budget))
