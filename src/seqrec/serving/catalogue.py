"""A trained run's catalogue grown without retraining: items of an items table, each scored
from its features (seqrec.models.tower gives it the id embedding of the trained items nearest to
it by features)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import numpy as np

from seqrec.data.ids import IdCodec
from seqrec.data.item_features import items_file_bytes
from seqrec.data.items_table import read_items_table
from seqrec.errors import ConfigError, DataError
from seqrec.training.rundir import RunDir

if TYPE_CHECKING:
    from seqrec.serving.recommender import Recommender

__all__ = ["add_items"]


def add_items(
    rec: Recommender, table: Any, *, save: bool = True, neighbours: int | None = None
) -> list[Any]:
    """Items new to the catalogue, from an items table with the run's feature columns (a frame
    or a file), without retraining: each is given the id embedding of the trained item nearest
    to it by features (the mean of `neighbours` such, default `items.cold_neighbours`;
    seqrec.models.tower), so that it is recommended, scored and
    returned by `similar_items` like the others; the other items' scores are unchanged.
    `save`: the run directory records them (its vocab, items file and weights, replaced
    together), so that every later load has them. Returns the new items' ids. One line for a
    run without item features, an item already in the catalogue, or a table the run's encoder
    cannot read."""
    if rec.run.items is None:
        raise ConfigError(
            f"{rec.run.path}: trained without item features, so a new item has nothing to "
            "be scored from (train with --items-table and --item-features)"
        )
    encoder, features = rec.run.items
    df, _ = read_items_table(
        table,
        item_col=rec.run.config.items.item_col,
        features=encoder.features,
        separator=encoder.separator,
    )
    ids = df.get_column("item").to_list()
    known = [i for i in ids if rec.items.lookup(i) is not None]
    if known:
        shown = ", ".join(map(repr, known[:5])) + (", ..." if len(known) > 5 else "")
        raise DataError(
            f"items table: {len(known):,} of its {len(ids):,} items are already in the "
            f"catalogue ({shown}); expected new items only"
        )
    new = encoder.encode(df, ids)
    # the grown model is built beside the one that answers, then put in its place: a request
    # scored meanwhile sees the old catalogue or the new one, never half of one
    model = copy.deepcopy(rec.model)
    model.add_items(new, neighbours or rec.run.config.items.cold_neighbours)
    with rec._lock:
        rec.model = rec.run.model = model
        rec.run.item_ids = [*rec.run.item_ids, *ids]
        rec.run.items = (encoder, features.append(new))
        rec.items = IdCodec(rec.run.item_ids, start=1)
        rec.item_ids = rec.items.ids
        rec.n_items = len(rec.items)
        rec.popularity = np.concatenate([rec.popularity, np.zeros(len(ids), np.float32)])
        rec.index = None  # it holds the old catalogue: every item scored until it is rebuilt
    if save:
        run = RunDir(rec.run.path)
        vocab = {**run.vocab(), "items": rec.item_ids, "popularity": rec.popularity.tolist()}
        state = {k: v.detach().cpu() for k, v in rec.model.state_dict().items()}
        run.add_items(vocab, items_file_bytes(*rec.run.items), state)
        run.save_index(None)  # `seqrec index RUN` builds it again
    return ids
