"""Reading a log's bytes safely: size and decompression limits, each line checked, id and time
columns turned into integers with the first bad value named (file and line)."""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec.errors import DataError

__all__ = ["INTERACTION_COLUMNS", "ReadLimits", "check_column_types"]

INTERACTION_COLUMNS = ("user", "item", "timestamp", "line")


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


_LIMITS: ContextVar[ReadLimits | None] = ContextVar("seqrec_read_limits", default=None)
