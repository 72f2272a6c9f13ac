"""A user's own table (CSV or Parquet with named columns): read whole, or scanned in bounded memory
when it is large, each bad row named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from seqrec.data.reading import (
    _check_file,
    _csv_strings,
    _first_line,
    _frame,
    _id_column,
    _limits,
    _shown,
    _timestamp_column,
    check_column_types,
)
from seqrec.errors import DataError

__all__ = ["read_table", "scan_table"]


def read_table(
    path: str | Path,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
    separator: str = ",",
) -> pl.DataFrame:
    """A generic CSV (with a header) or Parquet interaction log with configurable column names.

    `time_col=None` means the rows are already in time order per user (line order is used).
    Timestamps may be integers (epoch seconds) or ISO dates/datetimes.
    """
    path = Path(path)
    wanted = [c for c in (user_col, item_col, time_col) if c is not None]
    if path.suffix == ".parquet":
        df = _read_parquet(path, wanted)
        check_column_types(df.schema, [user_col, item_col], time_col, path)
        if df.height == 0:
            raise DataError(f"{path}: no records")
        # integer columns stay integers (a string round trip of each would cost far more
        # memory than the column); any other type is read as its text
        df = df.with_columns(
            pl.col(c).cast(pl.String)
            for c in wanted
            if df[c].dtype != pl.String and not df[c].dtype.is_integer()
        )
        first_line = 1
    else:
        expected = f"a header with columns {', '.join(wanted)} separated by {separator!r}"
        df = _csv_strings(
            path, separator=separator, has_header=True, n_fields=None, expected=expected
        )
        missing = [c for c in wanted if c not in df.columns]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected}")
        first_line = 2
    user = _id_column(df, user_col, path, user_col, first_line)
    item = _id_column(df, item_col, path, item_col, first_line)
    if time_col is None:
        ts = pl.int_range(0, df.height, dtype=pl.Int64, eager=True)
    else:
        ts = _timestamp_column(df, time_col, path, first_line)
    return _frame(user, item, ts)


def _read_parquet(path: Path, wanted: list[str]) -> pl.DataFrame:
    """The `wanted` columns of a Parquet file, its size and row count checked against
    `ReadLimits` from its footer before any column is read."""
    limits = _limits()
    size = _check_file(path)
    if size > limits.max_bytes:
        raise DataError(
            f"{path}: {size:,} bytes, over the {limits.max_bytes:,} a reader takes "
            "(SEQREC_MAX_INPUT_BYTES raises the limit)"
        )
    try:
        schema = pl.read_parquet_schema(path)
        missing = [c for c in wanted if c not in schema]
        if missing:
            shown = ", ".join(list(schema)[:20]) + (", ..." if len(schema) > 20 else "")
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; has {shown}")
        rows = int(pl.scan_parquet(path).select(pl.len()).collect().item())
        if rows > limits.max_rows:
            raise DataError(
                f"{path}: {rows:,} rows, over the {limits.max_rows:,} a reader takes "
                "(SEQREC_MAX_ROWS raises the limit)"
            )
        return pl.read_parquet(path, columns=wanted)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(f"{path}: could not read as Parquet ({_first_line(e)})") from None


def scan_table(
    path: str | Path,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
    separator: str = ",",
) -> pl.DataFrame:
    """The interactions table of a CSV (with a header) or Parquet file too large to hold as
    text: Polars' streaming engine reads only the three columns, a batch at a time, twice: once
    to check every value (the first bad line named, as `read_table` names it), once to keep the
    typed columns. Memory then holds the typed table (four 8-byte columns a row; ids that are
    not all integers as strings), never the file's text or its other columns. The same table as
    `read_table`'s, whatever the file's size (no `ReadLimits.max_bytes`; `max_rows` holds)."""
    path = Path(path)
    _check_file(path)
    wanted = [c for c in (user_col, item_col, time_col) if c is not None]
    parquet = path.suffix == ".parquet"
    with path.open("rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise DataError(
                f"{path}: a gzip file is read in memory, not streamed; decompress it, or set "
                'data.reader = "memory"'
            )
    expected = (
        f"columns {', '.join(wanted)}"
        if parquet
        else f"a header with columns {', '.join(wanted)} separated by {separator!r}"
    )
    try:
        lazy = (
            pl.scan_parquet(path)
            if parquet
            else pl.scan_csv(
                path,
                separator=separator,
                has_header=True,
                infer_schema=False,
                quote_char='"' if separator == "," else None,
            )
        )
        schema = lazy.collect_schema()
        missing = [c for c in wanted if c not in schema]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected}")
        check_column_types(schema, [user_col, item_col], time_col, path)
        integers = {c for c in wanted if schema[c].is_integer()}  # Parquet's: kept as they are
        text = lazy.select(
            pl.col(c).cast(pl.Int64)
            if c in integers
            else pl.col(c).cast(pl.String).str.strip_chars()
            for c in wanted
        ).with_row_index("row")
        first = _first_bad_rows(text, user_col, item_col, time_col, integers)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(f"{path}: could not read as {expected} ({_first_line(e)})") from None
    line = 1 if parquet else 2  # the first row's line number
    datetimes = _check_rows(path, text, first, wanted, time_col, line, expected)

    def ids(c: str) -> pl.Expr:  # integers only when every value round-trips, as _id_column
        return pl.col(c).cast(pl.Int64) if first[f"{c} exact"] else pl.col(c)

    if time_col is None:
        ts = pl.col("row").cast(pl.Int64)
    elif datetimes:
        ts = pl.col(time_col).str.to_datetime(strict=False, time_unit="us").dt.epoch("s")
    else:
        ts = pl.col(time_col).cast(pl.Int64)
    try:
        return text.select(
            ids(user_col).alias("user"),
            ids(item_col).alias("item"),
            ts.cast(pl.Int64).alias("timestamp"),
            pl.col("row").cast(pl.Int64).alias("line"),
        ).collect(engine="streaming")
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DataError(f"{path}: could not read as {expected} ({_first_line(e)})") from None


def _check_rows(
    path: Path,
    text: pl.LazyFrame,
    first: dict[str, Any],
    wanted: list[str],
    time_col: str | None,
    line: int,
    expected: str,
) -> bool:
    """The scanned table's rows against the limits and their values (`first`: what
    `_first_bad_rows` found; `line`: the first row's line number); one DataError line naming
    the first bad one. Returns whether the time column holds datetimes (not integers)."""
    if first["rows"] == 0:
        raise DataError(f"{path}: no records, expected {expected}")
    limit = _limits().max_rows
    if first["rows"] > limit:
        raise DataError(
            f"{path}: {first['rows']:,} rows, over the {limit:,} a reader takes "
            "(SEQREC_MAX_ROWS raises the limit)"
        )
    for c in wanted:
        if first[f"{c} missing"] is not None:
            raise DataError(f"{path}:{first[f'{c} missing'] + line}: missing {c}")
    datetimes = time_col is not None and first[f"{time_col} not int"] is not None
    if datetimes and first[f"{time_col} bad"] is not None:
        row = first[f"{time_col} bad"]
        value = text.filter(pl.col("row") == row).select(time_col).collect().item()
        raise DataError(
            f"{path}:{row + line}: {time_col} {_shown(value)} is neither an integer "
            "nor an ISO datetime"
        )
    return datetimes


def _first_bad_rows(
    text: pl.LazyFrame, user_col: str, item_col: str, time_col: str | None, integers: set[str]
) -> dict[str, Any]:
    """One streaming pass: the row count; per column the first row with no value; per id column
    whether every value is an integer that round-trips; for the time column the first row that
    is not an integer and the first that is neither an integer nor a datetime. `integers`: the
    columns that are integers already."""
    row = pl.col("row")
    exprs = [pl.len().alias("rows")]
    for c in [user_col, item_col, *([time_col] if time_col else [])]:
        empty = pl.col(c).is_null() if c in integers else pl.col(c).is_null() | (pl.col(c) == "")
        exprs.append(row.filter(empty).min().alias(f"{c} missing"))
    for c in (user_col, item_col):
        as_int = pl.col(c).cast(pl.Int64, strict=False)
        exact = (as_int.is_not_null() & (as_int.cast(pl.String) == pl.col(c))).all()
        exprs.append(
            pl.lit(True).alias(f"{c} exact") if c in integers else exact.alias(f"{c} exact")
        )
    if time_col in integers:
        exprs.append(pl.lit(None, dtype=pl.UInt32).alias(f"{time_col} not int"))
        exprs.append(pl.lit(None, dtype=pl.UInt32).alias(f"{time_col} bad"))
    elif time_col is not None:
        not_int = pl.col(time_col).cast(pl.Int64, strict=False).is_null()
        exprs.append(row.filter(not_int).min().alias(f"{time_col} not int"))
    first = text.select(exprs).collect(engine="streaming").row(0, named=True)
    if (
        time_col is not None
        and first.setdefault(f"{time_col} bad", None) is None
        and (first[f"{time_col} not int"] is not None)
    ):
        # times that are not all integers: a second look, for the first that is no datetime
        # either (parsing every row as a datetime costs more than the rest of the pass)
        not_int = pl.col(time_col).cast(pl.Int64, strict=False).is_null()
        as_dt = pl.col(time_col).str.to_datetime(strict=False, time_unit="us")
        bad = row.filter(not_int & as_dt.is_null()).min().alias("bad")
        first[f"{time_col} bad"] = text.select(bad).collect(engine="streaming").item()
    return first
