"""Probes on one GPU, several at once: `seqrec train` runs of shipped configs under settings,
each to its own epoch count, side by side on the card (a small model leaves most of it idle).

    python benchmarks/gpu_sweep.py --data-dir DIR [--probes NAME,...] [--jobs 12]
        [--cap 330s] [--deadline 500] [--out DIR] [--name sasrec_bce_gpu_probes]

Each probe trains from scratch with the state chosen on validation as its config says, then
its test metrics under the three protocols are read from metrics.json. `--cap` is a time
budget on every run's training, a safety net: a run it cuts says so (its epochs below its
config's). `--deadline` stops what is still running and writes what finished. The results
(benchmarks/results/<area>/<name>.{md,json}, copied to --out) are written after each run ends.
The probes answer where a row under the papers' protocols needs more than the CPU rows gave
(docs/results/sasrec.md): SASRec (BCE) on ML-1M against BERT4Rec's Table 2 (pop100) and SASRec's
Table III (uni100), and on Beauty against BERT4Rec's Table 2. Timings of runs sharing the card
are not speeds of one run; the epochs and metrics are what the probes are for.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from _common import copy_results, device_info, paper_beauty, paper_ml1m, write_results

# the CPU speed options of ml-1m-sasrec's header: 3x the sequences per second there
FAST = (
    "sasrec.attn_dropout=0",
    'sasrec.dropout_impl="fast"',
    "next_item.bucket_batches=32",
    'next_item.loss_norm="epoch"',
)
POP = ('train.negative_sampling="popularity"',)

# name: (dataset, config, settings); every probe is SASRec (BCE) as its config ships it
PROBES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ml1m-200": ("ml-1m", "ml-1m-sasrec", ()),
    "ml1m-fast": ("ml-1m", "ml-1m-sasrec", FAST),
    "ml1m-pop": ("ml-1m", "ml-1m-sasrec", POP),
    "ml1m-d128": ("ml-1m", "ml-1m-sasrec", ("sasrec.d_model=128",)),
    "ml1m-400": ("ml-1m", "ml-1m-sasrec", ("train.max_epochs=400",)),
    "ml1m-pop-d128": ("ml-1m", "ml-1m-sasrec", (*POP, "sasrec.d_model=128")),
    "beauty-200": ("beauty", "beauty-sasrec", ()),
    "beauty-d128": ("beauty", "beauty-sasrec", ("sasrec.d_model=128",)),
    "beauty-pop": ("beauty", "beauty-sasrec", POP),
    "beauty-400": ("beauty", "beauty-sasrec", ("train.max_epochs=400",)),
    "beauty-d128-do3": (
        "beauty",
        "beauty-sasrec",
        ("sasrec.d_model=128", "sasrec.dropout=0.3", "sasrec.attn_dropout=0.3"),
    ),
    "beauty-d256": ("beauty", "beauty-sasrec", ("sasrec.d_model=256",)),
}


def _head(name: str) -> dict[str, Any]:
    data, config, sets = PROBES[name]
    return {"probe": name, "data": data, "config": config, "sets": list(sets)}


def _row(name: str, out: Path, rc: int | None, stderr: str) -> dict[str, Any]:
    row = _head(name)
    if not (out / "metrics.json").exists():
        return {**row, "error": f"rc {rc}: " + " | ".join(stderr.strip().splitlines()[-3:])}
    m = json.loads((out / "metrics.json").read_text())
    return {
        **row,
        "epochs": m["epochs"],
        "best_epoch": m.get("best_epoch"),
        "stopped": m.get("stopped"),
        "train_time_s": round(m["train_time_s"], 1),
        "valid": {p: {k: m["valid"][p][k] for k in ("hr@10", "ndcg@10")} for p in m["valid"]},
        "test": {p: {k: m["test"][p][k] for k in ("hr@10", "ndcg@10")} for p in m["test"]},
    }


def _markdown(result: dict[str, Any]) -> str:
    dev = result["device"]
    md = (
        f"# SASRec (BCE) probes on one GPU ({dev.get('name', dev['device'])}, "
        f"up to {result['jobs']} runs at once)\n\n"
        "Test split, the state chosen on validation full NDCG@10, training seed 0.\n\n"
        "| probe | config | settings | epochs | best epoch | full NDCG@10 | uni100 HR@10 | "
        "uni100 NDCG@10 | pop100 HR@10 | pop100 NDCG@10 |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in result["rows"]:
        if "test" not in r:
            md += f"| {r['probe']} | `{r['config']}` | {r.get('error', '')} |\n"
            continue
        t = r["test"]
        md += (
            f"| {r['probe']} | `{r['config']}` | {' '.join(r['sets']) or 'as shipped'} | "
            f"{r['epochs']} | {r['best_epoch']} | {t['full']['ndcg@10']:.4f} | "
            f"{t['uni100']['hr@10']:.4f} | {t['uni100']['ndcg@10']:.4f} | "
            f"{t['pop100']['hr@10']:.4f} | {t['pop100']['ndcg@10']:.4f} |\n"
        )
    return md + f"\nTotal {result['seconds']:.0f} s.\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--probes", default=",".join(PROBES))
    ap.add_argument("--jobs", type=int, default=12, help="runs at once")
    ap.add_argument("--cap", default="330s", help="time budget on each run's training")
    ap.add_argument("--deadline", type=float, default=500.0, help="seconds for all")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", default="/tmp/seqrec-gpu-sweep")
    ap.add_argument("--out", help="also copy the results here (the device tool's $OUT)")
    ap.add_argument("--name", default="sasrec_bce_gpu_probes")
    args = ap.parse_args()
    names = args.probes.split(",")
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        sys.exit(f"gpu_sweep: unknown probe(s) {unknown}; known: {', '.join(PROBES)}")
    files = {"ml-1m": paper_ml1m(args.data_dir), "beauty": paper_beauty(args.data_dir)}
    runs = Path(args.runs)
    result: dict[str, Any] = {
        "device": device_info(args.device),
        "jobs": args.jobs,
        "cap": args.cap,
        "rows": [],
    }
    start = time.perf_counter()

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - start, 1)
        order = {n: i for i, n in enumerate(names)}
        result["rows"].sort(key=lambda r: order[r["probe"]])
        paths = write_results(
            args.name,
            result,
            _markdown(result),
            seeds={"train": 0, "candidates": 42},
            area="sasrec",
        )
        copy_results(paths, args.out)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    waiting = list(names)
    running: dict[str, subprocess.Popen[str]] = {}
    logs: dict[str, TextIO] = {}  # each run's stderr, an open file
    while waiting or running:
        while waiting and len(running) < args.jobs:
            name = waiting.pop(0)
            data, config, sets = PROBES[name]
            out = runs / name
            if out.exists():
                shutil.rmtree(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "seqrec", "train", "sasrec", "--data", str(files[data])]
            cmd += ["--out", str(out), "--config", config, "--time-budget", args.cap, "--quiet"]
            for s in (f'train.device="{args.device}"', *sets):
                cmd += ["--set", s]
            logs[name] = (runs / f"{name}.err").open("w+")
            running[name] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=logs[name], env=env
            )
        time.sleep(1.0)
        out_of_time = time.perf_counter() - start > args.deadline
        for name, proc in list(running.items()):
            if proc.poll() is None and not out_of_time:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            del running[name]
            err = logs.pop(name)
            err.seek(0)
            row = _row(name, runs / name, proc.returncode, err.read())
            err.close()
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()
        if out_of_time:
            for name in waiting:
                result["rows"].append({**_head(name), "error": "not run: out of time"})
            waiting = []
    save()
    print(_markdown(result))


if __name__ == "__main__":
    main()
