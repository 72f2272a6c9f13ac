"""Frozen configuration dataclasses, and the values read into them (types, durations, dotted
overrides).

Each key has one home for its default (the dataclass field). Unknown keys and values of the
wrong type are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tomllib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from seqrec.data.settings import DataConfig, EvalConfig, ItemsConfig
from seqrec.data.split import TrainOn
from seqrec.errors import ConfigError

__all__ = [
    "RunConfig",
    "ShortBudget",
    "TrainConfig",
    "config_diff",
    "default_config",
    "dotted_key",
    "from_dict",
    "parse_duration",
    "parse_override",
]


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe, shared by every neural model. The defaults are BERT4Rec's
    (§4.3); `default_config("sasrec")` starts from SASRec's (§IV-C) instead."""

    lr: float = 1e-4  # peak learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6  # BERT's AdamWeightDecayOptimizer
    weight_decay: float = 0.01  # decoupled L2, not on LayerNorm weights and biases
    # A speed option: the same AdamW update as one fused kernel per parameter (torch's
    # `fused=True`, CPU and CUDA) instead of a dozen element-wise passes; on a CPU with a large
    # item embedding the update is much of a step (docs/results/performance.md). Same algorithm,
    # different rounding, so off by default: the shipped results were trained without it.
    fused_adamw: bool = False
    warmup_steps: int = 100  # linear warm-up (original script: 100), then linear decay to 0
    max_epochs: int = 200  # the decay reaches 0 at max_epochs (decay = "epochs")
    # Updates at most; when set (> 0) training ends there, mid-epoch if need be, and the decay
    # (decay = "epochs") reaches 0 there instead of at max_epochs: the original code counts its
    # schedule in steps (run_ml-1m.sh: 400,000). 0 = no step limit.
    max_steps: int = 0
    # "epochs": the decay ends at max_epochs (deterministic, resumable to the bit);
    # "budget": it ends when time_budget runs out, so a budgeted run always anneals fully
    # whatever the machine's speed (the step count, hence the result, depends on the speed).
    # "none": a constant learning rate after the warm-up (SASRec's original code).
    # "plateau": the rate is multiplied by `plateau_factor` each time `plateau_patience`
    # validations in a row have not improved (as torch's ReduceLROnPlateau): a schedule that
    # follows the data, not the clock, for runs that stop on `patience`. A run records the
    # epochs after which it lowered the rate ("lr_reductions" in its metrics); a run that
    # validates nothing (train+valid: a refit) lowers it after the epochs of `plateau_at`.
    decay: Literal["epochs", "budget", "none", "plateau"] = "epochs"
    plateau_patience: int = 2
    plateau_factor: float = 0.5
    plateau_at: tuple[int, ...] = ()
    # The decay's shape over the schedule's progress p (0..1, by epochs or by the budget): the
    # rate stays at its peak until p = decay_start, then falls to 0 at p = 1, "linear" as 1 - x
    # or "cosine" as (1 + cos(pi x)) / 2, x = (p - decay_start) / (1 - decay_start). decay_start
    # 0 decays from the warm-up on (BERT's schedule); e.g. 0.5 holds the peak for half of the
    # schedule first (a warm-up / stable / decay schedule).
    decay_shape: Literal["linear", "cosine"] = "linear"
    decay_start: float = 0.0
    batch_size: int = 256
    clip_norm: float = 5.0  # gradient clipping by global L2 norm; 0 = none
    # The loss (seqrec.training.losses): "ce" full softmax (BERT4Rec Eq. 8), "bce" with n_negatives
    # per target (SASRec §III-E: 1), "sampled_softmax", "gbce" (gSASRec), "bpr" / "top1" (GRU4Rec),
    # "bpr_max" / "top1_max" (GRU4Rec+).
    loss: Literal["ce", "bce", "sampled_softmax", "gbce", "bpr", "top1", "bpr_max", "top1_max"] = (
        "ce"
    )
    n_negatives: int = 1  # k, negatives per target (sampled losses only)
    # "position": k negatives per target position (SASRec §III-E, gSASRec); "sequence": k per
    # sequence, shared by its positions: one matmul instead of a (M, k, D) gather, ~10x faster
    # at k = 256 on a CPU (SASRec only); "batch": k distinct items per batch, shared by every
    # target position of it (the Cloze task too), drawn from the whole catalogue; a target
    # drawn among them is left out of its own row's negatives. sampled_softmax, bce or gbce
    # only. For large catalogues, where a full softmax per target dominates a step.
    negatives_per: Literal["position", "sequence", "batch"] = "position"
    # How negatives are drawn (next-item task): "uniform" over the items not in the sequence
    # (SASRec's random_neq, BPR), or "popularity": in proportion to the training counts, as the
    # other sessions' targets of GRU4Rec's mini-batches are; the models then learn to rank
    # beyond popularity, which is what pop100 (popularity-sampled candidates) measures.
    negative_sampling: Literal["uniform", "popularity"] = "uniform"
    gbce_t: float = 0.75  # gBCE calibration t (Petrov & Macdonald 2023's default)
    logq: bool = False  # sampled_softmax: subtract log(k q(j)) from each negative's score
    # bce/gbce: add log(beta / k) to every score, so training starts where the positive and the
    # k negatives balance instead of at sigmoid 0.5 (a constant: the ranking is unchanged; 0 for
    # k = 1 BCE). DEVIATION from gSASRec, off by default: with 256 negatives and no offset our
    # SASRec collapses to one hidden state for every history (docs/design/sasrec.md).
    prior_offset: bool = False
    bpreg: float = 1.0  # bpr_max: λ of its score regulariser (GRU4Rec+ code's bpreg)
    eval_every: int = 1  # validate every k epochs
    # write the checkpoint and the log every k epochs (and after the last): on a GPU an epoch
    # of ML-1M takes a fraction of a second, less than writing them
    checkpoint_every: int = 1
    patience: int = 10  # validations without improvement before stopping; 0 = never stop early
    val_protocol: str = "full"  # early stopping / best state: this protocol on VALIDATION
    val_metric: str = "ndcg@10"
    # What the model learns from: "train", the training part (BERT4Rec §4.1, SASRec §IV-A), or
    # "train+valid": the validation items too. DEVIATION (the original BERT4Rec code's
    # gen_data_fin.py, "put validate into train": its Table 2 numbers come from a model that
    # trained on every item but the test one). Nothing is then validated (the validation
    # targets are training targets): the run's last state is the tested one, so the schedule
    # (e.g. a budget's decay) must be fixed beforehand, on a "train" run; patience must be 0.
    # "all": every item, the test ones too: the state to serve (a refit with `final`), which
    # nothing held out can measure (its metrics hold no validation or test numbers).
    train_on: TrainOn = "train"
    time_budget: str | None = None  # wall clock for training, e.g. "20m", "1h30m", "90s"
    seed: int = 0
    device: str = "auto"  # "auto" = cuda when available, else cpu
    # Autocast the model's matmuls to bfloat16 (AMX tile units, GPU tensor cores). "auto": on a
    # GPU, or a CPU with AMX, time a few forward/backward passes both ways at the start and keep
    # the faster; fp32 on a CPU without matrix units (slower there at d <= 64,
    # docs/results/performance.md). The choice is recorded in the run's metrics ("precision").
    bf16: bool | Literal["auto"] = False
    # Only the full-catalogue CE's two big matmuls in bfloat16 (the softmax stays fp32), the
    # model in fp32. Faster on some CPUs (AMD Zen 4: bf16 matmuls 2.3x fp32), slower on others
    # (an Intel Xeon without AMX: the casts cost more than the matmuls gain). "auto": time the
    # CE of this model's shapes both ways at the start and keep the faster.
    loss_bf16: bool | Literal["auto"] = False
    # On CUDA only: float32 matmuls on TF32 tensor cores (10-bit mantissa inputs, fp32
    # accumulation), the usual setting for training transformers on Ampere and later GPUs.
    tf32: bool = True
    threads: int = 0  # torch intra-op threads; 0 = PyTorch's default (one per core)
    # Training batches built this many ahead by a background thread (0: each when it is due, in
    # the training loop's thread). The same batches in the same order; on a GPU the host can
    # build batches while the device runs the steps (measured: docs/results/performance.md).
    prefetch: int = 0
    # A run directory whose best weights start this run (a warm restart: fresh optimiser,
    # warm-up and decay). It must hold the same model settings and the same items. None = the
    # initialisation of the model config.
    init_from: str | None = None
    # TensorBoard event files in the run's tensorboard/ folder (loss, learning rate, sequences/s
    # and the validation metric by epoch), beside log.jsonl and log.csv, which are always
    # written. Needs the `tensorboard` extra.
    tensorboard: bool = False


