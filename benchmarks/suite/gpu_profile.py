"""Where a training step's time goes on a GPU: building the batches on the host, the steps with
their batches built beforehand, the operations that make the host wait for the device (each with
the line of seqrec that called it), and the torch profiler's busiest operators.

    python benchmarks/gpu.py profile --data-dir DIR [--config ml-1m-bert4rec] [--set k=v ...]
        [--steps 30] [--out DIR]

Prints a report (and writes it to --out/profile_<config>.txt). A diagnostic, not a results
file: what it finds is measured again by benchmarks/gpu.py check.
"""

from __future__ import annotations

import argparse
import collections
import io
import time
import traceback
import warnings
from itertools import islice
from pathlib import Path

import torch

from _common import paper_ml1m
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.training.setup import resolve_device, setup, torch_settings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--config", default="ml-1m-bert4rec")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    out = io.StringIO()

    def say(*parts: object) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        out.write(line + "\n")

    cfg = load_config(RunConfig, args.config, args.sets)
    ds = prepare(paper_ml1m(args.data_dir), data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
    device = resolve_device(cfg.train.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    with torch_settings(cfg.train, device):
        training = setup(ds, cfg, device)
        say(f"{args.config} {' '.join(args.sets)} on {device}; precision {training.precision}")
        start = time.perf_counter()
        batches = list(islice(training.sampler.epoch(1), args.steps))
        host = time.perf_counter() - start
        n_seq = sum(b.size for b in batches)
        say(
            f"host batching: {1000 * host / len(batches):.2f} ms a batch, {n_seq / host:,.0f} seq/s"
        )
        for b in batches[:3]:
            training.step(b)
        sync()
        start = time.perf_counter()
        for b in batches:
            training.step(b)
        launched = time.perf_counter() - start
        sync()
        total = time.perf_counter() - start
        say(
            f"steps on built batches: {1000 * total / len(batches):.2f} ms a step "
            f"({n_seq / total:,.0f} seq/s); the host returned after "
            f"{1000 * launched / len(batches):.2f} ms a step"
        )
        if cuda:
            seen: collections.Counter[str] = collections.Counter()

            def hook(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
                frames = [
                    f"{Path(f.filename).name}:{f.lineno} {f.name}"
                    for f in traceback.extract_stack()[:-1]
                    if "seqrec" in f.filename or "benchmarks" in f.filename
                ]
                seen[f"{str(message)[:80]} <- {' < '.join(reversed(frames[-4:]))}"] += 1

            warnings.showwarning = hook
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            for b in batches[:3]:
                training.step(b)
            torch.cuda.set_sync_debug_mode(0)
            say(f"synchronising operations in 3 steps: {sum(seen.values())}")
            for where, n in seen.most_common(12):
                say(f"  {n} x {where}")
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for b in batches[:10]:
                training.step(b)
            sync()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        say("profiler, 10 steps, by self CPU time:\n" + table)
        if cuda:
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
            say("profiler, 10 steps, by self CUDA time:\n" + table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"profile_{args.config}.txt").write_text(out.getvalue())
