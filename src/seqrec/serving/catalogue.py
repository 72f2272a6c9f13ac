"""A trained run's catalogue grown without retraining: items of an items table, each scored
from its features (seqrec.models.tower gives it the id embedding of the trained items nearest to
it by features).

One writer at a time: a change recorded in the run directory holds the run's lock (the one a
training holds) from the moment it reads the catalogue to the moment its files are in place, and
first loads the catalogue again when another writer (`seqrec add-items`, a server process, a
Python `add_items`) changed it since this one was loaded: every acknowledged item stays, and
the run's files always agree with each other and with its manifest."""

from __future__ import annotations

import copy
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from seqrec.data.item_features import items_file_bytes
from seqrec.data.items_table import read_items_table
from seqrec.errors import ConfigError, DataError, SeqrecError
from seqrec.training.checkpoint import Run
from seqrec.training.rundir import RunDir

if TYPE_CHECKING:
    from seqrec.serving.recommender import Recommender

__all__ = ["CATALOGUE_WAIT", "add_items", "follow", "refresh", "reload"]

# how long a catalogue change waits for another writer of the same run (a training holds the
# lock for as long as it trains: then the change is refused in one line)
CATALOGUE_WAIT = 60.0


@dataclass
class _Grown:
    run: Run
    popularity: np.ndarray


def add_items(
    rec: Recommender, table: Any, *, save: bool = True, neighbours: int | None = None
) -> list[Any]:
    """Items new to the catalogue, from an items table with the run's feature columns (a frame
    or a file), without retraining: each is given the id embedding of the trained item nearest
    to it by features (the mean of `neighbours` such, default `items.cold_neighbours`;
    seqrec.models.tower), so that it is recommended, scored and
    returned by `similar_items` like the others; the other items' scores are unchanged.
    `save`: the run directory records them (its vocab, items file and weights, replaced
    together, under the run's lock, after the catalogue was loaded again if another writer
    changed it), so that every later load has them. Returns the new items' ids. One line for a
    run without item features, an item already in the catalogue, a table the run's encoder
    cannot read, or a run another writer holds for longer than `CATALOGUE_WAIT`."""
    if rec.run.items is None:
        raise ConfigError(
            f"{rec.run.path}: trained without item features, so a new item has nothing to "
            "be scored from (train with --items-table and --item-features)"
        )
    encoder = rec.run.items[0]  # fitted at training: the same for every later catalogue
    df, _ = read_items_table(
        table,
        item_col=rec.run.config.items.item_col,
        features=encoder.features,
        separator=encoder.separator,
    )
    ids = df.get_column("item").to_list()
    if not save:  # this process's catalogue only
        grown = _grown(rec, df, ids, neighbours)
        rec.use_catalogue(grown.run, grown.popularity, None, rec.stamp)
        return ids
    run = RunDir(rec.run.path, trust=rec.trust)
    with run.lock(wait=CATALOGUE_WAIT, what="catalogue"):
        reload(rec)  # another writer's items first: never saved over
        grown = _grown(rec, df, ids, neighbours)
        vocab = {
            **run.vocab(),
            "items": grown.run.item_ids,
            "popularity": grown.popularity.tolist(),
        }
        state = {k: v.detach().cpu() for k, v in grown.run.model.state_dict().items()}
        assert grown.run.items is not None
        run.add_items(vocab, items_file_bytes(*grown.run.items), state)
        run.save_index(None)  # it holds the old catalogue: `seqrec index RUN` builds it again
        # the index is gone with it: every item scored until it is rebuilt
        rec.use_catalogue(grown.run, grown.popularity, None, run.catalogue_stamp())
    return ids


def _grown(rec: Recommender, df: Any, ids: list[Any], neighbours: int | None) -> _Grown:
    """`rec`'s catalogue with the table's items added, built beside the one that answers (a
    request scored meanwhile sees the old catalogue or the new one, never half of one)."""
    known = [i for i in ids if rec.items.lookup(i) is not None]
    if known:
        shown = ", ".join(map(repr, known[:5])) + (", ..." if len(known) > 5 else "")
        raise DataError(
            f"items table: {len(known):,} of its {len(ids):,} items are already in the "
            f"catalogue ({shown}); expected new items only"
        )
    assert rec.run.items is not None
    encoder, features = rec.run.items
    new = encoder.encode(df, ids)
    model = copy.deepcopy(rec.model)
    model.add_items(new, neighbours or rec.run.config.items.cold_neighbours)
    run = copy.copy(rec.run)
    run.model = model
    run.item_ids = [*rec.run.item_ids, *ids]
    run.items = (encoder, features.append(new))
    popularity = np.concatenate([rec.popularity, np.zeros(len(ids), np.float32)])
    return _Grown(run, popularity)


def refresh(rec: Recommender) -> bool:
    """Load `rec`'s catalogue again when another writer (`seqrec add-items`, another server
    process, `add_items` elsewhere) changed it since it was loaded; whether it did. Under the
    run's lock, so that it reads one writer's files, all of them."""
    run = RunDir(rec.run.path, trust=rec.trust)
    if run.catalogue_stamp() == rec.stamp:
        return False
    with run.lock(wait=CATALOGUE_WAIT, what="catalogue"):
        return reload(rec)


def reload(rec: Recommender) -> bool:
    """`refresh` for a caller that holds the run's lock: the catalogue as the run directory has
    it now (its items, weights, popularity and index), if it changed since `rec` loaded it;
    whether it did."""
    from seqrec.serving.index import run_index
    from seqrec.training.checkpoint import load_run

    run = RunDir(rec.run.path, trust=rec.trust)
    stamp = run.catalogue_stamp()
    if stamp == rec.stamp:
        return False
    loaded = load_run(rec.run.path, device=rec.device, trust=rec.trust)
    vocab = run.vocab()
    popularity = np.zeros(len(loaded.item_ids) + 1, dtype=np.float32)
    if "popularity" in vocab:
        popularity = np.asarray(vocab["popularity"], dtype=np.float32)
    else:  # grown elsewhere from a run that recorded none: the training counts, kept
        popularity[: len(rec.popularity)] = rec.popularity[: len(popularity)]
    index = None
    if not rec.exact and loaded.model.blockwise:
        index = run_index(rec.run.path, *loaded.model.output_weights(), trust=rec.trust)
        old = rec.index
        if index is not None and old is not None and old.kind == index.kind:
            # as the server was told to search
            index.set_breadth(old.nprobe if old.kind == "ivf" else old.ef_search)
    rec.use_catalogue(loaded, popularity, index, stamp)
    return True


def follow(rec: Recommender, every: float = 1.0) -> threading.Event:
    """Keep `rec` to its run's catalogue as other writers change it: a thread that calls
    `refresh` every `every` seconds (a failed load is said once on stderr and tried again),
    until the returned event is set or the recommender is gone."""
    stop = threading.Event()
    me = weakref.ref(rec)

    def watch() -> None:
        said = ""
        while not stop.wait(every):
            current = me()
            if current is None:
                return
            try:
                refresh(current)
                said = ""
            except SeqrecError as err:
                if str(err) != said:
                    print(f"catalogue not reloaded: {err}", file=sys.stderr)
                    said = str(err)
            del current

    threading.Thread(target=watch, name="seqrec-catalogue", daemon=True).start()
    return stop
