"""An items table: one row per item, its id and the columns that describe it (a category, a
list of genres, a price, a vector the user computed, a title). Read from a frame or a file,
checked, with each feature column's kind decided (given as `name:kind`, or read from its type).

Kinds:
    category    one value per item (a brand, a year taken as a label)
    categories  several values per item: a list column, or a string split at `separator`
                ("Action|Comedy")
    number      a number, standardised; missing values allowed (a missing flag is a feature)
    vector      a fixed-length list of numbers per item (embeddings the user computed)
    text        free text, turned into a vector by seqrec.data.item_features' encoder
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from seqrec.data.frames import is_frame
from seqrec.data.reading import check_column_types
from seqrec.errors import DataError
from seqrec.files import bound, read_checked

__all__ = [
    "FEATURE_KINDS",
    "MAX_VALUES",
    "NUMBER_BOUND",
    "Feature",
    "parse_features",
    "read_items_table",
]

# the largest magnitude of a `number` feature's value: beyond it (or infinite) a value is refused,
# since standardising it (its square summed for the deviation) would overflow
NUMBER_BOUND = 1e15

# the values one item's `categories` cell can hold: each is a code the model embeds for every
# item at once, so a cell of a million values would ask for gigabytes
MAX_VALUES = 1024

FeatureKind = Literal["category", "categories", "number", "vector", "text"]
FEATURE_KINDS: tuple[FeatureKind, ...] = ("category", "categories", "number", "vector", "text")


@dataclass(frozen=True)
class Feature:
    """One feature column of an items table and its kind ("" = read from the column's type)."""

    name: str
    kind: FeatureKind | Literal[""] = ""

    def __str__(self) -> str:
        return f"{self.name}:{self.kind}" if self.kind else self.name


def parse_features(spec: str | Sequence[str] | Mapping[str, str]) -> tuple[Feature, ...]:
    """Feature columns from "genres:categories,year,title:text", a list of such names, or a
    {name: kind} mapping; one DataError line for an unknown kind or a repeated name."""
    if isinstance(spec, str):
        items: list[tuple[str, str]] = [_split(s) for s in spec.split(",") if s.strip()]
    elif isinstance(spec, Mapping):
        items = [(str(k), str(v)) for k, v in spec.items()]
    else:
        items = [_split(str(s)) for s in spec]
    out: list[Feature] = []
    for name, kind in items:
        if kind and kind not in FEATURE_KINDS:
            raise DataError(
                f"item feature {name}: unknown kind {kind!r}; expected one of "
                f"{', '.join(FEATURE_KINDS)}"
            )
        if any(f.name == name for f in out):
            raise DataError(f"item feature {name}: named twice")
        out.append(Feature(name, kind))
    return tuple(out)


def _split(text: str) -> tuple[str, str]:
    name, _, kind = text.strip().partition(":")
    if not name.strip():
        raise DataError(f"item features: an empty name in {text!r}")
    return name.strip(), kind.strip()


def read_items_table(
    source: Any,
    *,
    item_col: str = "item",
    features: Sequence[Feature] = (),
    separator: str = "|",
) -> tuple[pl.DataFrame, tuple[Feature, ...]]:
    """(the table with its item column as "item" and the feature columns, each feature with its
    kind decided) from a frame (polars, pandas, Arrow), a CSV/TSV/Parquet file with a header, or
    a MovieLens `movies.dat` (`id::title::genres`, columns item, title, genres). Item ids that
    are integers stay integers. One DataError line names a missing column, a repeated or empty
    item id, a vector column of mixed lengths, a NaN in a vector."""
    where = "items table" if is_frame(source) else f"items table {source}"
    named = [f.name for f in features]
    if item_col in named or ("item" in named and item_col != "item"):
        clash = item_col if item_col in named else "item"
        raise DataError(
            f"{where}: {clash!r} is the item id column, not a feature (name the features by "
            "their own columns)"
        )
    df = _read(source, where)
    wanted = [item_col, *named]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        shown = ", ".join(df.columns[:20]) + (", ..." if len(df.columns) > 20 else "")
        raise DataError(f"{where}: no column {', '.join(missing)}; it has {shown}")
    check_column_types(df.schema, [item_col], None, where)  # as a log's ids are checked
    df = df.select(wanted).rename({item_col: "item"} if item_col != "item" else {})
    if df.height == 0:
        raise DataError(f"{where}: no rows")
    df = df.with_columns(_ids(df.get_column("item"), where))
    dup = df.get_column("item").is_duplicated()
    if dup.any():
        raise DataError(
            f"{where}: item {df.get_column('item')[int(dup.arg_max() or 0)]!r} has "
            f"{int(dup.sum())} rows; expected one row per item"
        )
    kinds = tuple(
        Feature(f.name, f.kind or _kind(df.get_column(f.name), separator)) for f in features
    )
    for f in kinds:
        _check(df.get_column(f.name), f, where, separator)
    return df, kinds


def _read(source: Any, where: str) -> pl.DataFrame:
    if is_frame(source):
        if isinstance(source, pl.LazyFrame):
            return source.collect()
        if isinstance(source, pl.DataFrame):
            return source
        if type(source).__module__.startswith("pandas"):
            return pl.from_pandas(source)
        return pl.DataFrame(pl.from_arrow(source))
    path = Path(source)
    if not path.exists() and not path.is_symlink():
        raise DataError(f"{where}: no such file")
    # looked at before a byte is read: a regular file within the items tables' bound (a device,
    # a FIFO or a sparse file of gigabytes is one line), read once
    data = read_checked(path, bound("items"), error=DataError)
    try:
        if path.suffix == ".parquet":
            return pl.read_parquet(io.BytesIO(data))
        if path.name.endswith(".dat"):  # MovieLens: id::title::genres, Latin-1
            rows = [
                line.split("::") for line in data.decode("latin-1").splitlines() if line.strip()
            ]
            if any(len(r) != 3 for r in rows):
                bad = next(i for i, r in enumerate(rows, 1) if len(r) != 3)
                raise DataError(f"{where} line {bad}: expected id::title::genres")
            return pl.DataFrame(
                {
                    "item": [int(r[0]) for r in rows],
                    "title": [r[1] for r in rows],
                    "genres": [r[2] for r in rows],
                }
            )
        sep = "\t" if path.suffix in (".tsv", ".tab") else ","
        return pl.read_csv(io.BytesIO(data), separator=sep, infer_schema_length=10_000)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataError(f"{where}: could not be read ({first})") from None


def _ids(col: pl.Series, where: str) -> pl.Series:
    if col.null_count():
        raise DataError(f"{where} row {int(col.is_null().arg_max() or 0)}: missing item id")
    if col.dtype.is_integer():
        return col.cast(pl.Int64)
    text = col.cast(pl.String).str.strip_chars()
    if (text == "").any():
        raise DataError(f"{where} row {int((text == '').arg_max() or 0)}: empty item id")
    as_int = text.cast(pl.Int64, strict=False)
    # integers only when every id round-trips (the log's reader does the same)
    if as_int.null_count() == 0 and (as_int.cast(pl.String) == text).all():
        return as_int
    return text


def _kind(col: pl.Series, separator: str) -> FeatureKind:
    """A column's kind read from its type: numbers -> number; a list of numbers -> vector; a
    list of strings -> categories; text with `separator` -> categories; text whose values are
    mostly distinct and hold spaces -> text; other text -> category."""
    dtype = col.dtype
    if dtype.is_numeric():
        return "number"
    if isinstance(dtype, pl.List | pl.Array):
        return "vector" if dtype.inner is not None and dtype.inner.is_numeric() else "categories"
    values = col.drop_nulls().cast(pl.String)
    if values.len() == 0:
        return "category"
    if values.str.contains(separator, literal=True).any():
        return "categories"
    spaced = float(values.str.contains(r"\s").mean() or 0.0)  # type: ignore[arg-type]
    if values.n_unique() > 0.5 * values.len() and spaced > 0.5:
        return "text"
    return "category"


def _check(col: pl.Series, feature: Feature, where: str, separator: str = "|") -> None:
    """A column that cannot be read as its kind: one line naming the first bad row."""
    name, kind = feature.name, feature.kind
    if kind == "number":
        as_float = col.cast(pl.Float64, strict=False)
        if not col.dtype.is_numeric():
            bad = as_float.is_null() & col.is_not_null()
            if bad.any():
                row = int(bad.arg_max() or 0)
                raise DataError(
                    f"{where} row {row}: {name} = {col[row]!r} is not a number (kind number)"
                )
        # an infinite or overflowing value would make every score that reads it NaN; a NaN or
        # an empty cell is a missing value (its flag is a feature)
        huge = (as_float.abs() > NUMBER_BOUND).fill_null(False)
        if huge.any():
            row = int(huge.arg_max() or 0)
            raise DataError(
                f"{where} row {row}: {name} = {col[row]!r} is not a finite number within "
                f"±{NUMBER_BOUND:.0e} (kind number; leave the cell empty for a missing value)"
            )
    elif kind == "vector":
        if not isinstance(col.dtype, pl.List | pl.Array) or not (
            col.dtype.inner is not None and col.dtype.inner.is_numeric()
        ):
            raise DataError(
                f"{where}: {name} is {col.dtype}, expected a list of numbers (kind vector)"
            )
        lengths = col.list.len() if isinstance(col.dtype, pl.List) else None
        if col.null_count():
            raise DataError(
                f"{where} row {int(col.is_null().arg_max() or 0)}: {name} is missing "
                "(kind vector: every item needs its vector)"
            )
        if lengths is not None and lengths.n_unique() > 1:
            first = int(lengths[0])
            row = int((lengths != first).arg_max() or 0)
            raise DataError(
                f"{where} row {row}: {name} has {int(lengths[row])} numbers, row 0 has {first} "
                "(kind vector: one length for every item)"
            )
        flat = col.explode() if isinstance(col.dtype, pl.List) else col.arr.explode()
        flat = flat.cast(pl.Float64)
        bad = flat.is_nan() | flat.is_infinite() | flat.is_null()
        if bad.any():
            width = max(int(col.list.len()[0]) if isinstance(col.dtype, pl.List) else 1, 1)
            row = int(bad.arg_max() or 0) // width
            raise DataError(f"{where} row {row}: {name} holds a NaN or infinite value")
    elif kind in ("categories", "text") and col.dtype.is_numeric():
        raise DataError(f"{where}: {name} is {col.dtype}, expected text (kind {kind})")
    if kind == "categories":  # each value of a cell is a code the model embeds
        values = (
            col.list.len()
            if isinstance(col.dtype, pl.List)
            else col.cast(pl.String).str.count_matches(separator, literal=True) + 1
        ).fill_null(0)
        over = values > MAX_VALUES
        if over.any():
            row = int(over.arg_max() or 0)
            raise DataError(
                f"{where} row {row}: {name} holds {int(values[row]):,} values, over the "
                f"{MAX_VALUES:,} an item can have (kind categories)"
            )
