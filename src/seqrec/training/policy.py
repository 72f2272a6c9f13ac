"""What a budget buys on this machine: the epochs a time budget pays for, timed on the run's own
batches, which decides the config's short-budget tiers."""

from __future__ import annotations

import math
import statistics
import time

import torch

from seqrec.config import (
    RunConfig,
    parse_duration,
)
from seqrec.data.prepared import PreparedDataset
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split, parse_protocols
from seqrec.training.setup import ModelScorer, resolve_device, setup
from seqrec.training.step import _resolved


def epochs_bought(ds: PreparedDataset, cfg: RunConfig, *, steps: int = 10) -> float:
    """How many epochs of `cfg` its `train.time_budget` buys on this machine, for its epochs
    short-budget tiers: `steps` updates of a throwaway model of `cfg` on its first batches
    timed (after 2 untimed ones), an epoch costing its number of batches times their mean, plus
    its share (1 / train.eval_every) of a validation pass, timed too where the run validates.
    The budget's clock has not started: a run pays these seconds on top, as for its "auto"
    precisions."""
    t = cfg.train
    if not t.time_budget:
        raise ConfigError("epochs_bought: the config has no train.time_budget")
    device = resolve_device(t.device)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    training = setup(ds, cfg, device)
    times = []
    for i, batch in zip(range(steps + 2), training.sampler.epoch(0), strict=False):
        start = time.perf_counter()
        float(training.step(batch))  # the step's time: until the device has done it
        if i >= 2:
            times.append(time.perf_counter() - start)
    epoch_s = len(training.sampler) * statistics.fmean(times or [math.inf])
    if t.train_on == "train" and t.eval_every > 0:
        training.model.eval()
        start = time.perf_counter()
        evaluate_split(
            ds,
            ModelScorer(training.model, _resolved(training.cfg.train.bf16, "bf16"), device),
            "valid",
            protocols=parse_protocols(t.val_protocol)[:1],
            ks=cfg.eval.ks,
            batch_size=cfg.eval.batch_size,
            device=device,
        )
        epoch_s += (time.perf_counter() - start) / t.eval_every
    return parse_duration(t.time_budget) / epoch_s


def _decided(cfg: RunConfig) -> str:
    """One line: what the timing decided for a run's epochs tiers."""
    timed = [tier for tier in cfg.short_budget if tier.epochs and tier.bought is not None]
    due = [x for tier in timed if tier.applied for x in tier.said()]
    return (
        f"{cfg.train.time_budget} buys ~{timed[0].bought:g} epochs of this config on this machine "
        f"(timed): {'it trains with ' + ', '.join(due) if due else 'no epochs tier applies'}"
    )