@dataclass(frozen=True)
class ShortBudget:
    """One tier of settings for short training budgets (`[[short_budget]]` in a config): a run
    trains with `set` applied (each `section.key=value`, as `--set`) when its `train.time_budget`
    is short, so one config gives the best model at 5 minutes and at 60 (what learns fastest is
    not what ends best, docs/results/bert4rec.md). Short means either under `minutes` of budget, or,
    with `epochs`, a budget that buys fewer than `epochs` epochs of the config on the machine at
    hand: timed when the run starts (`epochs_bought` in seqrec.training.policy), so a slow machine
    and a fast one each get the settings their budget can use. Every tier that is due applies, in
    order. A key given explicitly with the config (`seqrec train --set`, a sweep's overrides)
    wins over a tier's setting. A run's recorded config is the resolved one: the settings
    applied, `applied` true, and an epochs tier's measured `bought`, so nothing is decided
    twice (a resumed run keeps its first decision)."""

    minutes: float = 0.0  # due under this many minutes of budget; 0: not by minutes
    epochs: float = 0.0  # due when the budget buys fewer epochs than this; 0: not by epochs
    # due when the run trains on this kind of device ("cuda", "cpu"), whatever its budget: a
    # recipe's settings for a GPU (a larger batch, its learning rate); "": not by device
    device: str = ""
    set: tuple[str, ...] = ()
    applied: bool = False
    bought: float | None = None  # an epochs tier, once decided: the epochs the budget bought
    on: str | None = None  # a device tier, once decided: the kind of device the run trained on

    def __post_init__(self) -> None:
        if self.minutes < 0:
            raise ConfigError(f"short_budget.minutes: expected >= 0, got {self.minutes}")
        if self.epochs < 0:
            raise ConfigError(f"short_budget.epochs: expected >= 0, got {self.epochs}")
        if self.device not in ("", "cpu", "cuda"):
            raise ConfigError(f"short_budget.device: expected cpu or cuda, got {self.device!r}")
        if sum(bool(x) for x in (self.minutes, self.epochs, self.device)) > 1:
            raise ConfigError(
                "short_budget: a tier is due by minutes, by epochs or by device, one of them "
                f"(got minutes = {self.minutes:g}, epochs = {self.epochs:g}, "
                f"device = {self.device!r})"
            )
        for text in self.set:
            keys, _ = parse_override(text)
            # a device tier, decided first, may set the budget the other tiers then read
            budget = keys == ["train", "time_budget"] and not self.device
            if keys[0] in ("short_budget", "model") or budget or keys == ["train", "device"]:
                raise ConfigError(
                    f"short_budget.set: {text!r} cannot be a tier's setting (not the model, "
                    "the device or the tiers; the budget only in a device tier)"
                )

    def said(self) -> list[str]:
        """Its settings, each with when it is due ("bert4rec.max_len=100 (under 50 epochs)")."""
        if self.device:
            return [f"{text} (on {self.device})" for text in self.set]
        when = f"{self.epochs:g} epochs" if self.epochs else f"{self.minutes:g} min"
        return [f"{text} (under {when})" for text in self.set]

    def keys(self) -> list[str]:
        """The dotted keys `set` changes."""
        return [dotted_key(text) for text in self.set]

    def without(self, keys: typing.Collection[str]) -> ShortBudget:
        """The same tier, less the settings of `keys` (keys given explicitly win)."""
        kept = tuple(t for t, k in zip(self.set, self.keys(), strict=True) if k not in keys)
        return dataclasses.replace(self, set=kept)


