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
import io
import json
import re
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Literal

import polars as pl

from seqrec.data.reading import (
    _LIMITS,
    ReadLimits,
    _csv_strings,
    _frame,
    _id_column,
    _read_bytes,
    _shown,
    _to_int,
)
from seqrec.data.tables import read_table, scan_table
from seqrec.errors import DataError
from seqrec.progress import Progress

__all__ = [
    "FORMATS",
    "detect_format",
    "read_amazon_csv",
    "read_amazon_json",
    "read_interactions",
    "read_movielens_csv",
    "read_movielens_dat",
    "read_steam_reviews",
    "read_user_item_txt",
]


# --------------------------------------------------------------------------------------- helpers


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


# ----------------------------------------------------------------------------- streaming read


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


# A plain (not gzipped) CSV or Parquet log over this many bytes is read by `scan_table` unless
# `read_interactions(reader=...)` says otherwise (data.reader in a config)
STREAM_BYTES = 1 << 30
