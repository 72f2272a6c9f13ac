"""Readers: raw dataset files -> one interactions table with *external* ids.

Every reader returns a Polars DataFrame with the columns

    user       external user id (Int64 when the file's ids are integers, else String)
    item       external item id (likewise)
    timestamp  Int64; seconds since the epoch, or the record's line order when the file has no time
    line       Int64; 0-based position of the record in the file, the tie-breaker that keeps
               equal timestamps in file order (a stable sort, see shared/data/README.md)

Readers never filter or reorder; that is `preprocess`'s job. Every failure is a `DataError` whose
message names the file (and the line where known) and what was expected.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from datetime import date
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from seqrec.errors import DataError
from seqrec.progress import Progress

__all__ = [
    "FORMATS",
    "INTERACTION_COLUMNS",
    "ReadLimits",
    "check_column_types",
    "detect_format",
    "read_amazon_csv",
    "read_amazon_json",
    "read_interactions",
    "read_movielens_csv",
    "read_movielens_dat",
    "read_steam_reviews",
    "read_table",
    "read_user_item_txt",
    "scan_table",
]

INTERACTION_COLUMNS = ("user", "item", "timestamp", "line")


# --------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class ReadLimits:
    """What a reader accepts before it stops with one `DataError` line, so that no input (a
    gzip bomb, `/dev/zero`, a megabyte-long line) can take memory beyond a bound set here. The
    defaults are generous for interaction logs (ML-20M's ratings.csv is 0.5 GB); each can be
    raised per call (`read_interactions(..., limits=...)`) or by its environment variable.

    max_bytes       input bytes after decompression (SEQREC_MAX_INPUT_BYTES, default 2 GiB)
    max_ratio       gzip output / input size beyond the first 64 MiB (SEQREC_MAX_GZIP_RATIO,
                    default 100; text logs compress 3-10 times)
    max_line_bytes  one line (SEQREC_MAX_LINE_BYTES, default 1 MiB)
    max_fields      fields of a delimited file's first line (SEQREC_MAX_FIELDS, default 1,000)
    max_rows        rows of a Parquet file (SEQREC_MAX_ROWS, default 200 million)
    """

    max_bytes: int = 2 << 30
    max_ratio: float = 100.0
    max_line_bytes: int = 1 << 20
    max_fields: int = 1_000
    max_rows: int = 200_000_000

    @classmethod
    def from_env(cls) -> ReadLimits:
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f"SEQREC_{f.name.upper()}".replace("MAX_BYTES", "MAX_INPUT_BYTES")
            name = name.replace("MAX_RATIO", "MAX_GZIP_RATIO")
            text = os.environ.get(name)
            if text is None:
                continue
            try:
                value = float(text) if f.name == "max_ratio" else int(text)
            except ValueError:
                raise DataError(f"${name}={text!r}: expected a number") from None
            if value <= 0:
                raise DataError(f"${name}={text!r}: expected a positive number")
            values[f.name] = value
        return cls(**values)


_LIMITS: ContextVar[ReadLimits | None] = ContextVar("seqrec_read_limits", default=None)
_GZIP_FREE = 64 << 20  # decompressed bytes allowed whatever the ratio
_CHUNK = 4 << 20


def _limits() -> ReadLimits:
    return _LIMITS.get() or ReadLimits.from_env()


def _shown(value: object, width: int = 60) -> str:
    """A field's value for an error line: its repr, cut to `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_column_types(
    schema: Mapping[str, pl.DataType],
    ids: Sequence[str],
    time_col: str | None,
    where: str | Path,
) -> None:
    """Each column's type, from a table's schema before a value is read: ids are integers or
    text (a categorical too), a time is a datetime, a date, a number or text. Anything else (a
    list, array or struct column, floats or booleans as ids) is one DataError line naming the
    column and its type."""
    for name in ids:
        dtype = schema[name]
        if not (dtype.is_integer() or dtype == pl.String or isinstance(dtype, _CATEGORIES)):
            hint = " (cast it to integers first)" if dtype.is_float() else ""
            raise DataError(
                f"{where}: column {name!r} is {dtype}, expected integer or text ids{hint}"
            )
    if time_col is not None:
        dtype = schema[time_col]
        if not (dtype.is_numeric() or dtype.is_temporal() or dtype == pl.String):
            raise DataError(
                f"{where}: column {time_col!r} is {dtype}, expected a datetime, a date, a "
                "number or text"
            )


