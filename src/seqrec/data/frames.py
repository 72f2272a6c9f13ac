"""DataFrames in: a log held in memory (a polars DataFrame or LazyFrame, a pandas DataFrame, an
Arrow table) -> the interactions table the readers give (seqrec.data.io), with any id types and
datetime, numeric or no timestamps. pandas and pyarrow are not dependencies: a frame of theirs
is read column by column through numpy (pyarrow is needed only to pass an Arrow table).

And frames out: `frame_kind` names the kind of a frame ("polars", "pandas", "arrow"), and
`as_kind` gives a polars answer in that kind (pandas built column by column through numpy, so
pandas out needs no pyarrow either)."""

from __future__ import annotations

import hashlib
from typing import Any

import polars as pl

from seqrec.data.reading import INTERACTION_COLUMNS, check_column_types
from seqrec.errors import DataError

__all__ = [
    "FRAME_KINDS",
    "as_kind",
    "frame_fingerprint",
    "frame_kind",
    "interactions_from_frame",
    "is_frame",
]

FRAME_KINDS = ("polars", "pandas", "arrow")


def is_frame(data: Any) -> bool:
    """Whether `data` is a table held in memory (rather than a path or a dataset name)."""
    kind = type(data).__module__.split(".")[0]
    return isinstance(data, pl.DataFrame | pl.LazyFrame) or kind in ("pandas", "pyarrow")


def frame_kind(data: Any) -> str:
    """The kind of a frame ("polars" for a DataFrame or LazyFrame, "pandas", "arrow"), and
    "polars" for anything else (a path, a dataset name): what answers about it are given as."""
    kind = type(data).__module__.split(".")[0]
    return {"pandas": "pandas", "pyarrow": "arrow"}.get(kind, "polars")


def as_kind(df: pl.DataFrame, kind: str) -> Any:
    """`df` as a frame of `kind` (FRAME_KINDS). pandas: built from numpy columns (no pyarrow);
    arrow: polars' own conversion (pyarrow, which an Arrow table in already has)."""
    if kind == "polars":
        return df
    if kind == "pandas":
        import pandas as pd

        return pd.DataFrame({c: _numpy(df.get_column(c)) for c in df.columns})
    if kind == "arrow":
        return df.to_arrow()
    raise DataError(f"frame: expected one of {', '.join(FRAME_KINDS)}, got {kind!r}")


def _numpy(col: pl.Series) -> Any:
    """A column for pandas: numbers as numpy arrays, text and mixed ids as objects."""
    if col.dtype.is_numeric() and not col.null_count():
        return col.to_numpy()
    return col.to_list()


def _columns(data: Any) -> list[str]:
    if isinstance(data, pl.LazyFrame):
        return list(data.collect_schema().names())
    names = data.columns if hasattr(data, "columns") else data.column_names
    return [str(c) for c in names]


def _to_polars(data: Any, wanted: list[str]) -> pl.DataFrame:
    """The `wanted` columns of the frame as a polars DataFrame."""
    if isinstance(data, pl.LazyFrame):
        return data.select(wanted).collect()
    if isinstance(data, pl.DataFrame):
        return data.select(wanted)
    if type(data).__module__.startswith("pandas"):
        return pl.DataFrame([pl.Series(c, data[c].to_numpy()) for c in wanted])
    return pl.DataFrame(pl.from_arrow(data.select(wanted)))  # a pyarrow Table


