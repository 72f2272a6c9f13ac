"""A model from a run directory: the one way to load one for scoring (`seqrec evaluate DIR`,
the recommender, the server, export, `train.init_from`). The directory's files belong to
seqrec.training.rundir.RunDir; this module checks that they make the model they describe (its size,
its weights' shapes) before anything is allocated, and builds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqrec.config import RunConfig
from seqrec.data.item_features import ItemEncoder, ItemFeatures
from seqrec.errors import ConfigError, RunError, SeqrecError
from seqrec.files import identity
from seqrec.models.base import SequenceModel
from seqrec.models.registry import MODELS, entry
from seqrec.models.tower import attach_item_features
from seqrec.outputs import DIGESTS
from seqrec.training.rundir import RunDir
from seqrec.training.sizes import check_item_features, check_memory

__all__ = ["MODELS", "Run", "build_model", "load_run", "shape_mismatch"]


def build_model(
    cfg: RunConfig, n_items: int, n_users: int = 0, features: ItemFeatures | None = None
) -> SequenceModel:
    """The model `cfg.model` for `n_items` items (and `n_users` training users, for the models
    with a per-user term), freshly initialised (seqrec.models.registry); with `features` (rows
    0..n_items) its item tables become item towers (seqrec.models.tower)."""
    model = entry(cfg.model).build(n_items, n_users, cfg)
    if features is not None:
        if features.n_rows != n_items + 1:
            raise ValueError(f"item features of {features.n_rows - 1} items for {n_items} items")
        tables = [getattr(model, n) for n in getattr(model, "item_tables", ())]
        width = max((t.embedding_dim for t in tables if t is not None), default=0)
        check_item_features(features, width)  # weighed before a tower embeds them
        attach_item_features(model, features, cfg.items.id_dropout)
    return model


@dataclass
class Run:
    """A finished (or interrupted) run, loaded for scoring."""

    path: Path
    config: RunConfig
    model: SequenceModel
    item_ids: list[Any]
    metrics: dict[str, Any] | None
    source: dict[str, Any]
    # a run with item features: the encoder fitted on its items table, and its items' features
    items: tuple[ItemEncoder, ItemFeatures] | None = None


def _shaped_model(
    cfg: RunConfig,
    n_items: int,
    n_users: int,
    where: Path,
    features: ItemFeatures | None = None,
) -> SequenceModel:
    """The model `cfg` describes, built on the meta device (no memory) for its weights' shapes,
    once its parameters are weighed by formula and found within the bound (seqrec.training.sizes):
    one line otherwise."""
    try:
        check_memory(cfg, n_items, n_users, where=str(where), training=False)
    except ConfigError as err:
        raise RunError(str(err)) from None
    try:
        with torch.device("meta"):
            return build_model(cfg, n_items, n_users, features)
    except (ValueError, RuntimeError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RunError(f"{where}: its config does not build a model ({first})") from None


def shape_mismatch(state: dict[str, torch.Tensor], model: torch.nn.Module) -> str | None:
    """The first tensor of `state` that `model` does not hold in that shape, as
    "key: (shape) given, (shape) expected"; None when they fit."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if expected == got:
        return None
    key = next(k for k in sorted(expected.keys() | got.keys()) if expected.get(k) != got.get(k))
    return f"{key}: {got.get(key, 'missing')} given, {expected.get(key, 'none')} expected"


def _check_state(state: Any, shaped: SequenceModel, where: Path) -> None:
    """The weights must be the tensors the config's model holds, shape for shape."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RunError(f"{where}: damaged (not a model's weights)")
    mismatch = shape_mismatch(state, shaped)
    if mismatch:
        raise RunError(f"{where}: the weights do not fit the run's config ({mismatch})")


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu", *, trust: bool = False
) -> Run:
    """The single load path: config + vocab + the best weights (the final ones, or the best state of
    an unfinished run's checkpoint), in eval mode. Every file is checked against the run's
    manifest first (`trust`: a run without one is loaded unchecked), the config's values against
    their ranges, the model's size against a bound and the weights' shapes against the config,
    all before the model is allocated; the weights are held once. A load that another writer's
    change overlapped (the manifest replaced while it read: `seqrec add-items` beside it) is
    made again, so that its files are one writer's."""
    manifest = Path(run_dir) / DIGESTS
    for attempt in range(_LOAD_TRIES):
        before = identity(manifest)
        try:
            run = _load_run(run_dir, device, trust)
        except SeqrecError:
            if attempt == _LOAD_TRIES - 1 or identity(manifest) == before:
                raise  # damage, not a change under way
            time.sleep(0.05 * (attempt + 1))
            continue
        if identity(manifest) == before:
            return run
        time.sleep(0.05 * (attempt + 1))
    return run  # changed under every try: the last load's files passed their checks


_LOAD_TRIES = 5


def _load_run(run_dir: str | Path, device: str | torch.device, trust: bool) -> Run:
    run = RunDir(run_dir, trust=trust)
    cfg = run.config()
    vocab = run.vocab()
    item_ids = vocab["items"]
    n_users = int(vocab.get("n_users", 0))
    items = run.item_features()
    if (items is None) != (not cfg.items.features):
        raise RunError(f"{run.path}: its config and its item features file do not agree")
    features = items[1] if items is not None else None
    shaped = _shaped_model(cfg, len(item_ids), n_users, run.config_path, features)
    state, where = run.best_weights()
    _check_state(state, shaped, where)
    # the loaded tensors become the model's (`assign`): the weights are in memory once, not
    # twice (an initialised model, then the state copied into it)
    model = shaped
    model.load_state_dict(state, assign=True)
    model.to(device).eval()
    return Run(run.path, cfg, model, item_ids, run.metrics(), run.source(), items)