_CATEGORIES = (pl.Categorical, pl.Enum)


def _first_line(e: BaseException) -> str:
    """A library error's first line (its type when it has no text), cut to 200 characters."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _check_file(path: Path) -> int:
    """The size of a regular file; one line for anything else (checked before it is opened: a
    FIFO would block, /dev/zero never ends)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DataError(f"{path}: is a directory, expected a data file")
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{path}: not a regular file (a device, FIFO or socket); expected a file")
    return st.st_size


class _LineCheck:
    """Follows the line lengths of a stream of chunks (\n or \r end a line)."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit, self.open, self.offset = path, limit, 0, 0

    def feed(self, chunk: bytes) -> None:
        arr = np.frombuffer(chunk, dtype=np.uint8)
        ends = np.flatnonzero((arr == 10) | (arr == 13))
        if ends.size == 0:
            longest, self.open = self.open + len(chunk), self.open + len(chunk)
        else:
            inner = int(np.diff(ends).max()) - 1 if ends.size > 1 else 0
            longest = max(self.open + int(ends[0]), inner)
            self.open = len(chunk) - int(ends[-1]) - 1
        if max(longest, self.open) > self.limit:
            raise DataError(
                f"{self.path}: a line longer than {self.limit:,} bytes (before byte "
                f"{self.offset + len(chunk):,}); not an interaction log? "
                "(SEQREC_MAX_LINE_BYTES raises the limit)"
            )
        self.offset += len(chunk)


def _read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic; never empty. Read in
    chunks within `ReadLimits`: a file or a decompression that passes one stops there with one
    line, before more is read."""
    limits = _limits()
    size = _check_file(path)
    lines = _LineCheck(path, limits.max_line_bytes)
    chunks: list[bytes] = []
    total = 0
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            cap = min(limits.max_bytes, max(_GZIP_FREE, int(limits.max_ratio * size)))
            stream: Any = gzip.GzipFile(fileobj=f)
        else:
            if size > limits.max_bytes:
                raise DataError(
                    f"{path}: {size:,} bytes, over the {limits.max_bytes:,} a reader takes "
                    "(SEQREC_MAX_INPUT_BYTES raises the limit)"
                )
            cap, stream = limits.max_bytes, f
        try:
            while chunk := stream.read(_CHUNK):
                total += len(chunk)
                if total > cap:
                    why = (
                        f"more than {limits.max_ratio:g} times its {size:,} bytes (a gzip bomb?); "
                        "SEQREC_MAX_GZIP_RATIO"
                        if cap < limits.max_bytes
                        else f"over {limits.max_bytes:,} bytes; SEQREC_MAX_INPUT_BYTES"
                    )
                    raise DataError(f"{path}: decompresses to {why} raises the limit")
                lines.feed(chunk)
                chunks.append(chunk)
        except (EOFError, OSError, zlib.error) as e:
            what = "truncated or corrupt gzip file" if gz else "could not be read"
            raise DataError(f"{path}: {what} ({_shown(str(e), 120)[1:-1]})") from None
    raw = b"".join(chunks)
    del chunks
    if not raw.strip():
        raise DataError(f"{path}: empty file, expected interaction records")
    return raw


def _csv_strings(
    path: Path,
    *,
    separator: str,
    has_header: bool,
    n_fields: int | None,
    expected: str,
    raw: bytes | None = None,
) -> pl.DataFrame:
    """Read a delimited file (or its already-read `raw` bytes) with every column as a string;
    types are checked afterwards."""
    raw = _read_bytes(path) if raw is None else raw
    limit = _limits().max_fields
    head = raw[: raw.find(b"\n")] if b"\n" in raw else raw
    if head.count(separator.encode()) >= limit:
        raise DataError(
            f"{path}: more than {limit:,} fields in its first line, expected {expected} "
            "(SEQREC_MAX_FIELDS raises the limit)"
        )
    try:
        df = pl.read_csv(
            io.BytesIO(raw),
            separator=separator,
            has_header=has_header,
            infer_schema=False,
            quote_char='"' if separator == "," else None,
        )
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: could not parse as {expected} ({first[:200]})") from None
    if n_fields is not None and df.width != n_fields:
        raise DataError(f"{path}: found {df.width} field(s) per line, expected {expected}")
    if df.height == 0:
        raise DataError(f"{path}: no records, expected {expected}")
    return df


