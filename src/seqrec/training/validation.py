"""One check of a training config before anything is built or written: `validate(cfg, ds)`.

It runs, in order: the ranges of every value (`config.check_ranges`), what the training loop needs
(a known model, a computed validation metric and protocol, a readable budget, a decay that can
end, no early stop on validation targets it trains on), the negatives' rules
(`NegativeSampler.check`) and the dataset's (no more shared negatives than items), then the
model entry's own: a model that reads each row as one user's whole sequence (`whole_rows`) takes
no packed batches, and an entry's `validate` adds what only it knows (NCF scores (user, item)
pairs, so it trains with a sampled loss per position), and last the memory the training asks
for (`seqrec.training.sizes`: parameters, optimiser state, a batch's activations). Every failure is
one ConfigError line, so an invalid config leaves nothing on disk.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec.config import RunConfig, check_ranges, default_config, parse_duration
from seqrec.data.negatives import NegativeSampler
from seqrec.errors import ConfigError
from seqrec.evaluation.metrics import metric_names
from seqrec.evaluation.protocols import parse_protocols
from seqrec.models.registry import MODELS, entry, reads_item_features
from seqrec.training.sizes import check_memory

if TYPE_CHECKING:
    from seqrec.data.prepared import PreparedDataset

__all__ = ["validate", "with_items_table"]


def validate(
    cfg: RunConfig, ds: PreparedDataset | None = None, *, where: str = "config"
) -> RunConfig:
    """`cfg` if a training of it on `ds` (when given: its dataset-dependent rules too) can
    start; otherwise one ConfigError line naming the key and what was expected (`where`: what
    the ranges' errors name, e.g. the estimator's class). The CLI and the estimators call it
    without `ds` before anything is prepared or written; `fit` again with the data."""
    check_ranges(cfg, where)
    model = entry(cfg.model)  # an unknown model is a ConfigError
    _check_loop(cfg)
    NegativeSampler.check(cfg.train, dict(cfg.sections).get("next_item"), cfg.model)
    t = cfg.train
    if ds is not None and t.loss != "ce" and t.negatives_per == "batch":
        uniform = t.negative_sampling != "popularity"
        if uniform and t.n_negatives > ds.n_items:
            raise ConfigError(
                f"train.n_negatives = {t.n_negatives} shared negatives per batch, but the data "
                f"has {ds.n_items} items"
            )
    if model.whole_rows and cfg.next_item.pack:
        raise ConfigError(f"{cfg.model}: next_item.pack must be false (each row is one user's)")
    if model.validate is not None:
        model.validate(cfg, ds)
    _check_items(cfg)
    # the memory it asks for, from the numbers alone (without the data: what its layers ask for)
    n_items, n_users = (ds.n_items, ds.n_users) if ds is not None else (0, 0)
    check_memory(cfg, n_items, n_users, training=True)
    return cfg


def with_items_table(
    cfg: RunConfig,
    table: Any,
    features: Sequence[str] | str | Mapping[str, str] | None,
    *,
    where: str = "fit",
) -> RunConfig:
    """`cfg` reading `features` ("genres", "genres:categories", or {name: kind}) of the items
    table `table` (a path, or a frame: recorded as "<frame>"), validated; `cfg` itself when
    neither is given. One ConfigError line when only one is."""
    from seqrec.data.items_table import parse_features

    if (table is None) != (features is None):
        raise ConfigError(
            f"{where}: items= and item_features= go together (the table and the columns to "
            "read from it)"
        )
    if table is None or features is None:
        return cfg
    names = tuple(str(f) for f in parse_features(features))
    source = str(table) if isinstance(table, str | Path) else "<frame>"
    items = dataclasses.replace(cfg.items, table=source, features=names)
    return validate(dataclasses.replace(cfg, items=items), where=where)


def with_prepared_items(cfg: RunConfig, ds: PreparedDataset) -> RunConfig:
    """`cfg` reading the item features `ds` was prepared with (`prepare(..., items=...)`),
    when it names none of its own and its model reads them (`items.table` then names the
    prepared folder); `cfg` itself otherwise (a model that reads none trains on ids)."""
    from seqrec.data.prepared_items import ITEMS_FILE, read_prepared_items

    if cfg.items.features or not (ds.path / ITEMS_FILE).exists() or not reads_item_features(cfg):
        return cfg
    found = read_prepared_items(ds.path)
    assert found is not None
    names = tuple(str(f) for f in found[0].features)
    return dataclasses.replace(
        cfg, items=dataclasses.replace(cfg.items, table=str(ds.path.resolve()), features=names)
    )


def _check_items(cfg: RunConfig) -> None:
    """An items table's settings: features name their table, and the model reads them."""
    from seqrec.data.items_table import parse_features
    from seqrec.data.text_models import check_text_encoder
    from seqrec.errors import DataError

    items = cfg.items
    try:
        check_text_encoder(items.text_encoder)
    except DataError as err:
        raise ConfigError(str(err)) from None
    if items.features and not items.table:
        raise ConfigError("items.features: given without items.table (the items table to read)")
    if not items.features:
        return
    try:
        parse_features(items.features)
    except DataError as err:
        raise ConfigError(f"items.features: {err}") from None
    if not reads_item_features(cfg):
        readers = ", ".join(m for m in MODELS if reads_item_features(default_config(m)))
        raise ConfigError(
            f"items.features: {cfg.model} reads no item features (the models that do: {readers})"
        )


def _check_loop(cfg: RunConfig) -> None:
    """What the training loop needs of `cfg.train`."""
    t = cfg.train
    parse_protocols(t.val_protocol)
    names = metric_names(cfg.eval.ks)
    if t.val_metric not in names:
        raise ConfigError(f"train.val_metric {t.val_metric!r} is not one of {', '.join(names)}")
    if t.time_budget:
        parse_duration(t.time_budget)
    if t.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "train.tensorboard = true needs the tensorboard package: "
            "pip install 'seqrec[tensorboard]'"
        )
    if t.decay == "budget" and not t.time_budget:
        raise ConfigError('train.decay = "budget" needs train.time_budget')
    if not 0.0 <= t.decay_start < 1.0:
        raise ConfigError(f"train.decay_start must be in [0, 1), got {t.decay_start}")
    # train+valid: the validation targets are training targets, so nothing is validated and
    # the last state is the tested one
    if t.train_on != "train" and t.patience:
        raise ConfigError(
            f'train.train_on = "{t.train_on}" trains on the validation targets, so nothing can '
            f"stop early on them: set train.patience = 0 (got {t.patience})"
        )
