"""How much memory a config asks for, from its numbers alone: nothing is built, not even on the
meta device. Each model's registry entry counts its parameters with a formula
(`ModelEntry.parameters`, checked against the built model by tests/test_model_contract.py);
this module adds what training holds beside them and refuses, in one line, a config over the
bound before anything is allocated (training, loading a run, experiment specs, estimators).

    parameters   every weight, float32
    training     the parameters' gradients and the optimiser's two moments (Adam): 3x more
    activations  one batch's hidden states kept for the backward pass, per layer, the
                 attention weights of the attention models (B x heads x L x L per layer), and
                 the loss's: a chunk of the full softmax's logits, or the sampled losses'
                 negatives (their embeddings gathered, their logits); and a Mixture-of-Logits
                 head's gating activations, per (position, item) pair

The bound is 8 GiB (`SEQREC_MAX_MODEL_BYTES` replaces it): loading a run checks the parameters
against it, training checks all three together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from seqrec.errors import ConfigError
from seqrec.files import env_bytes
from seqrec.models.mol import mol_activation_floats

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.item_features import ItemFeatures

__all__ = [
    "MAX_INDEX_LINKS",
    "MAX_ITEMS",
    "MAX_MODEL_BYTES",
    "Memory",
    "check_item_features",
    "check_memory",
    "index_file_bytes",
    "max_model_bytes",
    "memory",
]

# the most links a node of an item index's graph holds (`seqrec index --m`; seqrec.serving.index)
MAX_INDEX_LINKS = 512


def index_file_bytes(parameter_bytes: int, n_items: int) -> int:
    """The most bytes a run's item index (index.bin) can take: its vectors, no more than the
    model's parameters (they are its output layer, as float32), an id each, the links of a graph
    of `MAX_INDEX_LINKS` a node at its lowest level and as many again above, and room for the
    header and the library's own tables."""
    return parameter_bytes + n_items * (8 + 2 * 2 * 4 * MAX_INDEX_LINKS) + (64 << 20)


MAX_MODEL_BYTES = 8 << 30
# internal item ids are int32 in batches and prepared files (with PAD and BERT4Rec's MASK)
MAX_ITEMS = 2**31 - 3
_FLOAT = 4  # bytes: weights and activations are float32 (a lower precision only shrinks them)
_SAVED_PER_LAYER = 16  # hidden-sized tensors a layer keeps for its backward pass (generous)


@dataclass(frozen=True)
class Memory:
    """Bytes a config asks for (module docstring)."""

    parameters: int
    training: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.training + self.activations


def max_model_bytes() -> int:
    """The bound: 8 GiB, or $SEQREC_MAX_MODEL_BYTES."""
    return env_bytes("SEQREC_MAX_MODEL_BYTES", MAX_MODEL_BYTES)


def memory(cfg: RunConfig, n_items: int, n_users: int = 0) -> Memory:
    """What `cfg`'s model over `n_items` items (and `n_users` users, for the models with a
    per-user term) asks for (module docstring); a formula, nothing is built."""
    from seqrec.models.registry import entry

    params = entry(cfg.model).parameters(n_items, n_users, cfg) * _FLOAT
    section = cfg.sections[0][1] if cfg.sections else None
    length = int(getattr(section, "max_len", 1))
    width = max(int(getattr(section, key, 0)) for key in ("d_model", "hidden", "factors"))
    layers = int(getattr(section, "n_layers", 1) or 0) + 1  # and the embedding layer
    heads = getattr(section, "n_heads", None)
    rows = cfg.train.batch_size * length  # positions in one batch
    acts = rows * width * layers * _SAVED_PER_LAYER * _FLOAT
    if isinstance(heads, int):  # attention weights: (B, h, L, L) a layer, and their dropout mask
        acts += 2 * cfg.train.batch_size * heads * length * length * (layers - 1) * _FLOAT
    acts += _loss_floats(cfg, n_items, rows, width) * _FLOAT
    mol = dict(cfg.sections).get("mol")
    if mol is not None and getattr(section, "head", None) == "mol":  # a score per pair
        acts += mol_activation_floats(mol, rows * (cfg.train.n_negatives + 1)) * _FLOAT
    return Memory(params, 3 * params, acts)


def _loss_floats(cfg: RunConfig, n_items: int, positions: int, width: int) -> int:
    """What the loss holds for one batch, values and gradients: the full CE's chunk of logits
    (seqrec.training.losses computes it a chunk of rows at a time), or the sampled losses' gathered
    negative embeddings (per position, per sequence or shared by the batch) and their logits."""
    from seqrec.training.losses import ce_chunk_rows

    t = cfg.train
    k = t.n_negatives
    if t.loss == "ce":
        return 2 * ce_chunk_rows(n_items) * n_items
    gathered = {"position": positions, "sequence": t.batch_size, "batch": 1}[t.negatives_per]
    return 2 * (gathered * k * 2 * width + positions * (k + 1))


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 1 << 28 else f"{n / 2**20:,.1f} MiB"


def check_memory(
    cfg: RunConfig, n_items: int, n_users: int = 0, *, where: str = "config", training: bool
) -> Memory:
    """`memory(...)`, or one ConfigError line when it is over the bound: the parameters alone for
    a model loaded to score (`training` False), all three for a training."""
    if n_items > MAX_ITEMS:
        raise ConfigError(f"{where}: {n_items:,} items, over the {MAX_ITEMS:,} seqrec can index")
    mem = memory(cfg, n_items, n_users)
    asked = mem.total if training else mem.parameters
    limit = max_model_bytes()
    if asked > limit:
        parts = (
            f"parameters {_gib(mem.parameters)}, gradients and optimiser {_gib(mem.training)}, "
            f"activations of a batch {_gib(mem.activations)}"
            if training
            else f"its parameters at {n_items:,} items"
        )
        raise ConfigError(
            f"{where}: {cfg.model} asks for {_gib(asked)} ({parts}), over the {_gib(limit)} "
            "bound; smaller sizes, or $SEQREC_MAX_MODEL_BYTES set higher"
        )
    return mem


def check_item_features(features: ItemFeatures, width: int, where: str = "item features") -> int:
    """The bytes a model's item towers (seqrec.models.tower) ask for over `features` at `width`
    (the model's item vectors), or one ConfigError line when over the bound: every item's codes
    and their embeddings, all of an item's values at once (scoring embeds the whole catalogue),
    the dense values with their projection, and the vectors they are summed into."""
    rows = features.n_rows
    codes = sum(int(c.shape[0]) * int(c.shape[1]) * (8 + _FLOAT * width) for c in features.codes)
    dense = rows * features.width * _FLOAT * 2 + features.width * width * _FLOAT
    asked = codes + dense + 2 * rows * width * _FLOAT
    limit = max_model_bytes()
    if asked > limit:
        slots = max((int(c.shape[1]) for c in features.codes), default=0)
        raise ConfigError(
            f"{where}: {rows - 1:,} items' features ask for {_gib(asked)} (up to {slots:,} "
            f"values an item, {features.width:,} numbers) at width {width}, over the "
            f"{_gib(limit)} bound; fewer values, or $SEQREC_MAX_MODEL_BYTES set higher"
        )
    return asked
