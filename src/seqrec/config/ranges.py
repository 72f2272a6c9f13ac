"""Every config value against its range, before anything is built or written."""

from __future__ import annotations

import dataclasses
import math

from seqrec.config.classes import RunConfig
from seqrec.errors import ConfigError

__all__ = ["UNBOUNDED", "check_ranges"]

# A key's valid range wherever it appears (any section): (low, high, low_open, high_open), None
# for no bound. Checked by `validate` before a run writes anything and when a run directory's
# config is read back, so that an edited run config is one line, not a crash or an allocation.
# Sizes have upper bounds too, so that no number builds for minutes or asks for memory before
# seqrec.training.sizes can weigh the whole config: widths up to 65,536, layers up to 256,
# histories up to 65,536 items; the memory a config asks for is bounded by seqrec.training.sizes.
_MAX_WIDTH = 65536
# Counts that only cap a loop, set a period or seed a generator cost nothing however large, but
# every count has a bound all the same: a billion (a typo of a few digits more is one line).
_MAX_COUNT = 10**9
_MAX_SEED = 2**32 - 1


_RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "d_model": (1, _MAX_WIDTH, False, False),
    "n_heads": (1, 1024, False, False),
    "n_layers": (0, 256, False, False),
    "max_len": (1, 65536, False, False),
    "hidden": (1, _MAX_WIDTH, False, False),
    "factors": (1, _MAX_WIDTH, False, False),
    "d_qk": (1, _MAX_WIDTH, False, False),
    "d_v": (1, _MAX_WIDTH, False, False),
    "temperature": (0, None, True, False),
    "time_buckets": (1, 65536, False, False),
    "n_h": (0, _MAX_WIDTH, False, False),
    "n_v": (0, _MAX_WIDTH, False, False),
    "window": (1, 1024, False, False),
    "max_predictions": (1, 65536, False, False),
    "bucket_batches": (0, 1 << 20, False, False),
    "dropout": (0, 1, False, True),
    "attn_dropout": (0, 1, False, True),
    "mask_prob": (0, 1, True, False),
    "last_item_ratio": (0, 1, False, False),
    "sliding_step": (0, 1, False, False),
    "init_std": (0, None, False, False),
    "lr": (0, None, False, False),
    "beta1": (0, 1, False, True),
    "beta2": (0, 1, False, True),
    "eps": (0, None, False, False),
    "weight_decay": (0, None, False, False),
    "warmup_steps": (0, _MAX_COUNT, False, False),
    "max_epochs": (1, _MAX_COUNT, False, False),
    "max_steps": (0, _MAX_COUNT, False, False),
    "decay_start": (0, 1, False, True),
    "plateau_patience": (1, _MAX_COUNT, False, False),
    "plateau_factor": (0, 1, True, True),
    "batch_size": (1, 1 << 20, False, False),
    "clip_norm": (0, None, False, False),
    "n_negatives": (0, 1 << 24, False, False),  # how many a loss needs: checked with the loss
    "gbce_t": (0, 1, False, False),
    "bpreg": (0, None, False, False),
    "eval_every": (1, _MAX_COUNT, False, False),
    "checkpoint_every": (1, _MAX_COUNT, False, False),
    "prefetch": (0, 256, False, False),
    "patience": (0, _MAX_COUNT, False, False),
    "threads": (0, 4096, False, False),
    "seed": (0, _MAX_SEED, False, False),
    "negative_seed": (0, _MAX_SEED, False, False),
    "sample_users": (0, _MAX_COUNT, False, False),
    "min_user_interactions": (1, _MAX_COUNT, False, False),
    "min_item_interactions": (1, _MAX_COUNT, False, False),
    "id_dropout": (0, 1, False, False),
    "text_dim": (1, 4096, False, False),
    "cold_neighbours": (1, 1000, False, False),
    "query_groups": (1, 1024, False, False),  # the MoL head's (seqrec.models.mol)
    "item_groups": (1, 1024, False, False),
    "dim": (1, _MAX_WIDTH, False, False),
    "query_hidden": (1, _MAX_WIDTH, False, False),
    "gate_hidden": (1, _MAX_WIDTH, False, False),
    "item_dropout": (0, 1, False, True),
    "gate_dropout": (0, 1, False, True),
    "lru_dropout": (0, 1, False, True),  # LRURec's ring of initial moduli, and its dropout
    "r_min": (0, 1, True, False),
    "r_max": (0, 1, True, False),
}

# The numbers with no upper bound: rates and scales, where a large value is a model that
# diverges (training stops on its first non-finite loss, in one line), not a size.
UNBOUNDED = frozenset(
    {"bpreg", "clip_norm", "eps", "init_std", "lr", "temperature", "weight_decay"}
)


def _in_range(
    where: str, value: float, rule: tuple[float | None, float | None, bool, bool]
) -> None:
    low, high, low_open, high_open = rule
    bad = (low is not None and (value < low or (low_open and value == low))) or (
        high is not None and (value > high or (high_open and value == high))
    )
    if bad:
        if high is None:
            span = f"{'>' if low_open else '>='} {low:g}"
        else:
            lo = "-inf" if low is None else f"{low:g}"
            hi = f"{high:d}" if isinstance(high, int) else f"{high:g}"
            span = f"in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
        raise ConfigError(f"{where} must be {span}, got {value!r}")


def check_ranges(cfg: RunConfig, where: str = "config") -> RunConfig:
    """Check every value of `cfg` against its range (one ConfigError line naming the key): every
    number finite, the sizes and rates of `_RANGES`, attention widths divisible by their heads.
    The one range check: part of `seqrec.training.validation.validate`, and run when a run is
    loaded."""
    sections = [
        ("data", cfg.data),
        ("eval", cfg.eval),
        ("items", cfg.items),
        ("train", cfg.train),
        *cfg.sections,
    ]
    for name, section in sections:
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            key = f"{where}: {name}.{f.name}"
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{key} must be a finite number, got {value!r}")
            if f.name in _RANGES:
                _in_range(key, value, _RANGES[f.name])
        heads, width = getattr(section, "n_heads", None), getattr(section, "d_model", None)
        if isinstance(heads, int) and isinstance(width, int) and width % heads:
            raise ConfigError(
                f"{where}: {name}.d_model ({width}) must be a multiple of n_heads ({heads})"
            )
    return cfg