# RunConfig's own keys; the rest are sections
_RUN_KEYS = ("data", "eval", "items", "model", "train", "short_budget", "adapt")
# the sizes a recipe may fit to the data when a run starts (`adapt = [...]`, `adapt_to_data`)
Adaptable = Literal["max_len", "batch_size", "loss", "lr"]
# the keys that fix an adapted setting when given explicitly (an override wins over `adapt`)
_ADAPTED_BY = {
    **{key: key for key in ("max_len", "batch_size", "lr")},
    **dict.fromkeys(("loss", "n_negatives", "negatives_per", "logq"), "loss"),
}


@dataclass(frozen=True)
class RunConfig:
    """A run's whole config: data, evaluation, the model's name, the training recipe, and the
    chosen model's own sections (its architecture and training task, e.g. [bert4rec] and
    [cloze]) as the registry names them (seqrec.models.registry). A section is read as an attribute
    (`cfg.bert4rec`); another model's section is not there (an AttributeError that says whose
    it is), and in a config file it is an error."""

    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    items: ItemsConfig = field(default_factory=ItemsConfig)
    model: str = "bert4rec"
    train: TrainConfig = field(default_factory=TrainConfig)
    short_budget: tuple[ShortBudget, ...] = ()  # tiers of settings for shorter budgets
    # sizes fitted to the data when a run starts (`adapt_to_data`); the run's config records the
    # fitted values and an empty list
    adapt: tuple[Adaptable, ...] = ()
    # (section name, frozen dataclass) pairs in the registry's order; a missing section takes
    # its defaults
    sections: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        from seqrec.models import (
            registry,  # the registry imports the models, which import this module
        )

        entry = registry.entry(self.model)
        given = dict(self.sections)
        for name in given.keys() - entry.sections.keys():
            raise ConfigError(_foreign(name, self.model, "config"))
        full = []
        for name, cls in entry.sections.items():
            value = given.get(name)
            if value is None:
                value = cls()
            elif not isinstance(value, cls):
                raise ConfigError(f"config.{name}: expected a {cls.__name__}, got {value!r}")
            full.append((name, value))
        object.__setattr__(self, "sections", tuple(full))

    def __getattr__(self, name: str) -> Any:
        # called only when `name` is not a field: the model's sections
        if not name.startswith("__"):
            for key, value in object.__getattribute__(self, "sections"):
                if key == name:
                    return value
            from seqrec.models import registry

            owner = registry.section_owner(name)
            if owner is not None:
                raise AttributeError(
                    f"{name}: a section of model {owner!r}; this config's model is "
                    f"{object.__getattribute__(self, 'model')!r}"
                )
        raise AttributeError(name)

    def replace_section(self, name: str, **changes: Any) -> RunConfig:
        """A copy with section `name`'s fields changed (dataclasses.replace for a section)."""
        if name not in dict(self.sections):
            raise ConfigError(_foreign(name, self.model, "config"))
        sections = tuple(
            (k, dataclasses.replace(v, **changes) if k == name else v) for k, v in self.sections
        )
        return dataclasses.replace(self, sections=sections)

    def to_dict(self) -> dict[str, Any]:
        """The config as its TOML / run-directory layout: data, eval, model, train, short_budget,
        then each section at the top level ({"bert4rec": {...}, "cloze": {...}})."""
        out: dict[str, Any] = {
            "data": dataclasses.asdict(self.data),
            "eval": dataclasses.asdict(self.eval),
            "items": dataclasses.asdict(self.items),
            "model": self.model,
            "train": dataclasses.asdict(self.train),
            "short_budget": [dataclasses.asdict(tier) for tier in self.short_budget],
            "adapt": list(self.adapt),
        }
        for name, value in self.sections:
            out[name] = dataclasses.asdict(value)
        return out


