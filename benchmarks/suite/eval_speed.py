"""Validation speed under full ranking: one pass of a shipped config's (freshly initialised)
model over the validation split of the papers' ML-1M and Beauty files, as evaluation does it now
beside how it did it before (kept here as the reference), and one step between:

- "before": the scores assembled from three fresh tensors per call (the product, the bias
  added, the padding column concatenated), a (B, V) candidate mask built per batch, then
  compared, or-ed with NaN and and-ed, 256 histories per call;
- "in place, 256 rows": the scores written once into one tensor, one comparison pass with the
  excluded history taken off afterwards (`seqrec.evaluation.protocols.full_ranks`), 256 histories
  per call;
- "now": the same in blocks of rows whose scores fit
  `seqrec.evaluation.protocols.SCORES_BYTES` (16 MB).

A time-budgeted run validates every `train.eval_every` epochs inside its budget, so on a large
catalogue (Beauty: 54,542 items) this is training time lost. The ranks of the variants are
compared: row blocks of another size may move a score in its last bit (a different matmul
shape), so the number of users whose rank differs is reported, not assumed to be zero.

    python benchmarks/speed.py eval-speed [--data-dir DIR] [--repeats 3] [--name eval_speed]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np
import torch

import seqrec.evaluation.protocols as ev
from _common import paper_beauty, paper_ml1m, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.evaluation.protocols import evaluate_split
from seqrec.training.setup import ModelScorer, setup

CASES = [  # dataset title, file, config
    ("ML-1M", paper_ml1m, "ml-1m-bert4rec"),
    ("Beauty", paper_beauty, "beauty-bert4rec"),
    ("Beauty", paper_beauty, "beauty-sasrec"),
]


def masked_full_ranks(
    scores: torch.Tensor, t_score: torch.Tensor, excluded: torch.Tensor
) -> torch.Tensor:
    """The reference: mask the padding id and the excluded ids out of the whole row, count the
    candidates at or above the target (or NaN)."""
    cand = torch.ones_like(scores, dtype=torch.bool)
    cand[:, 0] = False
    cand.scatter_(1, excluded, False)
    return (((scores >= t_score) | scores.isnan()) & cand).sum(1)


class BeforeScorer(ModelScorer):
    """The scores as `SequenceModel.score` built them before: product, bias, padding column."""

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        m = self.model
        weight, bias = m.output_weights()
        scores = m.output_features(m.user_vector(histories, users)) @ weight.T
        if bias is not None:
            scores = scores + bias
        return torch.cat([torch.full_like(scores[:, :1], -math.inf), scores], dim=1)


VARIANTS = {  # name -> (scorer class, full_ranks, SCORES_BYTES)
    "before": (BeforeScorer, masked_full_ranks, 1 << 62),
    "in place, 256 rows": (ModelScorer, ev.full_ranks, 1 << 62),
    "now": (ModelScorer, ev.full_ranks, ev.SCORES_BYTES),
}


def time_pass(ds: Any, scorer: ModelScorer, batch_size: int) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    report = evaluate_split(ds, scorer, "valid", protocols=("full",), batch_size=batch_size)
    return time.perf_counter() - t0, report.ranks["full"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per variant (median)")
    ap.add_argument("--name", default="eval_speed")
    args = ap.parse_args(argv)
    shipped = ev.full_ranks, ev.SCORES_BYTES
    rows: list[dict[str, Any]] = []
    seeds: dict[str, int | None] = {}
    for title, path, config in CASES:
        cfg = load_config(RunConfig, config)
        ds = prepare(path(args.data_dir), data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        training = setup(ds, cfg)
        seeds = {"init": cfg.train.seed, "candidates": cfg.eval.negative_seed}
        training.model.eval()
        bf16 = bool(training.cfg.train.bf16)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        ranks: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for _ in range(args.repeats):  # alternate, so drift hits all alike
                for variant, (kind, fn, block) in VARIANTS.items():
                    ev.full_ranks, ev.SCORES_BYTES = fn, block
                    try:
                        scorer = kind(training.model, bf16, training.device)
                        seconds, ranks[variant] = time_pass(ds, scorer, cfg.eval.batch_size)
                    finally:
                        ev.full_ranks, ev.SCORES_BYTES = shipped
                    times[variant].append(seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        differ = {k: int((r != ranks["before"]).sum()) for k, r in ranks.items()}
        rows.append(
            {
                "dataset": title,
                "config": config,
                "users": len(ranks["now"]),
                "items": ds.n_items,
                "batch_size": cfg.eval.batch_size,
                "rows_per_call": max(
                    1, min(cfg.eval.batch_size, ev.SCORES_BYTES // (4 * (ds.n_items + 1)))
                ),
                "bf16": bf16,
                "seconds": med,
                "seconds_runs": times,
                "ranks_differing_from_before": differ,
                "speedup": med["before"] / med["now"],
            }
        )
        print(f"{title} {config}: " + ", ".join(f"{k} {v:.1f} s" for k, v in med.items()))
    lines = [
        "# Validation speed under full ranking",
        "",
        "One pass of each config's freshly initialised model over the validation split, full "
        "ranking only (the protocol the training loop selects on); the median of "
        f"{args.repeats} passes per variant, variants alternated (the variants: the script's "
        'docstring). Ranks differing: users whose rank is not the one "before" gave.',
        "",
        "| dataset | config | users | items | bf16 | before (s) | in place, 256 rows (s) "
        "| now (s) | rows per call | speed-up | ranks differing |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['dataset']} | {r['config']} | {r['users']} | {r['items']} | {r['bf16']} "
            f"| {s['before']:.1f} | {s['in place, 256 rows']:.1f} | {s['now']:.1f} "
            f"| {r['rows_per_call']} | {r['speedup']:.1f}x "
            f"| {r['ranks_differing_from_before']['now']} |"
        )
    payload = {"repeats": args.repeats, "rows": rows}
    write_results(args.name, payload, "\n".join(lines), seeds=seeds)
