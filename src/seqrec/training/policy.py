"""Policy: what a budget, a device or a log changes in a config, decided once when a run starts
(`resolve`) and recorded in its config: the sizes and loss a recipe fits to the data (`adapt`),
the device's tiers, the tiers a time budget buys on this machine (`epochs_bought`, timed on the
run's own batches); and the configs derived from a run (`as_trained`, `refit_config`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import typing
from collections.abc import Callable
from typing import Any

import torch

from seqrec.config import (
    RunConfig,
    ShortBudget,
    layered_config,
    parse_duration,
)
from seqrec.data.prepared import PreparedDataset
from seqrec.data.split import TrainOn
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split, parse_protocols
from seqrec.training.setup import ModelScorer, resolve_device, setup
from seqrec.training.step import _resolved
from seqrec.training.validation import validate

__all__ = [
    "ANY_LOG_ADAPT",
    "resolve",
    "LARGE_CATALOGUE",
    "adapt_to_data",
    "apply_device_tiers",
    "apply_short_budget",
    "as_trained",
    "device_tiers",
    "epochs_bought",
    "refit_config",
    "sampled_negatives",
    "short_budget_tiers",
    "speed_tiers",
]


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


def resolve(
    cfg: RunConfig,
    ds: PreparedDataset,
    device: str,
    *,
    say: Callable[[str], None] | None = None,
) -> RunConfig:
    """What a run trains, decided once when it starts (the run's config records the result, so a
    resumed run, whose recorded config has nothing left to decide, keeps it): the recipe's sizes
    fitted to the data (`adapt`), the tiers of the device the run trains on (`device`: "cpu",
    "cuda"), the tiers its time budget buys (an epochs tier timed on this machine,
    `epochs_bought`), and then the whole check with the data (`validate`). `say`: where a line
    of what was decided goes (the progress output)."""
    if cfg.adapt:
        train = ds.split.training(cfg.train.train_on)
        cfg, fitted = adapt_to_data(cfg, train.lengths, ds.n_items)
        if say is not None:
            say(f"sizes fitted to the data: {'; '.join(fitted)}")
    measuring = bool(speed_tiers(cfg))
    cfg = apply_device_tiers(cfg, device)
    cfg = validate(apply_short_budget(cfg, lambda base: epochs_bought(ds, base)), ds)
    if measuring and say is not None:
        say(_decided(cfg))
    return cfg


def _decided(cfg: RunConfig) -> str:
    """One line: what the timing decided for a run's epochs tiers."""
    timed = [tier for tier in cfg.short_budget if tier.epochs and tier.bought is not None]
    due = [x for tier in timed if tier.applied for x in tier.said()]
    return (
        f"{cfg.train.time_budget} buys ~{timed[0].bought:g} epochs of this config on this machine "
        f"(timed): {'it trains with ' + ', '.join(due) if due else 'no epochs tier applies'}"
    )


# What a model's defaults fit to the data when no recipe is named (`seqrec train MODEL`
# without --config, `seqrec.Model(name)`): its history length, batch and loss, as the recipes
# for any log do (`adapt_to_data`; an explicit value wins). The override that asks for it, put
# before the others.
ANY_LOG_ADAPT = 'adapt=["max_len", "batch_size", "loss"]'


def short_budget_tiers(cfg: RunConfig) -> list[ShortBudget]:
    """The minutes tiers `cfg`'s time budget is under and that are not applied yet."""
    if not cfg.train.time_budget:
        return []
    budget = parse_duration(cfg.train.time_budget)
    return [
        tier
        for tier in cfg.short_budget
        if not tier.applied and tier.set and tier.minutes and budget < 60 * tier.minutes
    ]


def speed_tiers(cfg: RunConfig) -> list[ShortBudget]:
    """The epochs tiers of `cfg` not decided yet (a run times its machine to decide them)."""
    if not cfg.train.time_budget:
        return []
    return [t for t in cfg.short_budget if t.epochs and t.set and t.bought is None]


