"""Whether pairs of runs are the same run: the weights of their chosen states (every tensor
equal, bit for bit), their metrics (every number of validation, test and the POP comparison
equal) and their training logs (each epoch's loss and validation value equal). What a change
that must not change behaviour is checked with: the same fixed-length trainings (no time
budget, one seed) run before and after it, on the same machine.

    python benchmarks/analyses.py same-runs --pair LABEL=BEFORE_DIR,AFTER_DIR [--pair ...]
        [--name same_runs]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from _common import write_results
from seqrec.training.checkpoint import load_run

# what a run's metrics.json holds that is not a result of the training: time, machine, commit
# (and, at any depth, a key ending in "_s": seconds, e.g. how long deciding the precision took)
NOT_COMPARED = {"seq_per_s", "cpu_util", "git_commit", "machine"}


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not k.endswith("_s")}
    return value


LOG_KEYS = ("epoch", "step", "loss", "lr", "sequences")  # and the validation value, if any


def compare(before: Path, after: Path) -> dict[str, Any]:
    """The two runs' weights, metrics and logs compared."""
    a, b = load_run(before, "cpu").model.state_dict(), load_run(after, "cpu").model.state_dict()
    differ = [k for k in a if k not in b or not torch.equal(a[k], b[k])] + [
        k for k in b if k not in a
    ]
    ma, mb = (_untimed(json.loads((p / "metrics.json").read_text())) for p in (before, after))
    metrics_differ = sorted(
        k for k in ma.keys() | mb.keys() if k not in NOT_COMPARED and ma.get(k) != mb.get(k)
    )

    def log(p: Path) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in (p / "log.jsonl").read_text().splitlines()]
        return [
            {k: v for k, v in x.items() if k in LOG_KEYS or k.startswith("valid_")} for x in lines
        ]

    return {
        "before": str(before),
        "after": str(after),
        "tensors": len(a),
        "parameters": int(sum(t.numel() for t in a.values())),
        "tensors_differing": differ,
        "n_tensors_differing": len(differ),
        "metrics_differing": metrics_differ,
        "logs_equal": log(before) == log(after),
        "test_full_ndcg@10": [ma["test"]["full"]["ndcg@10"], mb["test"]["full"]["ndcg@10"]],
        "commits": [ma.get("git_commit"), mb.get("git_commit")],
        "epochs": [ma.get("epochs"), mb.get("epochs")],
        "seeds": {"train": ma.get("seed"), "candidates": ma.get("negative_seed")},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", action="append", required=True, metavar="LABEL=BEFORE,AFTER")
    ap.add_argument("--name", default="same_runs")
    args = ap.parse_args(argv)
    rows = {}
    for text in args.pair:
        label, _, dirs = text.partition("=")
        before, _, after = dirs.partition(",")
        if not label or not before or not after:
            raise SystemExit(f"--pair {text!r}: expected LABEL=BEFORE_DIR,AFTER_DIR")
        rows[label] = compare(Path(before), Path(after))
    md = [
        "# The same runs before and after a change",
        "",
        "Each pair: one config trained for a fixed number of epochs (no time budget, one seed) at",
        "two commits on the same machine; its chosen state's weights, metrics and log compared.",
        "",
        "| run | commits | epochs | tensors (parameters) | tensors differing | metrics differing "
        "| logs equal | test full NDCG@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        commits = " → ".join(str(c)[:7] for c in r["commits"])
        md.append(
            f"| {label} | {commits} | {r['epochs'][0]} | {r['tensors']} ({r['parameters']:,}) "
            f"| {len(r['tensors_differing'])} | {', '.join(r['metrics_differing']) or 'none'} "
            f"| {'yes' if r['logs_equal'] else 'no'} "
            f"| {r['test_full_ndcg@10'][0]:.6f} / {r['test_full_ndcg@10'][1]:.6f} |"
        )
    # nothing is drawn here: the seeds are the runs' own (the same in every pair's two runs)
    seeds = next(iter(rows.values()))["seeds"]
    runs = [Path(r[k]) for r in rows.values() for k in ("before", "after")]
    write_results(args.name, {"pairs": rows}, "\n".join(md) + "\n", seeds=seeds, runs=runs)