def _to_int(df: pl.DataFrame, column: str, path: Path, field: str, first_line: int) -> pl.Series:
    """Cast a string column to Int64, naming the first line whose value is not an integer."""
    src = df.get_column(column).str.strip_chars()
    out = src.cast(pl.Int64, strict=False)
    bad = out.is_null()
    if bad.any():
        row = int(bad.arg_max() or 0)
        value = src[row]
        raise DataError(
            f"{path}:{row + first_line}: {field} {_shown(value)} is not an integer"
            if value is not None
            else f"{path}:{row + first_line}: missing {field}"
        )
    return out.alias(field)


def _id_column(df: pl.DataFrame, column: str, path: Path, field: str, first_line: int) -> pl.Series:
    """An id column: Int64 when every value is an integer, else the stripped strings."""
    if df[column].dtype.is_integer():
        return _integers(df, column, path, field, first_line)
    src = df.get_column(column).str.strip_chars()
    if src.is_null().any() or (src == "").any():
        row = int((src.is_null() | (src == "")).arg_max() or 0)
        raise DataError(f"{path}:{row + first_line}: missing {field}")
    as_int = src.cast(pl.Int64, strict=False)
    # integers only when every value round-trips: ASINs such as '0205616461' stay strings
    exact = not as_int.is_null().any() and bool((as_int.cast(pl.String) == src).all())
    return (as_int if exact else src).alias(field)


def _frame(user: pl.Series, item: pl.Series, timestamp: pl.Series) -> pl.DataFrame:
    n = len(user)
    return pl.DataFrame(
        [
            user.alias("user"),
            item.alias("item"),
            timestamp.cast(pl.Int64).alias("timestamp"),
            pl.int_range(0, n, dtype=pl.Int64, eager=True).alias("line"),
        ]
    )


# --------------------------------------------------------------------------------------- readers


def read_movielens_dat(path: str | Path) -> pl.DataFrame:
    """MovieLens-1M/10M `ratings.dat`: `UserID::MovieID::Rating::Timestamp`, no header."""
    path = Path(path)
    expected = "4 fields 'UserID::MovieID::Rating::Timestamp'"
    # Reading with ':' as the separator turns each '::' into an empty field between the real ones.
    df = _csv_strings(path, separator=":", has_header=False, n_fields=7, expected=expected)
    gaps = df.select(pl.any_horizontal(pl.col(df.columns[i]).is_not_null() for i in (1, 3, 5)))
    if gaps.to_series().any():
        row = int(gaps.to_series().arg_max() or 0)
        raise DataError(f"{path}:{row + 1}: expected {expected}")
    c = df.columns
    return _frame(
        _to_int(df, c[0], path, "UserID", 1),
        _to_int(df, c[2], path, "MovieID", 1),
        _to_int(df, c[6], path, "Timestamp", 1),
    )


def read_movielens_csv(path: str | Path) -> pl.DataFrame:
    """MovieLens-20M/25M `ratings.csv`: header `userId,movieId,rating,timestamp`."""
    path = Path(path)
    expected = "a header 'userId,movieId,rating,timestamp'"
    df = _csv_strings(path, separator=",", has_header=True, n_fields=None, expected=expected)
    missing = [c for c in ("userId", "movieId", "timestamp") if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected}")
    return _frame(
        _to_int(df, "userId", path, "userId", 2),
        _to_int(df, "movieId", path, "movieId", 2),
        _to_int(df, "timestamp", path, "timestamp", 2),
    )


def read_amazon_csv(path: str | Path) -> pl.DataFrame:
    """Amazon `ratings_<Category>.csv` (2014 release): `user,item,rating,timestamp`, no header."""
    path = Path(path)
    expected = "4 comma-separated fields 'user,item,rating,timestamp'"
    df = _csv_strings(path, separator=",", has_header=False, n_fields=4, expected=expected)
    c = df.columns
    return _frame(
        _id_column(df, c[0], path, "user", 1),
        _id_column(df, c[1], path, "item", 1),
        _to_int(df, c[3], path, "timestamp", 1),
    )


def _json_lines(path: Path, raw: bytes, fields: tuple[str, ...]) -> pl.DataFrame:
    """Parse JSON lines with the standard library, naming the first bad line."""
    rows: dict[str, list[object]] = {f: [] for f in fields}
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not a JSON object ({e.msg})") from None
        except (UnicodeDecodeError, RecursionError) as e:
            raise DataError(f"{path}:{n}: not a UTF-8 JSON object ({type(e).__name__})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a JSON object, found {type(rec).__name__}")
        for f in fields:
            if f not in rec:
                raise DataError(f"{path}:{n}: missing field {f!r}")
            rows[f].append(rec[f])
    return pl.DataFrame({f: [str(v) for v in vs] for f, vs in rows.items()})