def device_tiers(cfg: RunConfig) -> list[ShortBudget]:
    """The device tiers of `cfg` not decided yet (a run decides them by its device)."""
    return [t for t in cfg.short_budget if t.device and t.set and t.on is None]


def apply_device_tiers(cfg: RunConfig, device: str) -> RunConfig:
    """`cfg` as a run on a `device` ("cpu", "cuda") trains it: the settings of each undecided
    device tier of that device applied, in order; every undecided device tier then records the
    device (`on`) and whether it applied. Decided before the other tiers (an epochs tier times
    the config with them)."""
    return _decide_devices(cfg, lambda tier: tier.device == device, device)


def _decide_devices(cfg: RunConfig, due: Callable[[ShortBudget], bool], device: str) -> RunConfig:
    pending = device_tiers(cfg)
    if not pending:
        return cfg
    tiers: list[ShortBudget] = []
    settings: list[str] = []
    for tier in cfg.short_budget:
        if tier in pending:
            tier = dataclasses.replace(tier, applied=due(tier), on=device)
            settings += tier.set if tier.applied else ()
        tiers.append(tier)
    return dataclasses.replace(
        layered_config(RunConfig, None, settings, cfg), short_budget=tuple(tiers)
    )


def apply_short_budget(
    cfg: RunConfig, bought: Callable[[RunConfig], float] | None = None
) -> RunConfig:
    """`cfg` as a run trains it: the settings of each short-budget tier that is due applied, in
    order (those tiers marked `applied`); else `cfg` itself. An epochs tier is decided by
    `bought(cfg)`, the epochs `cfg`'s budget buys (called once, only when there is such a tier
    to decide), which the tier records; without `bought` it is left undecided."""
    measured: list[float] = []

    def decide(tier: ShortBudget) -> tuple[bool, float] | None:
        if bought is None:
            return None
        if not measured:
            measured.append(float(f"{bought(cfg):.4g}"))  # as the run's config records it
        return measured[0] < tier.epochs, measured[0]

    return _applied(cfg, decide)


def _applied(
    cfg: RunConfig, decide: Callable[[ShortBudget], tuple[bool, float] | None]
) -> RunConfig:
    """`cfg` with its due minutes tiers applied, and its undecided epochs tiers as `decide`
    says (due, and the epochs bought; None: left undecided)."""
    minute_tiers, pending = short_budget_tiers(cfg), speed_tiers(cfg)
    tiers: list[ShortBudget] = []
    settings: list[str] = []
    for tier in cfg.short_budget:
        if tier in minute_tiers:
            tier = dataclasses.replace(tier, applied=True)
            settings += tier.set
        elif tier in pending and (decision := decide(tier)) is not None:
            due, epochs = decision
            tier = dataclasses.replace(tier, applied=due, bought=epochs)
            settings += tier.set if due else ()
        tiers.append(tier)
    if tuple(tiers) == cfg.short_budget:
        return cfg
    return dataclasses.replace(
        layered_config(RunConfig, None, settings, cfg), short_budget=tuple(tiers)
    )


# The catalogue size above which `adapt = ["loss"]` trains a sampled softmax: between the
# synthetic long-tail log's 29,994 items, where the full softmax won at 5 minutes, and
# Beauty's 54,542, where it lost (benchmarks/results/recipes/recipes.md, 2 CPU cores).
LARGE_CATALOGUE = 32_768


