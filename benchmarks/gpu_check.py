"""The GPU check: what one CUDA GPU gives with the shipped recipes, in under 10 minutes.

    python benchmarks/gpu_check.py --data-dir DIR [--budget 60s] [--batch-budget 30s]
        [--batches 128,512,2048] [--out DIR] [--device cuda] [--skip-tests]

1. the CUDA tests (tests/test_cuda.py, and the training and evaluation tests, whose runs take
   the GPU when there is one);
2. time to quality: `ml-1m-bert4rec` and `ml-1m-sasrec-ce` on the papers' ML-1M file under
   --budget each, no other flag: test NDCG@10 under the three protocols, epochs, seq/s;
3. throughput by batch: `ml-1m-bert4rec` at each of --batches for --batch-budget, the learning
   rate scaled by the square root of batch / 128 and the warm-up steps by its inverse (the scaling
   guide's starting rule), seq/s and test full NDCG@10.

Writes benchmarks/results/performance/gpu_check.{md,json} and copies them to --out (the
device tool's $OUT). benchmarks/gpu_check.sh runs it on a device machine (carried wheels, the
data folder). --device cpu --budget 10s is its dry run on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import paper_ml1m, write_results

ROOT = Path(__file__).resolve().parents[1]


def _train(
    model: str, config: str, data: Path, out: Path, budget: str, device: str, *sets: str
) -> dict[str, Any]:
    """One `seqrec train` run from scratch: what its metrics record."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "seqrec", "train", model, "--data", str(data), "--out", str(out)]
    cmd += ["--config", config, "--time-budget", budget, "--quiet"]
    for s in (f'train.device="{device}"', *sets):
        cmd += ["--set", s]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"config": config, "error": done.stderr.strip().splitlines()[-1:]}
    m = json.loads((out / "metrics.json").read_text())
    return {
        "config": config,
        "sets": list(sets),
        "budget": budget,
        "wall_s": round(time.perf_counter() - start, 1),
        "epochs": m["epochs"],
        "train_time_s": m["train_time_s"],
        "seq_per_s": m["seq_per_s"],
        "precision": m.get("precision"),
        "test": {p: {k: m["test"][p][k] for k in ("hr@10", "ndcg@10")} for p in m["test"]},
    }


def _tests(device: str) -> dict[str, Any]:
    files = ["tests/test_cuda.py", "tests/test_train.py", "tests/test_evaluate.py"]
    env = {"SEQREC_TEST_DEVICE": device} if device != "cuda" else {}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, **env},
    )
    final = re.compile(r"\d+ (passed|failed|skipped|errors?)\b.* in [\d.]+s")
    counts = [x for x in done.stdout.splitlines() if final.search(x)]
    return {
        "files": files,
        "returncode": done.returncode,
        "summary": counts[-1:] or [f"pytest exit status {done.returncode}"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def _device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            name=p.name, memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count
        )
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--budget", default="60s")
    ap.add_argument("--batch-budget", default="30s")
    ap.add_argument("--batches", default="128,512,2048")
    ap.add_argument("--out", help="also copy the results here (the device tool's $OUT)")
    ap.add_argument("--runs", default="/tmp/seqrec-gpu-check")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--name", default="gpu_check")
    args = ap.parse_args()
    data = paper_ml1m(args.data_dir)
    runs = Path(args.runs)
    start = time.perf_counter()
    result: dict[str, Any] = {"device": _device_info(args.device)}
    print(json.dumps(result["device"]), flush=True)
    if not args.skip_tests:
        result["tests"] = _tests(args.device)
        print("tests:", result["tests"]["summary"], flush=True)
    result["time_to_quality"] = [
        _train(model, cfg, data, runs / cfg, args.budget, args.device)
        for model, cfg in (("bert4rec", "ml-1m-bert4rec"), ("sasrec", "ml-1m-sasrec-ce"))
    ]
    print(json.dumps(result["time_to_quality"]), flush=True)
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        scale = math.sqrt(b / 128)
        sets = (
            f"train.batch_size={b}",
            f"train.lr={2e-3 * scale:.6g}",
            f"train.warmup_steps={round(200 / scale)}",
        )
        rows.append(
            _train(
                "bert4rec",
                "ml-1m-bert4rec",
                data,
                runs / f"batch-{b}",
                args.batch_budget,
                args.device,
                *sets,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    result["by_batch"] = rows
    result["seconds"] = round(time.perf_counter() - start, 1)

    def cell(r: dict[str, Any], p: str) -> str:
        return f"{r['test'][p]['ndcg@10']:.4f}" if "test" in r else "error"

    ttq = "".join(
        f"| `{r['config']}` | {r.get('budget', '')} | {r.get('epochs', '')} | "
        f"{r.get('seq_per_s', 0):,.0f} | {cell(r, 'full')} | {cell(r, 'uni100')} | "
        f"{cell(r, 'pop100')} |\n"
        for r in result["time_to_quality"]
    )
    by_batch = "".join(
        f"| {b} | {' '.join(r.get('sets', [])[1:])} | {r.get('epochs', '')} | "
        f"{r.get('seq_per_s', 0):,.0f} | {cell(r, 'full')} |\n"
        for b, r in zip(args.batches.split(","), rows, strict=True)
    )
    dev = result["device"]
    tests = result.get("tests", {})
    md = (
        f"# The GPU check: {dev.get('name', dev['device'])}, torch {dev['torch']}\n\n"
        + (
            f"CUDA tests ({', '.join(tests['files'])}): {' '.join(tests['summary'][-1:])}\n\n"
            if tests
            else ""
        )
        + "## Time to quality (the shipped configs, no other flag)\n\n"
        "| config | budget | epochs | seq/s | test full NDCG@10 | uni100 | pop100 |\n"
        f"|---|---|---|---|---|---|---|\n{ttq}\n"
        f"## BERT4Rec throughput by batch ({args.batch_budget} each; lr x sqrt(batch/128), "
        "warm-up / sqrt)\n\n"
        "| batch | lr, warm-up | epochs | seq/s | test full NDCG@10 |\n|---|---|---|---|---|\n"
        f"{by_batch}\nTotal {result['seconds']:.0f} s.\n"
    )
    paths = write_results(
        args.name, result, md, seeds={"train": 0, "candidates": 42}, area="performance"
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(args.out) / p.name)
    print(md)


if __name__ == "__main__":
    main()
