"""The models seqrec can train, by name: one `ModelEntry` per model file (seqrec.models.base).

Adding a model: write its file under `seqrec/models/` (the module, its config dataclass, its
`ENTRY`) and add the entry to `ENTRIES` below. Nothing else names models: the config, the
training loop, run directories and the CLI read this table.
"""

from __future__ import annotations

from seqrec.errors import ConfigError
from seqrec.models import bert4rec, bprmf, caser, fpmc, gru4rec, lrurec, ncf, sasrec, transrec
from seqrec.models.base import ModelEntry

__all__ = ["MODELS", "entry", "section_owner"]

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
