"""What a finished run says of itself: one line on stderr, and a key of its metrics, where it
learned too little to be trusted or where its result depends on the machine.

- its validation metric within `POP_MARGIN` of POP's (POP's number recorded beside it,
  `valid_pop`): a model that learned little beyond popularity;
- less than one pass over the training sequences (`passes`);
- the same top-10 for every one of the first test users (`same_top10`): popularity alone;
- a time budget that ended the run or scheduled its decay (`steps_set_by`: "clock", else
  "data"): the number of steps then depends on the machine's speed and load, so the same seed
  may give another model elsewhere.

Each line says what to try (`advice`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seqrec.config import RunConfig
from seqrec.data.prepared import PreparedDataset
from seqrec.evaluation.protocols import (
    SCORES_BYTES,
    Scorer,
    evaluate_split,
    pad_histories,
    parse_protocols,
    times_argument,
)

__all__ = ["POP_MARGIN", "advice", "judge"]

# a model whose validation metric is within this factor of POP's has learned little beyond
# popularity
POP_MARGIN = 1.1


def judge(
    cfg: RunConfig,
    ds: PreparedDataset,
    history: Sequence[dict[str, Any]],
    metrics: dict[str, Any],
    stopped: str,
    steps: int,
    scorer: Scorer,
    device: torch.device,
) -> dict[str, Any]:
    """The keys a run's metrics record of it (`valid_pop` where it validated, `passes`,
    `same_top10`, `steps_set_by`), each line said on the way."""
    out: dict[str, Any] = {}
    t = cfg.train
    if "valid" in metrics:
        out["valid_pop"] = _compare_with_pop(metrics["valid"], cfg, ds, device)
    out["passes"] = round(_passes(cfg, ds, history), 4)
    out["same_top10"] = _same_top10(cfg, ds, scorer, device)
    clock = stopped == "time_budget" or t.decay == "budget"
    out["steps_set_by"] = "clock" if clock else "data"
    if clock:
        how = "ended" if stopped == "time_budget" else "scheduled"
        _say(
            f"note: the time budget ({t.time_budget}) {how} the run after {steps:,} steps: "
            "that number depends on this machine's speed and load, so the same seed may give "
            "another model elsewhere (without a time budget the run stops on validation and is "
            "reproducible). The budget bounds the training; preparing the data and the final "
            "evaluation come on top"
        )
    return out


def advice(cfg: RunConfig) -> str:
    """What to try when a run learned too little."""
    if cfg.train.time_budget:
        return "train longer: a longer time_budget, or none (it then stops on validation)"
    return "another recipe: sasrec-ce fits its sizes and loss to the catalogue"


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _compare_with_pop(
    valid: dict[str, dict[str, float]], cfg: RunConfig, ds: PreparedDataset, device: torch.device
) -> dict[str, dict[str, float]]:
    """POP's validation metric, to stand beside the chosen state's; one line when the model's
    is within POP_MARGIN of it."""
    from seqrec.models.baselines import Popularity

    t = cfg.train
    protocol = parse_protocols(t.val_protocol)[0]
    report = evaluate_split(
        ds,
        Popularity.fit(ds.split.training(t.train_on)),
        "valid",
        protocols=(protocol,),
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
        device=device,
        sample_users=cfg.eval.sample_users,
        seed=cfg.eval.negative_seed,
    )
    pop = float(report.metrics[protocol][t.val_metric])
    ours = float(valid[protocol][t.val_metric])
    if ours <= pop * POP_MARGIN:
        said = "not above" if ours <= pop else f"within {POP_MARGIN - 1:.0%} of"
        _say(
            f"warning: validation {protocol} {t.val_metric} {ours:.4f} is {said} POP's "
            f"{pop:.4f}: the model learned little more than popularity ({advice(cfg)})"
        )
    return {protocol: {t.val_metric: pop}}


def _passes(cfg: RunConfig, ds: PreparedDataset, history: Sequence[dict[str, Any]]) -> float:
    """The epochs trained, as passes over the training sequences; one line when under one."""
    n_train = max(1, int((ds.split.training(cfg.train.train_on).lengths >= 2).sum()))
    passes = sum(h["sequences"] for h in history) / n_train
    if passes < 1:
        _say(
            f"warning: the run trained {passes:.2f} of one pass over the training sequences: "
            f"the model has seen too little to be trusted ({advice(cfg)})"
        )
    return passes


def _same_top10(
    cfg: RunConfig, ds: PreparedDataset, scorer: Scorer, device: torch.device, n: int = 256
) -> bool:
    """Whether the chosen state gives the same top-10 to the first `n` test users (fewer where
    their scores over the catalogue would pass evaluation's bound; one line when it does: the
    model ranks by popularity alone)."""
    test = ds.split.test
    n = min(n, max(2, SCORES_BYTES // (4 * (ds.n_items + 1))))
    rows = np.arange(min(n, len(test.targets)))
    if len(rows) < 2:
        return False
    histories = torch.from_numpy(pad_histories(test.histories, rows, scorer.max_len)).to(device)
    times = times_argument(scorer, test, rows, histories.shape[1], device)
    with torch.no_grad():
        scores = scorer.score(histories, **times).clone()
    scores[:, 0] = -torch.inf  # the padding id
    top = torch.topk(scores, min(10, scores.shape[1] - 1), dim=1).indices.sort(dim=1).values
    same = bool((top == top[:1]).all())
    if same:
        _say(
            f"warning: the model gives every one of {len(rows)} test users the same top-10 "
            f"(it ranks by popularity alone; {advice(cfg)})"
        )
    return same
