from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest

from seqrec.data.io import (
    detect_format,
    read_amazon_csv,
    read_amazon_json,
    read_interactions,
    read_movielens_csv,
    read_movielens_dat,
    read_steam_reviews,
    read_user_item_txt,
)
from seqrec.data.tables import read_table, scan_table
from seqrec.errors import DataError


def _rows(df: pl.DataFrame) -> list[tuple]:
    return list(df.select("user", "item", "timestamp", "line").iter_rows())


def test_movielens_dat(tmp_path: Path) -> None:
    p = tmp_path / "ratings.dat"
    p.write_bytes(b"1::1193::5::978300760\n1::661::3::978302109\n2::1357::5::978298709\n")
    df = read_movielens_dat(p)
    assert _rows(df) == [(1, 1193, 978300760, 0), (1, 661, 978302109, 1), (2, 1357, 978298709, 2)]
    assert df["user"].dtype == pl.Int64


def test_movielens_dat_gzipped(tmp_path: Path) -> None:
    p = tmp_path / "ratings.dat.gz"
    p.write_bytes(gzip.compress(b"3::10::4::5\n"))
    assert _rows(read_interactions(p)) == [(3, 10, 5, 0)]


def test_movielens_csv(tmp_path: Path) -> None:
    p = tmp_path / "ratings.csv"
    p.write_text("userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,29,3.5,1112484676\n")
    assert _rows(read_movielens_csv(p)) == [(1, 2, 1112486027, 0), (1, 29, 1112484676, 1)]


def test_amazon_csv_string_ids(tmp_path: Path) -> None:
    p = tmp_path / "ratings_Beauty.csv"
    p.write_text(
        "A39HTATAQ9V7YF,0205616461,5.0,1369699200\nA3JM6GV9MNOF9X,0558925278,3.0,1355443200\n"
    )
    df = read_interactions(p)
    assert _rows(df) == [
        ("A39HTATAQ9V7YF", "0205616461", 1369699200, 0),
        ("A3JM6GV9MNOF9X", "0558925278", 1355443200, 1),
    ]
    assert detect_format(p) == "amazon-csv"
    assert read_amazon_csv(p).height == 2


@pytest.mark.parametrize("gz", [False, True])
def test_amazon_json(tmp_path: Path, gz: bool) -> None:
    text = (
        b'{"reviewerID": "A1", "asin": "0000031852", "helpful": [0, 0], '
        b'"unixReviewTime": 1400000000}\n'
        b'{"reviewerID": "A2", "asin": "B001", "overall": 5.0, "unixReviewTime": 1300000000}\n'
    )
    p = tmp_path / ("reviews_Beauty_5.json.gz" if gz else "reviews_Beauty_5.json")
    p.write_bytes(gzip.compress(text) if gz else text)
    assert _rows(read_amazon_json(p)) == [
        ("A1", "0000031852", 1400000000, 0),
        ("A2", "B001", 1300000000, 1),
    ]


def test_amazon_json_names_bad_line(tmp_path: Path) -> None:
    p = tmp_path / "reviews.json"
    p.write_text(
        '{"reviewerID": "A1", "asin": "X", "unixReviewTime": 1}\n'
        '{"reviewerID": "A2", "asin": "Y"}\n'
    )
    with pytest.raises(DataError, match=r"reviews\.json:2: missing .*unixReviewTime"):
        read_amazon_json(p)


def test_steam_literal_dicts(tmp_path: Path) -> None:
    lines = [
        "{'username': 'Chaos Syren', 'hours': 0.1, 'product_id': '725280', 'date': '2017-12-17', "
        "'text': 'a \"quoted\" review', 'early_access': False}",
        "{'username': 'cow', 'product_id': '328100', 'date': '1970-01-02'}",
    ]
    p = tmp_path / "steam_reviews.json.gz"
    p.write_bytes(gzip.compress("\n".join(lines).encode()))
    df = read_steam_reviews(p, progress=False)
    assert _rows(df) == [("Chaos Syren", "725280", 1513468800, 0), ("cow", "328100", 86400, 1)]