def read_amazon_json(path: str | Path) -> pl.DataFrame:
    """Amazon review JSON lines (`reviewerID`, `asin`, `unixReviewTime`), plain or .gz."""
    path = Path(path)
    fields = ("reviewerID", "asin", "unixReviewTime")
    raw = _read_bytes(path)
    try:
        df = pl.read_ndjson(io.BytesIO(raw), infer_schema_length=1000).select(fields)
        df = df.with_columns(pl.col(f).cast(pl.String) for f in fields)
    except (pl.exceptions.PolarsError, pl.exceptions.ColumnNotFoundError):
        # Slow path only to find and name the offending line.
        df = _json_lines(path, raw, fields)
    return _frame(
        _id_column(df, "reviewerID", path, "reviewerID", 1),
        _id_column(df, "asin", path, "asin", 1),
        _to_int(df, "unixReviewTime", path, "unixReviewTime", 1),
    )


_STEAM_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def read_steam_reviews(path: str | Path, *, progress: bool = True) -> pl.DataFrame:
    """Steam `steam_reviews.json.gz`: one Python-literal dict per line (`username`, `product_id`,
    `date` as YYYY-MM-DD). Parsed with `ast.literal_eval`, never `eval`: the file is data."""
    path = Path(path)
    raw = _read_bytes(path)
    users: list[str] = []
    items: list[str] = []
    times: list[int] = []
    epoch = date(1970, 1, 1)
    lines = raw.decode("utf-8", errors="replace").splitlines()
    bar = Progress(len(lines), "steam", enabled=progress, unit="line")
    for n, line in enumerate(lines, 1):
        bar.update(1)
        if not line.strip():
            continue
        try:
            rec = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise DataError(f"{path}:{n}: expected a Python dict literal") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a Python dict literal")
        for f in ("username", "product_id", "date"):
            if f not in rec:
                raise DataError(f"{path}:{n}: missing field {f!r}")
        d = str(rec["date"])
        if not _STEAM_DATE.match(d):
            raise DataError(f"{path}:{n}: date {_shown(d)} is not YYYY-MM-DD")
        users.append(str(rec["username"]))
        items.append(str(rec["product_id"]))
        times.append((date.fromisoformat(d) - epoch).days * 86_400)
    bar.close()
    if not users:
        raise DataError(f"{path}: no records, expected Steam review dicts")
    return _frame(pl.Series(users), pl.Series(items), pl.Series(times, dtype=pl.Int64))


def read_user_item_txt(path: str | Path) -> pl.DataFrame:
    """The papers' `user item` text file (plain or .gz), each user's lines already in time order.

    It has no timestamps: `timestamp` is the line order, so sorting keeps the file's order.
    """
    path = Path(path)
    expected = "2 space-separated integer fields 'user item'"
    raw = _read_bytes(path)
    # Accept tabs or runs of spaces as well as the single spaces of the original file.
    raw = re.sub(rb"[ \t]+", b" ", raw).replace(b" \n", b"\n").replace(b"\n ", b"\n")
    df = _csv_strings(
        path,
        separator=" ",
        has_header=False,
        n_fields=2,
        expected=expected,
        raw=raw.strip() + b"\n",
    )
    c = df.columns
    user = _to_int(df, c[0], path, "user", 1)
    item = _to_int(df, c[1], path, "item", 1)
    return _frame(user, item, pl.int_range(0, len(user), dtype=pl.Int64, eager=True))


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


def _integers(df: pl.DataFrame, column: str, path: Path, field: str, first_line: int) -> pl.Series:
    """An integer column (of a Parquet file) as Int64; its first missing value named."""
    col = df.get_column(column)
    if col.null_count():
        raise DataError(f"{path}:{int(col.is_null().arg_max() or 0) + first_line}: missing {field}")
    return col.cast(pl.Int64).alias(field)


