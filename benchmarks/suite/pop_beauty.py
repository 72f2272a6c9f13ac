"""POP on the BERT4Rec authors' Beauty file: Table 1's row as `seqrec stats` counts it, and POP
under full / uni100 / pop100 beside the paper's POP row (Table 2), twice: seqrec's POP (items
ranked by their count in the training part) and a POP counting the whole file, held-out
validation and test items included — the popularity the original code's vocabulary counts
(`FreqVocab` over every user's full sequence), which its pop100 negatives are also drawn from.

    python benchmarks/reproduce.py pop-beauty [--data-dir DIR] [--seed 42]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import paper_beauty, write_results
from seqrec.config import EvalConfig
from seqrec.data.prepare import prepare
from seqrec.data.preprocess import kcore_mask
from seqrec.evaluation.protocols import evaluate_split, item_popularity
from seqrec.evaluation.reference import PAPER_ROWS_BEAUTY
from seqrec.models.baselines import Popularity

TABLE1 = {"users": 40226, "items": 54542, "actions": 353962, "avg_length": 8.8, "density": "0.02%"}
METRICS = ("hr@1", "hr@5", "hr@10", "ndcg@5", "ndcg@10", "mrr")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--seed", type=int, default=EvalConfig().negative_seed)
    args = ap.parse_args(argv)
    src = paper_beauty(args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        ds = prepare(
            src, eval_cfg=EvalConfig(negative_seed=args.seed), out=Path(tmp) / "b", progress=False
        )
        scorers = {
            "pop (training counts: seqrec)": Popularity.fit(ds.split.train),
            "pop (whole-file counts, held-out items included)": Popularity(
                item_popularity(ds.split.sequences)
            ),
        }
        metrics = {
            name: evaluate_split(ds, scorer, "test", batch_size=512).metrics
            for name, scorer in scorers.items()
        }
    seqs = ds.split.sequences
    kept_by_5core = int(kcore_mask(seqs.user_index(), seqs.items - 1, 5, 5).sum())
    stats = ds.stats
    actions, users, items = stats["actions"], stats["users"], stats["items"]
    table1 = {
        "users": users,
        "items": items,
        "actions": actions,
        "avg_length_all": actions / users,
        "density_all": actions / (users * items),
        "avg_length_training_part": stats["avg_length"],
        "density_training_part": stats["density"],
    }
    source, paper = PAPER_ROWS_BEAUTY["pop"]
    lines = [
        "# POP on Beauty (the BERT4Rec authors' file), leave-one-out test split",
        "",
        "## Table 1",
        "",
        "| | #users | #items | #actions | avg. length | density |",
        "|---|---|---|---|---|---|",
        f"| paper | {TABLE1['users']:,} | {TABLE1['items']:,} | {TABLE1['actions']:,} "
        f"| {TABLE1['avg_length']} | {TABLE1['density']} |",
        f"| seqrec, every action counted | {users:,} | {items:,} | {actions:,} "
        f"| {table1['avg_length_all']:.1f} | {100 * table1['density_all']:.2f}% |",
        f"| seqrec, the training part (`seqrec stats`) | {users:,} | {items:,} | {actions:,} "
        f"| {stats['avg_length']:.1f} | {100 * stats['density']:.2f}% |",
        "",
        "The paper's Beauty row counts every action in its average length and density, its ML-1m "
        "row the training part (163.5 = (999,611 - 2 x 6,040) / 6,040); `seqrec stats` counts the "
        "training part for every dataset.",
        "",
        "## POP, test split",
        "",
        f"Negatives: 100 per user, drawn once with seed {args.seed}, never an item of the user's "
        "sequence; pop100 draws them by whole-file popularity, as the original code does. Ties "
        "count against the target.",
        "",
        "| scorer | protocol | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for name, m in metrics.items():
        for protocol in ("full", "uni100", "pop100"):
            cells = " | ".join(f"{m[protocol][k]:.4f}" for k in METRICS)
            lines.append(f"| {name} | {protocol} | {cells} |")
    lines.append(
        f"| paper: {source} | pop100 | " + " | ".join(f"{paper[k]:.4f}" for k in METRICS) + " |"
    )
    gaps = {
        name: {k: m["pop100"][k] - paper[k] for k in ("hr@10", "ndcg@10")}
        for name, m in metrics.items()
    }
    lines += [
        "",
        "pop100 minus the paper, HR@10 / NDCG@10: "
        + "; ".join(f"{n}: {g['hr@10']:+.4f} / {g['ndcg@10']:+.4f}" for n, g in gaps.items())
        + ".",
    ]
    payload = {
        "protocol": "leave-one-out test split; full / uni100 / pop100",
        "dataset": src.name,
        "seed": args.seed,
        "table1": table1,
        "table1_paper": TABLE1,
        "kept_by_5core": kept_by_5core,  # actions a second 5-core would keep
        "metrics": {
            "training_counts": metrics["pop (training counts: seqrec)"],
            "whole_file_counts": metrics["pop (whole-file counts, held-out items included)"],
        },
        "paper_pop100": paper,
        "gap_pop100": {
            "training_counts": gaps["pop (training counts: seqrec)"],
            "whole_file_counts": gaps["pop (whole-file counts, held-out items included)"],
        },
        "n_users_evaluated": int(np.asarray(ds.split.test.users).size),
    }
    write_results("pop_beauty", payload, "\n".join(lines) + "\n", seeds={"candidates": args.seed})
    print("\n".join(lines))
