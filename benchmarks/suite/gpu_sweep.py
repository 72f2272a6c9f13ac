"""Probes on one GPU, several at once: `seqrec train` runs of shipped configs under settings,
each to its own epoch count, side by side on the card (a small model leaves most of it idle).

    python benchmarks/gpu.py sweep --data-dir DIR [--probes NAME,...] [--seeds 0,1,...]
        [--jobs 12] [--cap 330s] [--deadline 500] [--out DIR] [--name sasrec_bce_gpu_probes]

Each probe trains from scratch, once per training seed, with the state chosen on validation as
its config says (or as its settings say), then its test metrics under the three protocols are
read from metrics.json; with several seeds, each probe's mean and standard deviation too.
`--cap` is a time budget on every run's training, a safety net: a run it cuts says so (its
epochs below its config's). `--deadline` stops what is still running and writes what
finished. The results (benchmarks/results/<area>/<name>.{md,json}, copied to --out) are
written after each run ends.
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
import statistics
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
# the state chosen on the protocol SASRec's Table III reports (the config: validation full NDCG@10)
UNI = ('train.val_protocol="uni100"',)

# name: (dataset, config, settings); every probe is SASRec (BCE) as its config ships it
PROBES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ml1m-200": ("ml-1m", "ml-1m-sasrec", ()),
    "ml1m-fast": ("ml-1m", "ml-1m-sasrec", FAST),
    "ml1m-pop": ("ml-1m", "ml-1m-sasrec", POP),
    "ml1m-d128": ("ml-1m", "ml-1m-sasrec", ("sasrec.d_model=128",)),
    "ml1m-400": ("ml-1m", "ml-1m-sasrec", ("train.max_epochs=400",)),
    "ml1m-pop-d128": ("ml-1m", "ml-1m-sasrec", (*POP, "sasrec.d_model=128")),
    "ml1m-uni": ("ml-1m", "ml-1m-sasrec", UNI),
    "ml1m-d128-uni": ("ml-1m", "ml-1m-sasrec", (*UNI, "sasrec.d_model=128")),
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


def _head(name: str, seed: int) -> dict[str, Any]:
    data, config, sets = PROBES[name]
    return {"probe": name, "seed": seed, "data": data, "config": config, "sets": list(sets)}


def _row(name: str, seed: int, out: Path, rc: int | None, stderr: str) -> dict[str, Any]:
    row = _head(name, seed)
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


# the test metrics of each row and of the seeds' summary, in the tables' order
COLUMNS = (
    ("full", "ndcg@10"),
    ("uni100", "hr@10"),
    ("uni100", "ndcg@10"),
    ("pop100", "hr@10"),
    ("pop100", "ndcg@10"),
)


def seed_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per probe with two or more finished seeds: each test metric's mean and sample standard
    deviation over its seeds, and the seeds counted."""
    out = []
    for name in dict.fromkeys(r["probe"] for r in rows):
        done = [r for r in rows if r["probe"] == name and "test" in r]
        if len(done) < 2:
            continue
        entry: dict[str, Any] = {"probe": name, "seeds": [r["seed"] for r in done], "test": {}}
        for proto, key in COLUMNS:
            values = [r["test"][proto][key] for r in done]
            entry["test"].setdefault(proto, {})[key] = {
                "mean": round(statistics.fmean(values), 4),
                "std": round(statistics.stdev(values), 4),
            }
        out.append(entry)
    return out