def _timestamp_column(df: pl.DataFrame, column: str, path: Path, first_line: int) -> pl.Series:
    if df[column].dtype.is_integer():
        return _integers(df, column, path, column, first_line)
    src = df.get_column(column).str.strip_chars()
    if src.is_null().any() or (src == "").any():
        row = int((src.is_null() | (src == "")).arg_max() or 0)
        raise DataError(f"{path}:{row + first_line}: missing {column}")
    as_int = src.cast(pl.Int64, strict=False)
    if not as_int.is_null().any():
        return as_int
    try:
        as_dt = src.str.to_datetime(strict=False, time_unit="us")
    except pl.exceptions.PolarsError:  # no single datetime format fits the column
        as_dt = pl.Series(column, [None] * len(src), dtype=pl.Datetime("us"))
    if not as_dt.is_null().any():
        return (as_dt.dt.epoch("s")).alias(column)
    row = int((as_int.is_null() & as_dt.is_null()).arg_max() or 0)
    raise DataError(
        f"{path}:{row + first_line}: {column} {_shown(src[row])} is neither an integer "
        "nor an ISO datetime"
    )


# ----------------------------------------------------------------------------- streaming read

# A plain (not gzipped) CSV or Parquet log over this many bytes is read by `scan_table` unless
# `read_interactions(reader=...)` says otherwise (data.reader in a config)
STREAM_BYTES = 1 << 30


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


# ------------------------------------------------------------------------------- format dispatch

Reader = Callable[[Path], pl.DataFrame]

FORMATS: dict[str, Reader] = {
    "movielens-dat": read_movielens_dat,
    "movielens-csv": read_movielens_csv,
    "amazon-csv": read_amazon_csv,
    "amazon-json": read_amazon_json,
    "steam": read_steam_reviews,
    "user-item": read_user_item_txt,
    "csv": read_table,
    "parquet": read_table,
}


def _large_plain(path: Path) -> bool:
    """Over `STREAM_BYTES` and not gzipped: what "auto" streams."""
    try:
        if path.stat().st_size <= STREAM_BYTES:
            return False
        with path.open("rb") as f:
            return f.read(2) != b"\x1f\x8b"
    except OSError:
        return False  # the reader names the problem


def detect_format(path: str | Path) -> str:
    """Guess the format from the file name; `--format` overrides it."""
    name = Path(path).name.lower()
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(".dat"):
        return "movielens-dat"
    if stem == "ratings.csv":
        return "movielens-csv"
    if stem.startswith("ratings_") and stem.endswith(".csv"):
        return "amazon-csv"
    if stem.startswith("steam"):
        return "steam"
    if stem.endswith((".json", ".jsonl")):
        return "amazon-json"
    if stem.endswith(".txt"):
        return "user-item"
    if stem.endswith(".parquet"):
        return "parquet"
    if stem.endswith(".csv"):
        return "csv"
    raise DataError(
        f"{path}: cannot tell the format from the file name; pass --format one of "
        + ", ".join(FORMATS)
    )


def read_interactions(
    path: str | Path,
    fmt: str | None = None,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
    separator: str = ",",
    limits: ReadLimits | None = None,
    reader: Literal["auto", "memory", "stream"] = "auto",
) -> pl.DataFrame:
    """Read any supported file into the interactions table (format from the name unless given).

    The column options apply to the generic `csv` and `parquet` formats only. `limits` bound
    what the reader takes (default: `ReadLimits.from_env()`). `reader`: "stream" reads a CSV
    or Parquet file (generic, or MovieLens' ratings.csv) with `scan_table`, "memory" with
    `read_table`; "auto" streams a plain file of those formats over `STREAM_BYTES`.
    """
    if limits is not None:
        token = _LIMITS.set(limits)
        try:
            return read_interactions(
                path,
                fmt,
                user_col=user_col,
                item_col=item_col,
                time_col=time_col,
                separator=separator,
                reader=reader,
            )
        finally:
            _LIMITS.reset(token)
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if reader not in ("auto", "memory", "stream"):
        raise DataError(f"unknown reader {reader!r}; expected auto, memory or stream")
    streamable = fmt in ("csv", "parquet", "movielens-csv")
    if reader == "stream" and not streamable:
        raise DataError(
            f"{path}: a {fmt} file is read in memory; streaming reads csv, parquet and "
            "movielens-csv files"
        )
    if streamable and (reader == "stream" or (reader == "auto" and _large_plain(path))):
        if fmt == "movielens-csv":
            return scan_table(path, user_col="userId", item_col="movieId", time_col="timestamp")
        return scan_table(
            path, user_col=user_col, item_col=item_col, time_col=time_col, separator=separator
        )
    if fmt in ("csv", "parquet"):
        return read_table(
            path, user_col=user_col, item_col=item_col, time_col=time_col, separator=separator
        )
    return FORMATS[fmt](path)