def test_steam_never_evaluates_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    p = tmp_path / "steam_reviews.json"
    p.write_text(f"__import__('pathlib').Path({str(marker)!r}).touch()\n")
    with pytest.raises(DataError, match=r"steam_reviews\.json:1: expected a Python dict literal"):
        read_steam_reviews(p, progress=False)
    assert not marker.exists()


def test_user_item_txt_uses_line_order(tmp_path: Path) -> None:
    p = tmp_path / "ml-1m.txt"
    p.write_text("1 5\n1 3\n2 5\n")
    assert _rows(read_user_item_txt(p)) == [(1, 5, 0, 0), (1, 3, 1, 1), (2, 5, 2, 2)]


def test_generic_csv_custom_columns_and_iso_dates(tmp_path: Path) -> None:
    p = tmp_path / "log.csv"
    p.write_text("who;what;when\nu1;i9;2020-01-01T00:00:10\nu1;i8;2020-01-01\n")
    df = read_table(p, user_col="who", item_col="what", time_col="when", separator=";")
    assert _rows(df) == [("u1", "i9", 1577836810, 0), ("u1", "i8", 1577836800, 1)]


def test_generic_parquet(tmp_path: Path) -> None:
    p = tmp_path / "log.parquet"
    pl.DataFrame({"user_id": [7, 7], "item_id": [1, 2], "ts": [20, 10]}).write_parquet(p)
    df = read_interactions(p, user_col="user_id", item_col="item_id", time_col="ts")
    assert _rows(df) == [(7, 1, 20, 0), (7, 2, 10, 1)]
    with pytest.raises(
        DataError,
        match=r"log\.parquet: missing column\(s\) user, item, timestamp; has user_id, item_id, ts",
    ):
        read_interactions(p)


# ------------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.dat: file not found"):
        read_interactions(tmp_path / "nope.dat")


def test_wrong_separator(tmp_path: Path) -> None:
    p = tmp_path / "ratings.dat"
    p.write_text("1,1193,5,978300760\n")
    with pytest.raises(
        DataError, match=r"ratings\.dat: found 1 field\(s\) per line, expected 4 fields"
    ):
        read_movielens_dat(p)


def test_missing_columns(tmp_path: Path) -> None:
    p = tmp_path / "ratings.csv"
    p.write_text("userId,rating\n1,5\n")
    with pytest.raises(DataError, match=r"ratings\.csv: missing column\(s\) movieId, timestamp"):
        read_movielens_csv(p)


def test_non_numeric_id_names_line(tmp_path: Path) -> None:
    p = tmp_path / "ratings.dat"
    p.write_text("1::10::5::100\n1::abc::5::101\n")
    with pytest.raises(DataError, match=r"ratings\.dat:2: MovieID 'abc' is not an integer"):
        read_movielens_dat(p)


def test_non_numeric_timestamp_names_line(tmp_path: Path) -> None:
    p = tmp_path / "ratings.csv"
    p.write_text("userId,movieId,rating,timestamp\n1,2,3,4\n1,3,3,4\n1,4,3,yesterday\n")
    with pytest.raises(DataError, match=r"ratings\.csv:4: timestamp 'yesterday' is not an integer"):
        read_movielens_csv(p)


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "ratings.dat"
    p.write_text("")
    with pytest.raises(DataError, match=r"ratings\.dat: empty file"):
        read_movielens_dat(p)


def test_truncated_gzip(tmp_path: Path) -> None:
    p = tmp_path / "ml-1m.txt.gz"
    p.write_bytes(gzip.compress(b"1 2\n" * 5000)[:-40])
    with pytest.raises(DataError, match=r"ml-1m\.txt\.gz: truncated or corrupt gzip"):
        read_interactions(p)


def test_unknown_extension_asks_for_format(tmp_path: Path) -> None:
    p = tmp_path / "data.bin"
    p.write_text("x")
    with pytest.raises(DataError, match="pass --format"):
        read_interactions(p)


# ------------------------------------------------------------------------------- streaming read

