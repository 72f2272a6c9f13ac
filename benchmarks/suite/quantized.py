"""A trained run's quantized ONNX graphs (`seqrec export --quantize int8|fp16`) against its fp32
ONNX graph and PyTorch: the test split's metrics under each protocol, each ranked by its own
scores (ONNX Runtime for the graphs), and the time to score every test history (batches of
256, padded to the model's history length; the best of --repeats passes), with each file's
size. What quantizing costs in quality and gains in speed on this machine.

    python benchmarks/speed.py quantized --run RUN_DIR [--repeats 3] [--name quantized_ml1m]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _common import write_results
from seqrec.data.prepared import load_prepared
from seqrec.evaluation.protocols import evaluate_split, pad_histories
from seqrec.serving.export import export_run
from seqrec.training.checkpoint import load_run

VARIANTS = ("fp32", "int8", "fp16")  # the ONNX graphs; "pytorch" is the run's model itself


class OnnxScorer:
    """An exported graph as a `Scorer`, run by ONNX Runtime on the CPU."""

    def __init__(self, path: Path, max_len: int) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.max_len = max_len

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        (scores,) = self.session.run(["scores"], {"histories": histories.cpu().numpy()})
        return torch.from_numpy(scores)


def _timed(
    score: Callable[[torch.Tensor], Any], batches: list[torch.Tensor], repeats: int
) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for h in batches:
            score(h)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", required=True, help="a trained run directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="quantized_ml1m")
    args = ap.parse_args(argv)
    run = load_run(args.run, "cpu")
    ds = load_prepared(run.source["prepared"])
    max_len = int(run.model.max_len)
    test = ds.split.eval_set("test")
    rows = np.arange(len(test.users))
    batches = [
        torch.from_numpy(pad_histories(test.histories, rows[i : i + 256], max_len))
        for i in range(0, len(rows), 256)
    ]
    rows_out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        scorers: dict[str, Any] = {"pytorch": run.model.eval()}
        sizes: dict[str, int] = {}
        for kind in VARIANTS:
            path = Path(tmp) / f"{kind}.onnx"
            export_run(args.run, "onnx", path, quantize=None if kind == "fp32" else kind)  # type: ignore[arg-type]
            scorers[kind] = OnnxScorer(path, max_len)
            sizes[kind] = path.stat().st_size
        for name, scorer in scorers.items():
            report = evaluate_split(ds, scorer, "test")
            seconds = _timed(scorer.score, batches, args.repeats)
            rows_out[name] = {
                "test": report.metrics,
                "score_s": seconds,
                "histories_per_s": len(rows) / seconds,
                "bytes": sizes.get(name),
            }
    base = rows_out["fp32"]
    md = [
        f"# Quantized ONNX graphs of `{Path(args.run).name}` ({run.config.model}, "
        f"{len(run.item_ids):,} items, history length {max_len})",
        "",
        f"Test split, {len(rows):,} users; scoring time: every test history in batches of 256, "
        f"the best of {args.repeats} passes; speed ratio against the fp32 graph.",
        "",
        "| scorer | file MB | full NDCG@10 | Δ vs fp32 | full HR@10 | uni100 NDCG@10 | "
        "pop100 NDCG@10 | histories/s | speed vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows_out.items():
        t = r["test"]
        size = "—" if r["bytes"] is None else f"{r['bytes'] / 2**20:.2f}"
        delta = t["full"]["ndcg@10"] - base["test"]["full"]["ndcg@10"]
        md.append(
            f"| {name} | {size} | {t['full']['ndcg@10']:.4f} | {delta:+.4f} "
            f"| {t['full']['hr@10']:.4f} | {t['uni100']['ndcg@10']:.4f} "
            f"| {t['pop100']['ndcg@10']:.4f} | {r['histories_per_s']:,.0f} "
            f"| {base['score_s'] / r['score_s']:.2f}x |"
        )
    for r in rows_out.values():
        r["full_ndcg@10_minus_fp32"] = (
            r["test"]["full"]["ndcg@10"] - base["test"]["full"]["ndcg@10"]
        )
        r["speed_vs_fp32"] = base["score_s"] / r["score_s"]
    seeds = {"candidates": run.config.eval.negative_seed}
    write_results(
        args.name,
        {"run": str(args.run), "threads": torch.get_num_threads(), "rows": rows_out},
        "\n".join(md) + "\n",
        seeds=seeds,
        runs=[Path(args.run)],
    )
