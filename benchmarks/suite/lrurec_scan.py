"""LRURec's two ways to compute the recurrence in training (`lrurec.scan`): the authors'
recursive doubling and the chunked scan, timed in one process on the papers' ML-1M file.

    python benchmarks/speed.py lrurec-scan [--data-dir DIR] [--steps 10] [--rounds 2]
        [--name lrurec_scan]

Two measurements, each taken --rounds times alternating the two scans (the machine's speed
drifts; the ratio is what counts): the scan alone, forward and backward, on the recipe's shape
(batch 128, 256 positions, a state of 128 complex channels), and `ml-1m-lrurec` training steps
(`--steps` after two untimed, the recipe's first batches) with each scan, each over its model's
width (doubling: 256 positions, the power of two above max_len 200; chunked: 200), both in
float32; then the recipe as shipped (the chunked scan with the recipe's own precision settings,
`train.loss_bf16 = "auto"`: the CE's two matmuls in bf16 where this machine runs them faster)
against the authors' scan in float32, the recipe before the chunked scan. It also records the
first step's loss of each scan from the same initial weights without dropout, which must agree
to float rounding.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from _common import paper_ml1m, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.models.lrurec import SCAN_CHUNK, LRURec, _scan, _scan_chunked
from seqrec.training.setup import setup

SCANS = {"doubling": _scan, "chunked": _scan_chunked}


def _scan_alone(name: str, reps: int = 5) -> float:
    """Seconds of one forward + backward of the scan on the recipe's shape (best of `reps`)."""
    g = torch.Generator().manual_seed(0)
    B, L, D = 128, 256, 128
    u = torch.complex(torch.randn(B, L, D, generator=g), torch.randn(B, L, D, generator=g))
    lamb = (0.8 + 0.19 * torch.rand(D, generator=g)) * torch.exp(1j * 6.28 * torch.rand(D))
    lengths = torch.randint(5, 201, (B,), generator=g)
    real = torch.arange(L)[None] >= (L - lengths)[:, None]
    best = float("inf")
    for _ in range(reps):
        x, lam = u.clone().requires_grad_(True), lamb.clone().requires_grad_(True)
        start = time.perf_counter()
        h = SCANS[name](x, lam, real)
        (h.real.sum() + h.imag.sum()).backward()
        best = min(best, time.perf_counter() - start)
    return best


FP32 = ["train.loss_bf16=false", "train.bf16=false"]


def _steps(ds: PreparedDataset, scan: str, steps: int) -> dict[str, Any]:
    """Training steps of `scan` ("recipe": the recipe as shipped, its precision its own)."""
    sets = [] if scan == "recipe" else [f"lrurec.scan={scan}", *FP32]
    training = setup(ds, load_config(RunConfig, "ml-1m-lrurec", sets))
    assert isinstance(training.model, LRURec)
    times, sizes = [], []
    for i, batch in zip(range(steps + 2), training.sampler.epoch(0), strict=False):
        start = time.perf_counter()
        float(training.step(batch))  # until the device has done it
        if i >= 2:
            times.append(time.perf_counter() - start)
            sizes.append(batch.size)
    return {
        "seq_per_s": sum(sizes) / sum(times),
        "step_s": statistics.fmean(times),
        "loss": None if scan == "recipe" else _first_loss(ds, scan),
        "width": training.model.width,
        "loss_bf16": bool(training.cfg.train.loss_bf16),
    }


def _first_loss(ds: PreparedDataset, scan: str) -> float:
    """The first batch's loss from the recipe's initial weights, without dropout (whose masks
    are drawn over the model's width, which differs between the scans)."""
    sets = [f"lrurec.scan={scan}", "lrurec.dropout=0", "lrurec.lru_dropout=0"]
    sets += FP32
    training = setup(ds, load_config(RunConfig, "ml-1m-lrurec", sets))
    return float(training.step(next(iter(training.sampler.epoch(0)))))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="lrurec_scan")
    args = ap.parse_args(argv)
    ds = prepare(paper_ml1m(args.data_dir), progress=False)
    alone: dict[str, list[float]] = {s: [] for s in SCANS}
    steps: dict[str, list[dict[str, Any]]] = {s: [] for s in (*SCANS, "recipe")}
    for r in range(args.rounds):
        for s in (*SCANS, "recipe"):
            if s in SCANS:
                alone[s].append(_scan_alone(s))
            steps[s].append(_steps(ds, s, args.steps))
            said = f" scan alone {alone[s][-1]:.3f} s," if s in SCANS else ""
            print(f"round {r}: {s}{said} steps", steps[s][-1])
    rows = {
        s: {
            "scan_alone_s": min(alone[s]),
            "seq_per_s": max(x["seq_per_s"] for x in steps[s]),
            "step_s": min(x["step_s"] for x in steps[s]),
            "first_loss": steps[s][0]["loss"],
            "width": steps[s][0]["width"],
        }
        for s in SCANS
    }
    d, c = rows["doubling"], rows["chunked"]
    recipe = {
        "seq_per_s": max(x["seq_per_s"] for x in steps["recipe"]),
        "step_s": min(x["step_s"] for x in steps["recipe"]),
        "loss_bf16": steps["recipe"][0]["loss_bf16"],
        "width": steps["recipe"][0]["width"],
    }
    payload = {
        "chunk": SCAN_CHUNK,
        "rounds": {"scan_alone_s": alone, "steps": steps},
        "scans": rows,
        "recipe": recipe,
        "scan_speedup": d["scan_alone_s"] / c["scan_alone_s"],
        "step_speedup": c["seq_per_s"] / d["seq_per_s"],
        "recipe_speedup": recipe["seq_per_s"] / d["seq_per_s"],
        "first_loss_difference": abs(d["first_loss"] - c["first_loss"]),
    }
    precision = "bf16" if recipe["loss_bf16"] else "fp32"
    md = (
        "# LRURec's scan: the authors' recursive doubling against the chunked scan\n\n"
        f"`ml-1m-lrurec`, the papers' ML-1M file; best of {args.rounds} alternating rounds. "
        f"Chunks of {SCAN_CHUNK} positions.\n\n"
        "| scan | scan alone, forward + backward (s) | model width | training seq/s | s a step "
        "| first loss |\n"
        "|---|---|---|---|---|---|\n"
        + "".join(
            f"| {s} (fp32) | {r['scan_alone_s']:.3f} | {r['width']} | {r['seq_per_s']:.1f} | "
            f"{r['step_s']:.3f} | {r['first_loss']:.5f} |\n"
            for s, r in rows.items()
        )
        + f'| the recipe as shipped: chunked, CE matmuls in {precision} (`loss_bf16 = "auto"`) '
        f"| | {recipe['width']} | {recipe['seq_per_s']:.1f} | {recipe['step_s']:.3f} | |\n"
        + f"\nSpeed-up: the scan alone {payload['scan_speedup']:.2f}x, a training step "
        f"{payload['step_speedup']:.2f}x (both fp32); the recipe as shipped against the authors' "
        f"scan in fp32 {payload['recipe_speedup']:.2f}x; the first losses differ by "
        f"{payload['first_loss_difference']:.1e}.\n"
    )
    write_results(args.name, payload, md, seeds={"train": 0, "data": 0}, area="lrurec")
    print(md)