def interactions_from_frame(
    data: Any, *, user_col: str, item_col: str, time_col: str | None
) -> pl.DataFrame:
    """The interactions table (user, item, timestamp, line) of a frame's columns. `time_col`
    None: the rows are in time order within each user (row order is used). Timestamps may be
    datetimes or dates (to epoch seconds), integers, or ISO strings. One DataError line names a
    missing column (and the columns there are) or the first bad row."""
    if not is_frame(data):
        raise DataError(f"expected a DataFrame, a LazyFrame or an Arrow table, got {type(data)}")
    present = _columns(data)
    wanted = [c for c in (user_col, item_col, time_col) if c is not None]
    missing = [c for c in wanted if c not in present]
    if missing:
        shown = ", ".join(present[:20]) + (", ..." if len(present) > 20 else "")
        hint = "user_col=, item_col=, time_col= name them"
        if missing == [time_col]:  # no time column: the rows' own order can be the time
            hint += "; time_col=None reads the rows as already in time order within each user"
        raise DataError(
            f"DataFrame: missing column(s) {', '.join(missing)}; it has {shown} ({hint})"
        )
    df = _to_polars(data, list(dict.fromkeys(wanted)))
    check_column_types(df.schema, [user_col, item_col], time_col, "DataFrame")
    if df.height == 0:
        raise DataError("DataFrame: no rows, expected interactions")
    user, item = _ids(df, user_col), _ids(df, item_col)
    if time_col is None:
        ts = pl.int_range(0, df.height, dtype=pl.Int64, eager=True)
    else:
        ts = _timestamps(df, time_col)
    return pl.DataFrame(
        [
            user.alias("user"),
            item.alias("item"),
            ts.alias("timestamp"),
            pl.int_range(0, df.height, dtype=pl.Int64, eager=True).alias("line"),
        ]
    ).select(INTERACTION_COLUMNS)


def _first_null(col: pl.Series, name: str) -> None:
    if col.null_count():
        row = int(col.is_null().arg_max() or 0)
        raise DataError(f"DataFrame row {row}: missing {name}")


def _ids(df: pl.DataFrame, name: str) -> pl.Series:
    """An id column: integers stay Int64, anything else becomes its text."""
    col = df.get_column(name)
    _first_null(col, name)
    if col.dtype.is_integer():
        return col.cast(pl.Int64)
    out = col.cast(pl.String, strict=False)
    _first_null(out, name)
    if (out.str.strip_chars() == "").any():
        row = int((out.str.strip_chars() == "").arg_max() or 0)
        raise DataError(f"DataFrame row {row}: empty {name}")
    return out


def _timestamps(df: pl.DataFrame, name: str) -> pl.Series:
    """Seconds since the epoch (Int64) from datetimes, dates, numbers or ISO strings."""
    col = df.get_column(name)
    _first_null(col, name)
    if col.dtype == pl.Date:
        col = col.cast(pl.Datetime("us"))
    if isinstance(col.dtype, pl.Datetime):
        return col.dt.epoch("s")
    if col.dtype.is_integer():
        return col.cast(pl.Int64)
    if col.dtype.is_float():
        if not col.is_finite().all():
            row = int((~col.is_finite()).arg_max() or 0)
            raise DataError(f"DataFrame row {row}: {name} {col[row]!r} is not a finite time")
        return col.floor().cast(pl.Int64)
    text = col.cast(pl.String, strict=False)
    as_int = text.cast(pl.Int64, strict=False)
    if not as_int.is_null().any():
        return as_int
    try:
        as_dt = text.str.to_datetime(strict=False, time_unit="us")
    except pl.exceptions.PolarsError:
        as_dt = pl.Series(name, [None] * len(text), dtype=pl.Datetime("us"))
    if not as_dt.is_null().any():
        return as_dt.dt.epoch("s")
    row = int((as_int.is_null() & as_dt.is_null()).arg_max() or 0)
    shown = repr(text[row])[:60]
    raise DataError(f"DataFrame row {row}: {name} {shown} is neither a time nor an integer")


def frame_fingerprint(interactions: pl.DataFrame) -> str:
    """A digest of an interactions table's content: a prepared frame is reused while it is
    unchanged, as a file is while its size and time are."""
    h = hashlib.sha256()
    for name in INTERACTION_COLUMNS:
        col = interactions.get_column(name)
        h.update(name.encode())
        h.update(str(col.dtype).encode())
        if col.dtype == pl.String:
            h.update("\x00".join(col.to_list()).encode())
        else:
            h.update(col.to_numpy().tobytes())
    return h.hexdigest()[:16]
