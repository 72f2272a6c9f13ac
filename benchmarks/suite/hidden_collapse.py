"""Does a trained run still tell histories apart? For validation histories of the run's dataset,
the user vectors (the hidden state the scores are read from) are compared across users: their
mean pairwise cosine (1.0 = one vector for everybody, the ranking is then the same for every
user) and the spread of the scores across users, beside the run's validation curve. For SASRec
each block's sub-layer outputs are split into the part common to all users (norm of the mean)
and the part that varies (mean norm of the deviation), which shows where a constant vector
drowns the history's signal.

    python benchmarks/analyses.py hidden-collapse RUN_DIR [RUN_DIR ...] [--users 500]
        [--name hidden_collapse]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _common import write_results
from seqrec.data.prepared import load_prepared
from seqrec.evaluation.protocols import pad_histories
from seqrec.training.checkpoint import load_run
from seqrec.training.rundir import RunDir

SHOWN = ("loss", "n_negatives", "negatives_per", "gbce_t", "prior_offset", "lr", "threads")


def spread(a: torch.Tensor) -> dict[str, float]:
    """(U, D) -> the norm of the part common to all rows and the mean norm of what varies."""
    mean = a.mean(0)
    return {"common": float(mean.norm()), "varying": float((a - mean).norm(dim=1).mean())}


def inspect(run_dir: Path, n_users: int) -> dict[str, Any]:
    run = load_run(run_dir, trust=True)  # the benchmarks' own runs
    ds = load_prepared(run.source["prepared"])
    valid = ds.split.eval_set("valid")
    rows = np.linspace(0, len(valid.users) - 1, min(n_users, len(valid.users))).astype(np.int64)
    histories = torch.from_numpy(pad_histories(valid.histories, rows, run.model.max_len))
    model = run.model
    sublayers: dict[str, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(getattr(model, "layers", [])):
        for part in ("ln1", "attn", "ln2", "ffn"):
            if hasattr(block, part):

                def keep(_m: Any, _i: Any, out: torch.Tensor, name: str = f"{i}.{part}") -> None:
                    sublayers[name] = out[:, -1].detach()

                hooks.append(getattr(block, part).register_forward_hook(keep))
    with torch.no_grad():
        users = model.user_vector(histories)
        weight, _ = model.output_weights()
        scores = users @ weight.T
    for h in hooks:
        h.remove()
    unit = torch.nn.functional.normalize(users, dim=1)
    log = RunDir(run_dir, trust=True).log()
    curve = [(h["epoch"], h[k]) for h in log for k in h if k.startswith("valid_")]
    return {
        "run": str(run_dir),
        "train": {k: v for k, v in dataclasses.asdict(run.config.train).items() if k in SHOWN},
        "validation_curve": curve,
        "users": len(rows),
        "mean_cosine_between_users": float((unit @ unit.T).mean()),
        "score_std_over_items": float(scores.std(1).mean()),
        "score_std_over_users": float(scores.std(0).mean()),
        "user_vector": spread(users),
        "sublayers": {k: spread(v) for k, v in sublayers.items()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--users", type=int, default=500, help="validation histories, evenly spaced")
    ap.add_argument("--name", default="hidden_collapse", help="results file name")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    found = [inspect(r, args.users) for r in args.runs]
    lines = [
        "# Do the user vectors still differ between histories?\n",
        f"{args.users} validation histories (evenly spaced users) per run. Cosine 1.0 = the "
        "same vector, hence the same ranking, for every user.\n",
        "| run | mean cosine between users | score std over items | score std over users |",
        "|---|---|---|---|",
    ]
    for f in found:
        lines.append(
            f"| {Path(f['run']).name} | {f['mean_cosine_between_users']:.3f} | "
            f"{f['score_std_over_items']:.2f} | {f['score_std_over_users']:.3f} |"
        )
    lines += ["\n| run | training | validation (epoch, value) |", "|---|---|---|"]
    for f in found:
        curve = ", ".join(f"({e}, {v:.4f})" for e, v in f["validation_curve"])
        lines.append(f"| {Path(f['run']).name} | {f['train']} | {curve} |")
    for f in found:
        if f["sublayers"]:
            lines += [
                f"\n{Path(f['run']).name}, last position, per sub-layer output: norm of the part "
                "common to all users / mean norm of the part that varies\n",
                "| sub-layer | common | varying |",
                "|---|---|---|",
            ]
            lines += [
                f"| {k} | {v['common']:.2f} | {v['varying']:.3f} |"
                for k, v in f["sublayers"].items()
            ]
    md = "\n".join(lines) + "\n"
    runs = [Path(f["run"]) for f in found]
    paths = write_results(args.name, {"runs": found}, md, seeds={"sampled_users": 0}, runs=runs)
    print(md)
    print("wrote", *paths)
    print(json.dumps([f["mean_cosine_between_users"] for f in found]))
