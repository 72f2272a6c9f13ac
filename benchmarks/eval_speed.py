"""Validation speed under full ranking: one pass of a shipped config's (freshly initialised)
model over the validation split of the papers' ML-1M and Beauty files, with the shipped
`seqrec.evaluate.full_ranks` (one comparison pass over the scores, the excluded history taken
off afterwards) beside the masking it replaced (a (B, V) candidate mask built per batch, then
compared, or-ed with NaN and and-ed), which is kept here as the reference. Both must give the
same rank for every user; the run stops if they do not.

A time-budgeted run validates every `train.eval_every` epochs inside its budget, so on a large
catalogue (Beauty: 54,542 items) this is training time lost.

    python benchmarks/eval_speed.py [--data-dir DIR] [--repeats 3] [--name eval_speed]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any

import numpy as np
import torch

from _common import paper_beauty, paper_ml1m, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import prepare
from seqrec.train import ModelScorer, setup

# the module, not the function `seqrec.evaluate` that the package exports under the same name
ev = importlib.import_module("seqrec.evaluate")
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


def time_pass(ds: Any, scorer: ModelScorer, batch_size: int) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    report = ds.evaluate(scorer, "valid", protocols=("full",), batch_size=batch_size)
    return time.perf_counter() - t0, report.ranks["full"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per variant (median)")
    ap.add_argument("--name", default="eval_speed")
    args = ap.parse_args()
    shipped = ev.full_ranks
    rows: list[dict[str, Any]] = []
    seeds: dict[str, int | None] = {}
    for title, path, config in CASES:
        cfg = load_config(RunConfig, config)
        ds = prepare(path(args.data_dir), data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        training = setup(ds, cfg)
        seeds = {"init": cfg.train.seed, "candidates": cfg.eval.negative_seed}
        training.model.eval()
        scorer = ModelScorer(training.model, bool(training.cfg.train.bf16), training.device)
        times: dict[str, list[float]] = {"masked": [], "one pass": []}
        ranks: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for _ in range(args.repeats):  # alternate, so drift hits both alike
                for variant, fn in (("masked", masked_full_ranks), ("one pass", shipped)):
                    ev.full_ranks = fn
                    try:
                        seconds, ranks[variant] = time_pass(ds, scorer, cfg.eval.batch_size)
                    finally:
                        ev.full_ranks = shipped
                    times[variant].append(seconds)
        if not np.array_equal(ranks["masked"], ranks["one pass"]):
            raise SystemExit(f"{config}: the two rankings differ")
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "dataset": title,
                "config": config,
                "users": len(ranks["masked"]),
                "items": ds.n_items,
                "batch_size": cfg.eval.batch_size,
                "bf16": bool(training.cfg.train.bf16),
                "seconds": med,
                "seconds_runs": times,
                "speedup": med["masked"] / med["one pass"],
            }
        )
        print(f"{title} {config}: masked {med['masked']:.1f} s, one pass {med['one pass']:.1f} s")
    lines = [
        "# Validation speed under full ranking",
        "",
        "One pass of each config's freshly initialised model over the validation split, full "
        "ranking only (the protocol the training loop selects on); the median of "
        f"{args.repeats} passes per variant, variants alternated. Ranks identical in both.",
        "",
        "| dataset | config | users | items | bf16 | masked (s) | one pass (s) | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['dataset']} | {r['config']} | {r['users']} | {r['items']} | {r['bf16']} "
            f"| {s['masked']:.1f} | {s['one pass']:.1f} | {r['speedup']:.1f}x |"
        )
    payload = {"repeats": args.repeats, "rows": rows}
    write_results(args.name, payload, "\n".join(lines), seeds=seeds)


if __name__ == "__main__":
    main()