def sampled_negatives(n_items: int) -> int:
    """The items a sampled softmax draws per batch for a catalogue of `n_items`: a 16th of the
    catalogue, between 2,048 and 8,192 (Beauty's 54,542 items: 3,408, near the 3,000 of its
    measured recipe, docs/design/evaluation.md)."""
    return min(8192, max(2048, n_items // 16))


_ADAPT_ITEMS = 20_000  # a recipe's batch is kept up to this many items, then halved per doubling


_ADAPT_MIN_BATCH = 32


_ADAPT_MIN_LEN = 16


# `adapt = ["lr"]`: a log with fewer training interactions an item than this trains at the
# recipe's rate times sqrt(interactions an item / this), at least _ADAPT_LR_FLOOR of it. On the
# BERT4Rec authors' Beauty at a 3-core (8.2 interactions an item) the `bert4rec` recipe's 2e-3
# learned next to nothing and 1e-3 learned (benchmarks/results/recipes/bert4rec_sparse_probes.md);
# ML-1M (289 an item) keeps the recipe's rate.
_ADAPT_LR_INTERACTIONS = 32
_ADAPT_LR_FLOOR = 0.25


def adapt_to_data(
    cfg: RunConfig, lengths: typing.Sequence[int] | Any, n_items: int
) -> tuple[RunConfig, list[str]]:
    """`cfg` with the sizes its `adapt` list names fitted to a log whose users' training
    histories have `lengths` over `n_items` items, `adapt` then empty (what the run's config
    records); and one phrase per fitted size. The recipe's value is the upper bound:

    - `max_len` (the model section's): the 95th percentile of the history lengths, rounded up
      to a multiple of 8, at least 16: a model reads no more positions than nearly every user
      has (attention's cost grows with the square of the width);
    - `loss`: a full softmax ("ce") up to `LARGE_CATALOGUE` items; beyond, a softmax over
      `sampled_negatives(n_items)` items drawn uniformly per batch and shared by its positions,
      logQ-corrected (so that it estimates the full softmax): the full softmax's cost per
      sequence grows with the catalogue, and beyond this size it buys too few updates
      (docs/guide.md, "Recipes for your own log");
    - `batch_size` (a full softmax only): the recipe's up to 20,000 items, halved for every
      doubling beyond, at least 32: the full-softmax cost of a sequence grows with the
      catalogue, so a smaller batch keeps the number of updates a budget buys;
    - `lr`: the recipe's on a log of at least 32 training interactions an item; on a sparser
      one, times sqrt(interactions an item / 32), at least a quarter of it: on a catalogue
      whose items are seen a few times each, the recipe's rate moves their embeddings by its
      whole step on every rare sighting (Adam normalises the gradient) and nothing is learned.
    """
    import numpy as np

    said: list[str] = []
    out = cfg
    if "loss" in cfg.adapt and cfg.train.loss == "ce" and n_items > LARGE_CATALOGUE:
        k = sampled_negatives(n_items)
        train = dataclasses.replace(
            cfg.train, loss="sampled_softmax", n_negatives=k, negatives_per="batch", logq=True
        )
        out = dataclasses.replace(out, train=train)
        said.append(
            f"train.loss sampled_softmax over {k:,} items a batch, logQ-corrected "
            f"({n_items:,} items > {LARGE_CATALOGUE:,})"
        )
    if "max_len" in cfg.adapt:
        name = next((n for n, s in cfg.sections if hasattr(s, "max_len")), None)
        if name is not None:
            cap = getattr(cfg, name).max_len
            p95 = float(np.percentile(np.asarray(lengths), 95)) if len(lengths) else 0.0
            value = int(min(cap, max(_ADAPT_MIN_LEN, 8 * math.ceil(p95 / 8))))
            out = out.replace_section(name, max_len=value)
            said.append(f"{name}.max_len {value} (95 % of histories hold <= {p95:.0f} items)")
    if "lr" in cfg.adapt:
        per_item = float(np.sum(np.asarray(lengths))) / max(n_items, 1)
        factor = min(1.0, max(_ADAPT_LR_FLOOR, math.sqrt(per_item / _ADAPT_LR_INTERACTIONS)))
        if factor < 1.0:
            lr = float(f"{cfg.train.lr * factor:.2g}")
            out = dataclasses.replace(out, train=dataclasses.replace(out.train, lr=lr))
            said.append(
                f"train.lr {lr:g} ({per_item:.1f} training interactions an item, under "
                f"{_ADAPT_LR_INTERACTIONS})"
            )
    if "batch_size" in cfg.adapt and out.train.loss == "ce":
        batch = cfg.train.batch_size
        while batch > _ADAPT_MIN_BATCH and batch * n_items > cfg.train.batch_size * _ADAPT_ITEMS:
            batch //= 2
        batch = min(cfg.train.batch_size, max(batch, _ADAPT_MIN_BATCH))
        out = dataclasses.replace(out, train=dataclasses.replace(out.train, batch_size=batch))
        said.append(f"train.batch_size {batch} ({n_items:,} items)")
    return dataclasses.replace(out, adapt=()), said


def _as_adapted(cfg: RunConfig, like: RunConfig) -> RunConfig:
    """`cfg`'s adapted sizes as the run `like` fitted them (it recorded the values)."""
    out = cfg
    if "max_len" in cfg.adapt:
        for name, section in cfg.sections:
            if hasattr(section, "max_len") and hasattr(like, name):
                out = out.replace_section(name, max_len=getattr(like, name).max_len)
    if "batch_size" in cfg.adapt:
        out = dataclasses.replace(
            out, train=dataclasses.replace(out.train, batch_size=like.train.batch_size)
        )
    if "lr" in cfg.adapt:
        out = dataclasses.replace(out, train=dataclasses.replace(out.train, lr=like.train.lr))
    if "loss" in cfg.adapt:
        keys = ("loss", "n_negatives", "negatives_per", "logq")
        train = dataclasses.replace(out.train, **{k: getattr(like.train, k) for k in keys})
        out = dataclasses.replace(out, train=train)
    return dataclasses.replace(out, adapt=())


def as_trained(cfg: RunConfig, like: RunConfig | None = None) -> RunConfig:
    """The settings a run of `cfg` trains with: its short-budget settings applied where they
    apply, and the tiers then left out. Two configs that train the same model compare equal
    through it, so a finished run is reused. An epochs tier depends on the machine's speed:
    with `like` (the recorded config of a run that decided it) it is due where `like` applied a
    tier of the same settings; else it is left out. Sizes fitted to the data (`adapt`) are
    `like`'s, or left as the recipe's without it."""
    if like is None:
        return dataclasses.replace(_applied(cfg, lambda tier: None), short_budget=(), adapt=())
    cfg = _as_adapted(cfg, like)
    done = {t.set for t in like.short_budget if t.applied}
    cfg = _decide_devices(cfg, lambda tier: tier.set in done, "as recorded")
    decided = _applied(cfg, lambda tier: (tier.set in done, math.nan))
    return dataclasses.replace(decided, short_budget=())


def refit_config(
    cfg: RunConfig,
    best_epoch: int,
    lr_reductions: typing.Sequence[int] = (),
    train_on: TrainOn = "train+valid",
) -> RunConfig:
    """The config that trains a finished run's `cfg` again on the training and the validation
    items: for the `best_epoch + 1` epochs (0-based `best_epoch`) its validation chose, with its
    schedule fitted to those epochs (a budget's decay becomes a decay over them; a plateau
    schedule lowers the rate after the epochs the run lowered it, `lr_reductions`), no time
    budget, nothing validated, its tiers and its sizes as it trained them. What the test then
    measures was chosen on validation; the validation items are trained on (the state to serve,
    or the original BERT4Rec code's `train+valid` protocol without its selection on the test
    split); `train_on="all"`: on every item, the test ones too (the state to serve, tested on
    nothing)."""
    t = cfg.train
    if t.train_on != "train":
        raise ConfigError(
            f'refit: the run trained on train.train_on = "{t.train_on}", so nothing chose its '
            "epochs on validation; refit a run trained on the training part"
        )
    if best_epoch < 0:
        raise ConfigError(f"refit: the run has no chosen epoch (best epoch {best_epoch})")
    train = dataclasses.replace(
        t,
        train_on=train_on,
        time_budget=None,
        max_epochs=best_epoch + 1,
        max_steps=0,
        decay="epochs" if t.decay == "budget" else t.decay,
        patience=0,
        plateau_at=tuple(e for e in lr_reductions if e < best_epoch),
    )
    return dataclasses.replace(as_trained(cfg), train=train)
