"""A run's configuration: frozen dataclasses (`classes`), loaded from defaults -> TOML file ->
dotted CLI overrides (`files`), every value checked against its range (`ranges`).

Each key has one home for its default (the dataclass field). Unknown keys and values of the
wrong type are errors, never silently ignored. What a budget or a log changes in a config is
policy, not configuration: seqrec.training.policy.
"""

from seqrec.config.classes import (
    RunConfig,
    ShortBudget,
    TrainConfig,
    config_diff,
    default_config,
    dotted_key,
    from_dict,
    parse_duration,
    parse_override,
)
from seqrec.config.files import (
    CONFIG_DIR,
    config_names,
    layered_config,
    load_config,
    resolve_config,
)
from seqrec.config.ranges import check_ranges
from seqrec.data.settings import DataConfig, EvalConfig, ItemsConfig

__all__ = [
    "CONFIG_DIR",
    "DataConfig",
    "EvalConfig",
    "ItemsConfig",
    "RunConfig",
    "ShortBudget",
    "check_ranges",
    "TrainConfig",
    "config_diff",
    "config_names",
    "default_config",
    "dotted_key",
    "from_dict",
    "layered_config",
    "load_config",
    "parse_duration",
    "parse_override",
    "resolve_config",
]
