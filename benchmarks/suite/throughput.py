"""Training throughput on the papers' ML-1M (or Beauty) file: sequences/s of the real training
step (batches from the real sampler, loss, backward, optimizer) for each shipped config and
speed option, the median of repeated timed windows, beside the matmul peak this machine
reaches and the share of it each configuration uses (FLOPs of one step counted by torch's
FlopCounterMode).

    python benchmarks/speed.py throughput [--data-dir DIR] [--dataset ml-1m|beauty]
        [--configs ml-1m-bert4rec,ml-1m-sasrec]
        [--variant NAME=KEY=VALUE,KEY=VALUE ...] [--steps 0] [--repeats 3] [--name throughput]

Without --variant each config runs as shipped ("as shipped") and with `train.bf16 = true`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from _common import paper_beauty, paper_ml1m, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.training.setup import setup

DEFAULT_CONFIGS = "ml-1m-bert4rec,ml-1m-sasrec,ml-1m-sasrec-ce"
DATASETS = {"ml-1m": (paper_ml1m, "ML-1M"), "beauty": (paper_beauty, "Beauty")}  # file, title


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a large square matmul: the practical ceiling of this machine for `dtype`."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times) / 1e9


def measure(cfg: RunConfig, ds: Any, steps: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Median sequences/s over `repeats` timed windows, each a whole epoch (or its first `steps`
    batches), after `warmup` steps."""
    training = setup(ds, cfg)
    sampler = training.sampler
    warm = sampler.epoch(0)
    for _ in range(warmup):
        training.step(next(warm))
    flops, seqs = 0, 0
    # FLOPs per sequence over a few batches, attention on its math path (the fused CPU kernel
    # has no FLOP formula; the math path does the same products)
    for batch in islice(sampler.epoch(0), 4):
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            training.step(batch)
        flops, seqs = flops + counter.get_total_flops(), seqs + batch.size
    rates = []
    for epoch in range(1, repeats + 1):
        n_seq, t0 = 0, time.perf_counter()
        # building the batches is part of the cost
        for batch in islice(sampler.epoch(epoch), steps or None):
            loss = training.step(batch)
            n_seq += batch.size
        float(loss)  # the window ends when the device has done its steps
        rates.append(n_seq / (time.perf_counter() - t0))
    seq_s = statistics.median(rates)
    epoch_seqs = sum(b.size for b in sampler.epoch(0))
    return {
        "seq_per_s": seq_s,
        "seq_per_s_runs": rates,
        "epoch_sequences": epoch_seqs,
        "s_per_epoch": epoch_seqs / seq_s,
        "mflop_per_seq": flops / seqs / 1e6,
        "gflop_s": flops / seqs * seq_s / 1e9,
        "precision": training.precision,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="ml-1m")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=KEY=VALUE,...",
        help='e.g. "bf16=train.bf16=true"; "as shipped" is always measured',
    )
    ap.add_argument("--steps", type=int, default=0, help="steps per timed window; 0 = an epoch")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows (the median is kept)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--name", default="throughput")
    args = ap.parse_args(argv)
    src = DATASETS[args.dataset][0](args.data_dir)
    variants: dict[str, list[str]] = {"as shipped": []}
    for spec in args.variant or ["bf16=train.bf16=true"]:
        name, _, sets = spec.partition("=")
        variants[name] = [s for s in sets.split(",") if s]
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    rows: list[dict[str, Any]] = []
    for config in args.configs.split(","):
        for variant, overrides in variants.items():
            cfg = load_config(RunConfig, config, overrides)
            ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
            result = measure(cfg, ds, args.steps, args.repeats, args.warmup)
            peak = peaks["bf16" if result["precision"]["bf16"] else "fp32"]
            rows.append(
                {
                    "config": config,
                    "variant": variant,
                    "overrides": overrides,
                    "loss": cfg.train.loss,
                    "batch_size": cfg.train.batch_size,
                    "seed": cfg.train.seed,
                    **result,
                    "share_of_matmul_peak": result["gflop_s"] / peak,
                }
            )
            print(
                f"{config} [{variant}]: {result['seq_per_s']:.0f} seq/s, "
                f"{result['s_per_epoch']:.1f} s/epoch",
                flush=True,
            )
            _write(args, peaks, rows)


def _write(args: argparse.Namespace, peaks: dict[str, float], rows: list[dict[str, Any]]) -> None:
    lines = [
        f"# Training throughput, {DATASETS[args.dataset][1]} (papers' file)",
        "",
        f"Matmul peak measured here (2048² matmul): fp32 {peaks['fp32']:.0f} GFLOP/s, "
        f"bf16 {peaks['bf16']:.0f} GFLOP/s. Each row: the median of {args.repeats} windows of "
        f"{args.steps or 'an epoch of'} training steps after {args.warmup} warm-up steps; "
        "batches are built by the real sampler inside the timed window. FLOPs: matmuls and "
        "attention of forward + backward (FlopCounterMode), averaged over 4 batches.",
        "",
        "| config | variant | loss | batch | seq/s (median) | runs | s/epoch | MFLOP/seq "
        "| GFLOP/s | share of peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = " / ".join(f"{x:.0f}" for x in r["seq_per_s_runs"])
        lines.append(
            f"| {r['config']} | {r['variant']} | {r['loss']} | {r['batch_size']} "
            f"| {r['seq_per_s']:.0f} | {runs} | {r['s_per_epoch']:.1f} "
            f"| {r['mflop_per_seq']:.0f} | {r['gflop_s']:.1f} "
            f"| {100 * r['share_of_matmul_peak']:.1f} % |"
        )
    payload = {
        "dataset": args.dataset,
        "steps": args.steps,
        "repeats": args.repeats,
        "peaks_gflop_s": peaks,
        "rows": rows,
    }
    seeds = {"init_and_batches": sorted({r["seed"] for r in rows})[0] if rows else None}
    write_results(args.name, payload, "\n".join(lines), seeds=seeds)
