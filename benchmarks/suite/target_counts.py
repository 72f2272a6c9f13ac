"""How often the held-out items were seen in training: for the validation and test targets of
the leave-one-out split, the number of times each target item occurs in the items a model
trains on (the training part, or the training and validation items as the original BERT4Rec
code trains). An item seen rarely or never cannot be ranked well by any model that learns item
embeddings, so where the test targets are colder than the validation targets, a state chosen on
validation scores lower on test than on validation, and training on the validation items
narrows the gap. Counts only: no model is trained.

    python benchmarks/analyses.py target-counts [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from _common import paper_beauty, paper_ml1m, write_results
from seqrec.data.prepare import prepare
from seqrec.data.split import LeaveOneOut

AT_MOST = (0, 2, 5)  # "seen at most k times" columns


def target_counts(split: LeaveOneOut) -> dict[str, dict[str, Any]]:
    """For each (targets, trained on) pair: the share of targets seen at most k times in the
    trained-on items, and the median count."""
    n = split.sequences.n_items + 1
    seen = {
        on: np.bincount(split.training(on).items, minlength=n) for on in ("train", "train+valid")
    }
    pairs = {  # keyed "<targets>_on_<trained-on items>"
        "valid_on_train": (split.valid.targets, seen["train"]),
        "test_on_train": (split.test.targets, seen["train"]),
        "test_on_train+valid": (split.test.targets, seen["train+valid"]),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, (targets, counts) in pairs.items():
        c = counts[targets]
        out[name] = {
            "targets": int(len(targets)),
            "median": float(np.median(c)),
            **{f"at_most_{k}": float((c <= k).mean()) for k in AT_MOST},
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    args = ap.parse_args(argv)
    files = {"ml-1m": paper_ml1m(args.data_dir), "beauty": paper_beauty(args.data_dir)}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in files.items():
            ds = prepare(src, out=Path(tmp) / name, progress=False)
            results[name] = target_counts(ds.split)
    lines = [
        "# How often the held-out items were seen in training (the BERT4Rec authors' files)",
        "",
        "For each validation or test target: how many times its item occurs in the items the "
        "model trains on (the training part: all but each user's last two items; or, as the "
        "original BERT4Rec code trains, the training and validation items).",
        "",
        "| dataset | targets | count over | median count | "
        + " | ".join(f"seen ≤ {k}" for k in AT_MOST)
        + " |",
        "|---|---|---|---|" + "---|" * len(AT_MOST),
    ]
    for dataset, rows in results.items():
        for name, r in rows.items():
            targets, over = name.split("_on_")
            cells = " | ".join(f"{100 * r[f'at_most_{k}']:.1f}%" for k in AT_MOST)
            lines.append(f"| {dataset} | {targets} targets | {over} | {r['median']:g} | {cells} |")
    payload = {
        "protocol": "leave-one-out; counts of each target item in the trained-on items",
        "files": {k: v.name for k, v in files.items()},
        "counts": results,
    }
    write_results("target_counts", payload, "\n".join(lines) + "\n", seeds={})