def _foreign(section: str, model: str, where: str) -> str:
    from seqrec.models import registry

    owner = registry.section_owner(section)
    if owner is None:
        known = ", ".join([*_RUN_KEYS, *registry.entry(model).sections])
        return f"{where}: unknown key {section}; known: {known}"
    return (
        f"{where}: [{section}] is a section of model {owner!r}, not of {model!r} (this run's model)"
    )


def _run_config_from_dict(data: dict[str, Any], where: str, foreign: str) -> RunConfig:
    """RunConfig from its TOML layout; another model's section is an error (`foreign` "error")
    or left out ("drop": run directories written before a config held one model's sections)."""
    from seqrec.models import registry

    model = _coerce(data.get("model", "bert4rec"), str, f"{where}.model")
    try:
        entry = registry.entry(model)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    hints = typing.get_type_hints(RunConfig)
    kwargs = {k: _coerce(data[k], hints[k], f"{where}.{k}") for k in _RUN_KEYS if k in data}
    sections = []
    for key, value in data.items():
        if key in _RUN_KEYS:
            continue
        if key in entry.sections:
            sections.append((key, _coerce(value, entry.sections[key], f"{where}.{key}")))
        elif foreign == "drop" and registry.section_owner(key) is not None:
            continue
        else:
            raise ConfigError(_foreign(key, model, where))
    return RunConfig(**kwargs, sections=tuple(sections))


