"""Where a run's item features come from: `encode_items`, from the items table `[items]` names
(a file, a frame, or a prepared folder that holds its items' features).

An items table prepared with a log: `prepare(..., items=TABLE, item_features=[...])` encodes
the features of the prepared dataset's items (seqrec.data.item_features) and keeps them, with
their encoder, as the dataset's `items.npz`. A run trained on the dataset reads them as it reads
an items table (`items.table` then names the prepared folder).

The table is read and checked before anything is written; its content, the features and their
settings are part of the prepared folder's key, so that another table or other features make
another folder rather than a stale one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.data.item_features import (
    ItemEncoder,
    ItemFeatures,
    items_file_bytes,
    load_items_file,
)
from seqrec.data.items_table import Feature, parse_features, read_items_table
from seqrec.data.settings import ItemsConfig
from seqrec.data.text_models import check_text_encoder
from seqrec.errors import ConfigError, DataError
from seqrec.files import bound, read_checked

__all__ = [
    "ITEMS_FILE",
    "PreparedItems",
    "encode_items",
    "prepared_items_for",
    "read_prepared_items",
]

ITEMS_FILE = "items.npz"


@dataclass(frozen=True)
class PreparedItems:
    """An items table read and checked for `prepare`, not yet encoded."""

    cfg: ItemsConfig
    table: pl.DataFrame
    features: tuple[Feature, ...]
    where: str

    @classmethod
    def read(
        cls,
        items: Any,
        features: Sequence[str] | str | Mapping[str, str] | None,
        cfg: ItemsConfig | None = None,
    ) -> PreparedItems | None:
        """`items` (a frame or a file) and the `features` to read from it, in place of `cfg`'s
        table and features (its item column, separator and text settings are used); None when
        neither names a table. One line for a table without its features or the reverse, and
        for every error of the table itself."""
        cfg = cfg or ItemsConfig()
        if (items is None) != (features is None):
            raise ConfigError(
                "prepare: items= and item_features= go together (the table and the columns to "
                "read from it)"
            )
        if items is None:
            if not cfg.features:
                return None
            if cfg.table is None:
                raise ConfigError("items.features: given without items.table")
            items, features = cfg.table, cfg.features
        assert features is not None
        try:
            check_text_encoder(cfg.text_encoder)
        except DataError as err:
            raise ConfigError(str(err)) from None
        wanted = parse_features(features)
        table, kinds = read_items_table(
            items, item_col=cfg.item_col, features=wanted, separator=cfg.separator
        )
        source = str(items) if isinstance(items, str | Path) else "<frame>"
        cfg = dataclasses.replace(cfg, table=source, features=tuple(str(f) for f in kinds))
        return cls(cfg, table, kinds, _where(items))

    def key(self) -> dict[str, Any]:
        """What the prepared folder's key holds of it: the table's content and the settings."""
        h = hashlib.sha256()
        for name in self.table.columns:
            col = self.table.get_column(name)
            h.update(f"{name}\x00{col.dtype}\x00".encode())
        h.update(self.table.hash_rows(seed=0).to_numpy().tobytes())
        return {
            "table": h.hexdigest()[:16],
            "features": list(self.cfg.features),
            "separator": self.cfg.separator,
            "text_dim": self.cfg.text_dim,
            "text_encoder": self.cfg.text_encoder,
        }

    def file_bytes(self, item_ids: Sequence[Any]) -> bytes:
        """The encoder fitted on the table and the features of `item_ids` (the prepared items,
        in order), as `items.npz`'s bytes; one DataError line for items without a row."""
        table = _rows_for(self.table, item_ids)
        encoder = _fitted(table, self.features, self.cfg)
        return items_file_bytes(encoder, encoder.encode(table, item_ids, self.where))


def read_prepared_items(path: Path) -> tuple[ItemEncoder, ItemFeatures] | None:
    """The encoder and item features a prepared folder holds (None: prepared without items)."""
    file = path / ITEMS_FILE
    if not file.exists() and not file.is_symlink():
        return None
    # looked at first (a regular file of the folder within its bound), then read once
    data = read_checked(file, bound("item_features"), root=path, error=DataError)
    return load_items_file(data, str(file))


def prepared_items_for(
    path: Path, item_ids: Sequence[Any], encoder: ItemEncoder | None = None
) -> tuple[ItemEncoder, ItemFeatures]:
    """`items.table` naming a prepared folder: the features it holds, for a run on that
    folder's items (`item_ids`, in its order). One DataError line for a folder without items,
    one prepared from another log, or (`encoder`: the run a warm start starts from) features
    encoded otherwise than that run's."""
    found = read_prepared_items(path)
    if found is None:
        raise DataError(f"items table {path}: a folder, but no prepared dataset with items")
    try:
        text = read_checked(path / "vocab.json", bound("vocab"), root=path, error=DataError)
        vocab = json.loads(text)["items"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"items table {path}: no readable vocab.json ({err})") from None
    if list(vocab) != list(item_ids):
        raise DataError(
            f"items table {path}: the features of another log's {len(vocab):,} items "
            f"(this one has {len(item_ids):,}); give the items table itself"
        )
    if encoder is not None and encoder.to_json() != found[0].to_json():
        raise DataError(
            f"items table {path}: encoded otherwise than the run it starts from; give the "
            "items table itself"
        )
    return found


def encode_items(
    cfg: ItemsConfig,
    item_ids: Sequence[Any],
    table: Any = None,
    encoder: ItemEncoder | None = None,
) -> tuple[ItemEncoder, ItemFeatures] | None:
    """The encoder fitted on the items table of `cfg` (or `table`, a frame or path given in its
    place) and the features of `item_ids` (a run's items, in order); None when `cfg` names no
    features. `encoder`: one fitted before (a run warm-started from another keeps its
    encoder, so that its features mean what they meant there)."""
    if not cfg.features:
        return None
    source = table if table is not None else cfg.table
    if source is None:
        raise DataError("items.features: given without an items table")
    if isinstance(source, str | Path) and Path(source).is_dir():  # a prepared dataset's
        return prepared_items_for(Path(source), item_ids, encoder)
    wanted = encoder.features if encoder is not None else parse_features(cfg.features)
    df, features = read_items_table(
        source, item_col=cfg.item_col, features=wanted, separator=cfg.separator
    )
    df = _rows_for(df, item_ids)
    encoder = encoder or _fitted(df, features, cfg)
    return encoder, encoder.encode(df, item_ids, _where(source))


def _rows_for(table: pl.DataFrame, item_ids: Sequence[Any]) -> pl.DataFrame:
    """The rows of `table` of the log's items: the encoder is fitted on what it encodes (a
    table of a million products for a log of sixty holds 60 rows' worth of text to fit), and
    an item without a row is still named by `encode`."""
    column = table.get_column("item")
    wanted = pl.Series(list(item_ids)).cast(column.dtype, strict=False)
    return table.filter(column.is_in(wanted.drop_nulls().implode()))


def _fitted(table: pl.DataFrame, features: Sequence[Feature], cfg: ItemsConfig) -> ItemEncoder:
    """The encoder of `features` fitted on `table` with `cfg`'s separator and text settings."""
    return ItemEncoder.fit(
        table,
        features,
        separator=cfg.separator,
        text_dim=cfg.text_dim,
        text_encoder=cfg.text_encoder,
    )


def _where(source: Any) -> str:
    """How an error names the table: its path, or "items table" for a frame."""
    return f"items table {source}" if isinstance(source, str | Path) else "items table"
