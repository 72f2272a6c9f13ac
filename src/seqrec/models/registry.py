"""The models seqrec can train, by name: one `ModelEntry` per model file (seqrec.models.base).

Adding a model: write its file under `seqrec/models/` (the module, its config dataclass, its
`ENTRY`) and add the entry to `ENTRIES` below. Nothing else names models: the config, the
training loop, run directories and the CLI read this table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from seqrec.errors import ConfigError
from seqrec.models import (
    bert4rec,
    bprmf,
    caser,
    fpmc,
    gru4rec,
    hstu,
    lrurec,
    ncf,
    sasrec,
    transrec,
)
from seqrec.models.base import ModelEntry

if TYPE_CHECKING:
    from seqrec.config import RunConfig

__all__ = ["MODELS", "entry", "reads_item_features", "section_owner"]

ENTRIES: tuple[ModelEntry, ...] = (
    bert4rec.ENTRY,
    sasrec.ENTRY,
    gru4rec.ENTRY,
    bprmf.ENTRY,
    ncf.ENTRY,
    fpmc.ENTRY,
    caser.ENTRY,
    transrec.ENTRY,
    lrurec.ENTRY,
    hstu.ENTRY,
)
MODELS: dict[str, ModelEntry] = {e.name: e for e in ENTRIES}


def entry(name: str) -> ModelEntry:
    """The entry of model `name`; a ConfigError naming the known models otherwise."""
    if name not in MODELS:
        raise ConfigError(f"model {name!r} is unknown; expected one of {', '.join(MODELS)}")
    return MODELS[name]


def section_owner(section: str) -> str | None:
    """The model whose config has `section` (e.g. "cloze" -> "bert4rec"), or None."""
    return next((e.name for e in ENTRIES if section in e.sections), None)


def reads_item_features(cfg: RunConfig) -> bool:
    """Whether `cfg`'s model takes item features (an item table it names, `item_tables`):
    read from a two-item model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = entry(cfg.model).build(2, 2, cfg)
    return any(getattr(model, name, None) is not None for name in model.item_tables)