def default_config(model: str = "bert4rec") -> RunConfig:
    """The defaults for `model`: the dataclass defaults with that model's training recipe."""
    from seqrec.models import registry

    entry = registry.entry(model)
    train = dataclasses.replace(TrainConfig(), **entry.train_defaults)
    return RunConfig(model=model, train=train)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a: Any, b: Any) -> list[str]:
    """Where two configs (dataclasses) differ: one "section.key: a vs b" per differing key."""
    fa = _flatten(a.to_dict() if isinstance(a, RunConfig) else dataclasses.asdict(a))
    fb = _flatten(b.to_dict() if isinstance(b, RunConfig) else dataclasses.asdict(b))
    return [
        f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}"
        for k in sorted(fa.keys() | fb.keys())
        if fa.get(k) != fb.get(k)
    ]


_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str | float | int) -> float:
    """ "20m", "1h30m", "90s", "45" (seconds) -> seconds."""
    s = str(text).strip().lower()
    total, num = 0.0, ""
    try:
        total = float(s)
        s = ""
    except ValueError:
        pass
    for ch in s:
        if ch.isdigit() or ch == ".":
            num += ch
        elif ch in _UNITS and num:
            total += float(num) * _UNITS[ch]
            num = ""
        else:
            num = "!"
            break
    if num or total <= 0:
        raise ConfigError(f"time budget {text!r}: expected e.g. 20m, 1h30m, 90s or seconds")
    return total


T = TypeVar("T")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:  # an optional X: X's own message
            return _coerce(value, others[0], where)
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} is not a valid {tp}")
    if origin is tuple:
        (elem, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, elem, where) for v in value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return from_dict(tp, value, where)  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, dt.date | dt.time):  # TOML's unquoted dates: their ISO text
            return value.isoformat()
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(
    cls: type[T], data: dict[str, Any], where: str = "config", *, foreign: str = "error"
) -> T:
    """Build a config dataclass from a (nested) dict; unknown keys are an error. A RunConfig
    takes the sections of its model; another model's section is an error, or, with
    `foreign="drop"`, left out."""
    if cls is RunConfig:
        return _run_config_from_dict(data, where, foreign)  # type: ignore[return-value]
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def dotted_key(text: str) -> str:
    """The key of a `section.key=value` override, dotted ("bert4rec.max_len")."""
    return ".".join(parse_override(text)[0])


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value); the value is read as TOML when it
    parses (numbers, booleans, lists, quoted strings), else taken as a plain string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


# ------------------------------------------------------------------------------------ ranges
