"""LRURec on the papers' ML-1M file: its recipe (`ml-1m-lrurec`, the authors') under a time
budget, the test split under the three protocols beside the LRURec paper's full-ranking row,
and its training speed beside SASRec+CE's (`ml-1m-sasrec-ce`), both timed in this process.

    python benchmarks/reproduce.py lrurec-ml1m [--data-dir DIR] [--budget 20m] [--runs-dir DIR]
        [--steps 20] [--name lrurec_ml1m]

The speed: `--steps` training steps of each recipe's model on its own first batches (after two
untimed), as sequences per second and seconds per epoch (its batches per epoch times the mean
step); the two are timed one after the other, so their ratio is measured in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _common import paper_ml1m, runs_dir, train_or_reuse, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.training.setup import setup

# the LRURec paper's ML-1M row (Yue et al., WSDM 2024; full ranking): NDCG@10 and Recall@10
PAPER = {"ndcg@10": 0.1930, "hr@10": 0.3264}


def _speed(ds: PreparedDataset, config: str, steps: int) -> dict[str, Any]:
    cfg = load_config(RunConfig, config, ["train.loss_bf16=false", "train.bf16=false"])
    training = setup(ds, cfg)
    times, sizes = [], []
    for i, batch in zip(range(steps + 2), training.sampler.epoch(0), strict=False):
        start = time.perf_counter()
        float(training.step(batch))  # until the device has done it
        if i >= 2:
            times.append(time.perf_counter() - start)
            sizes.append(batch.size)
    step_s = statistics.fmean(times)
    return {
        "config": config,
        "seq_per_s": sum(sizes) / sum(times),
        "step_s": step_s,
        "batches_per_epoch": len(training.sampler),
        "epoch_s": step_s * len(training.sampler),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--runs-dir")
    ap.add_argument("--budget", default="20m")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--name", default="lrurec_ml1m")
    args = ap.parse_args(argv)
    src = paper_ml1m(args.data_dir)
    cfg = load_config(RunConfig, "ml-1m-lrurec", [f"train.time_budget={json.dumps(args.budget)}"])
    ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
    speed = [_speed(ds, c, args.steps) for c in ("ml-1m-lrurec", "ml-1m-sasrec-ce")]
    out = runs_dir(args.runs_dir) / f"lrurec-ml1m-{args.budget}"
    m, log = train_or_reuse(ds, cfg, out, src)
    test = m["test"]
    rows = "".join(
        f"| {p} | {test[p]['hr@10']:.4f} | {test[p]['ndcg@10']:.4f} |\n"
        for p in ("full", "uni100", "pop100")
    )
    ratio = speed[0]["seq_per_s"] / speed[1]["seq_per_s"]
    md = (
        f"# LRURec on ML-1M (`ml-1m-lrurec`, {args.budget})\n\n"
        f"{m['epochs']} epochs ({m['stopped']}), the state of epoch {m['best_epoch']} chosen on "
        f"validation full HR@10; {m['train_time_s'] / 60:.1f} min of training.\n\n"
        "| protocol | HR@10 | NDCG@10 |\n|---|---|---|\n"
        f"{rows}"
        f"| paper (full; up to 500 epochs, early stopping) | {PAPER['hr@10']:.4f} | "
        f"{PAPER['ndcg@10']:.4f} |\n\n"
        "## Training speed here (timed in one process, one after the other)\n\n"
        "| recipe | seq/s | s per step | batches per epoch | s per epoch |\n|---|---|---|---|---|\n"
        + "".join(
            f"| `{s['config']}` | {s['seq_per_s']:.0f} | {s['step_s']:.3f} | "
            f"{s['batches_per_epoch']} | {s['epoch_s']:.0f} |\n"
            for s in speed
        )
        + f"\nLRURec / SASRec+CE sequences per second: {ratio:.2f}.\n"
    )
    payload = {
        "protocol": "leave-one-out test split; full ranking and 100 sampled negatives",
        "budget": args.budget,
        "paper": PAPER,
        "test": test,
        "epochs": m["epochs"],
        "best_epoch": m["best_epoch"],
        "speed": speed,
        "speed_ratio": ratio,
        "log": log,
    }
    paths = write_results(args.name, payload, md, seeds={"train": 0}, runs=[Path(out)])
    print(md)
    print("wrote", *paths)