STREAM_CASES = {
    # integer ids and times, a column the log does not need, rows out of time order
    "ints.csv": (
        'user,item,timestamp,comment\n3,10,50,a\n1,11,20,"b, c"\n3,12,40,d\n',
        {},
    ),
    # ids that are not all integers stay strings (an ASIN keeps its leading zero); ISO times
    "strings.csv": (
        "who;what;when\nu1;0205616461;2020-01-01T00:00:10\n 7 ;i8;2020-01-01\nu1;12;2020-01-02\n",
        {"user_col": "who", "item_col": "what", "time_col": "when", "separator": ";"},
    ),
    # no time column: line order
    "ordered.csv": ("user,item\n5,1\n5,2\n4,1\n", {"time_col": None}),
}


@pytest.mark.parametrize("name", [*STREAM_CASES, "log.parquet"])
def test_a_streamed_table_is_the_table_read_in_memory(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    if name == "log.parquet":
        pl.DataFrame(
            {"u": [7, 7, 2], "i": ["x", "y", "x"], "t": [20, 10, 30], "extra": [0.5, 1.5, 2.5]}
        ).write_parquet(p)
        kw: dict = {"user_col": "u", "item_col": "i", "time_col": "t"}
    else:
        text, kw = STREAM_CASES[name]
        p.write_text(text)
    memory, streamed = read_table(p, **kw), scan_table(p, **kw)
    assert streamed.schema == memory.schema
    assert _rows(streamed) == _rows(memory)
    assert read_interactions(p, reader="stream", **kw).equals(memory)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("user,item,timestamp\n1,2,3\n1,,4\n", r"log\.csv:3: missing item"),
        (
            "user,item,timestamp\n1,2,3\n1,3,yesterday\n",
            r"log\.csv:3: timestamp 'yesterday' is neither",
        ),
        ("user,when\n1,2\n", r"log\.csv: missing column\(s\) item, timestamp; expected a header"),
        ("user,item,timestamp\n", r"log\.csv: no records"),
    ],
)
def test_a_streamed_file_names_its_first_bad_line_as_the_memory_reader_does(
    tmp_path: Path, text: str, message: str
) -> None:
    p = tmp_path / "log.csv"
    p.write_text(text)
    for reader in ("memory", "stream"):
        with pytest.raises(DataError, match=message):
            read_interactions(p, reader=reader)


def test_auto_streams_a_large_plain_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqrec.data.io as io

    p, gz = tmp_path / "log.csv", tmp_path / "log.csv.gz"
    p.write_text("user,item,timestamp\n1,2,3\n")
    gz.write_bytes(gzip.compress(p.read_bytes()))
    streamed: list[Path] = []
    real = io.scan_table
    monkeypatch.setattr(
        io, "scan_table", lambda path, **kw: streamed.append(path) or real(path, **kw)
    )
    read_interactions(p)
    assert streamed == []  # under STREAM_BYTES: in memory
    monkeypatch.setattr(io, "STREAM_BYTES", 10)
    read_interactions(p, fmt="csv")
    read_interactions(gz, fmt="csv")  # gzipped: in memory whatever its size
    read_interactions(p, fmt="csv", reader="memory")
    assert streamed == [p]
    with pytest.raises(DataError, match=r"log\.csv\.gz: a gzip file is read in memory"):
        read_interactions(gz, fmt="csv", reader="stream")
    dat = tmp_path / "ratings.dat"
    dat.write_text("1::2::5::3\n")
    with pytest.raises(DataError, match=r"ratings\.dat: a movielens-dat file is read in memory"):
        read_interactions(dat, reader="stream")


def test_integer_parquet_columns_stay_integers_and_name_a_missing_value(tmp_path: Path) -> None:
    p = tmp_path / "log.parquet"
    pl.DataFrame({"user": [1, 2, None], "item": [5, 6, 7], "timestamp": [1, 2, 3]}).write_parquet(p)
    for reader in ("memory", "stream"):
        with pytest.raises(DataError, match=r"log\.parquet:3: missing user"):
            read_interactions(p, reader=reader)
    pl.DataFrame(
        {"user": [1, 2], "item": [5, 6], "timestamp": [3, 2]}, schema_overrides={"user": pl.UInt8}
    ).write_parquet(p)
    for reader in ("memory", "stream"):
        df = read_interactions(p, reader=reader)
        assert df.schema["user"] == pl.Int64 and _rows(df) == [(1, 5, 3, 0), (2, 6, 2, 1)]