def _markdown(result: dict[str, Any]) -> str:
    dev, seeds = result["device"], ", ".join(map(str, result["train_seeds"]))
    md = (
        f"# SASRec (BCE) probes on one GPU ({dev.get('name', dev['device'])}, "
        f"up to {result['jobs']} runs at once)\n\n"
        "Test split, the state chosen on validation full NDCG@10 unless the settings name "
        f"another train.val_protocol, training seeds {seeds}.\n\n"
        "| probe | seed | config | settings | epochs | best epoch | full NDCG@10 | uni100 HR@10 | "
        "uni100 NDCG@10 | pop100 HR@10 | pop100 NDCG@10 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in result["rows"]:
        if "test" not in r:
            md += f"| {r['probe']} | {r['seed']} | `{r['config']}` | {r.get('error', '')} |\n"
            continue
        cells = " | ".join(f"{r['test'][p][k]:.4f}" for p, k in COLUMNS)
        md += (
            f"| {r['probe']} | {r['seed']} | `{r['config']}` | "
            f"{' '.join(r['sets']) or 'as shipped'} | {r['epochs']} | {r['best_epoch']} | "
            f"{cells} |\n"
        )
    if result.get("summary"):
        md += (
            "\nMean ± standard deviation over the seeds:\n\n"
            "| probe | seeds | full NDCG@10 | uni100 HR@10 | uni100 NDCG@10 | pop100 HR@10 | "
            "pop100 NDCG@10 |\n|---|---|---|---|---|---|---|\n"
        )
        for e in result["summary"]:
            cells = " | ".join(
                f"{e['test'][p][k]['mean']:.4f} ± {e['test'][p][k]['std']:.4f}" for p, k in COLUMNS
            )
            md += f"| {e['probe']} | {len(e['seeds'])} | {cells} |\n"
    return md + f"\nTotal {result['seconds']:.0f} s.\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--probes", default=",".join(PROBES))
    ap.add_argument("--seeds", default="0", help="training seeds, each probe trained with each")
    ap.add_argument("--jobs", type=int, default=12, help="runs at once")
    ap.add_argument("--cap", default="330s", help="time budget on each run's training")
    ap.add_argument("--deadline", type=float, default=500.0, help="seconds for all")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", default="/tmp/seqrec-gpu-sweep")
    ap.add_argument("--out", help="also copy the results here (the device tool's $OUT)")
    ap.add_argument("--name", default="sasrec_bce_gpu_probes")
    args = ap.parse_args(argv)
    names = args.probes.split(",")
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        sys.exit(f"gpu_sweep: unknown probe(s) {unknown}; known: {', '.join(PROBES)}")
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        sys.exit(f"gpu_sweep: --seeds takes integers separated by commas, got {args.seeds!r}")
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        sys.exit(f"gpu_sweep: --seeds must be distinct integers >= 0, got {args.seeds!r}")
    files = {"ml-1m": paper_ml1m(args.data_dir), "beauty": paper_beauty(args.data_dir)}
    runs = Path(args.runs)
    result: dict[str, Any] = {
        "device": device_info(args.device),
        "jobs": args.jobs,
        "cap": args.cap,
        "train_seeds": seeds,
        "rows": [],
    }
    start = time.perf_counter()

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - start, 1)
        order = {n: i for i, n in enumerate(names)}
        result["rows"].sort(key=lambda r: (order[r["probe"]], r["seed"]))
        result["summary"] = seed_summary(result["rows"])
        paths = write_results(
            args.name,
            result,
            _markdown(result),
            seeds={"train": seeds if len(seeds) > 1 else seeds[0], "candidates": 42},
            area="sasrec",
        )
        copy_results(paths, args.out)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    waiting = [(name, seed) for name in names for seed in seeds]
    running: dict[tuple[str, int], subprocess.Popen[str]] = {}
    logs: dict[tuple[str, int], TextIO] = {}  # each run's stderr, an open file
    while waiting or running:
        while waiting and len(running) < args.jobs:
            job = name, seed = waiting.pop(0)
            data, config, sets = PROBES[name]
            out = runs / f"{name}-s{seed}"
            if out.exists():
                shutil.rmtree(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "seqrec", "train", "sasrec", "--data", str(files[data])]
            cmd += ["--out", str(out), "--config", config, "--time-budget", args.cap, "--quiet"]
            for s in (f'train.device="{args.device}"', f"train.seed={seed}", *sets):
                cmd += ["--set", s]
            logs[job] = (runs / f"{name}-s{seed}.err").open("w+")
            running[job] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=logs[job], env=env
            )
        time.sleep(1.0)
        out_of_time = time.perf_counter() - start > args.deadline
        for job, proc in list(running.items()):
            if proc.poll() is None and not out_of_time:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            del running[job]
            err = logs.pop(job)
            err.seek(0)
            name, seed = job
            row = _row(name, seed, runs / f"{name}-s{seed}", proc.returncode, err.read())
            err.close()
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()
        if out_of_time:
            for name, seed in waiting:
                result["rows"].append({**_head(name, seed), "error": "not run: out of time"})
            waiting = []
    save()
    print(_markdown(result))
