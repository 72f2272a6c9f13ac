"""Property-based fuzzing of every input surface: the readers, the configs and `--set` values,
and `seqrec prepare` / `seqrec recommend --input` on hostile files. The outcome is a result or
one `SeqrecError` line naming the file or field, never another exception, and nothing is left
half-written. Example counts are bounded for CI; SEQREC_FUZZ_EXAMPLES raises them
(docs/design/reliability.md records a larger run)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqrec.config import RunConfig, load_config
from seqrec.data.io import FORMATS, read_interactions
from seqrec.errors import SeqrecError

EXAMPLES = int(os.environ.get("SEQREC_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# file name per format (the reader is told from it, as users' files are)
NAMES = {
    "movielens-dat": "ratings.dat",
    "movielens-csv": "ratings.csv",
    "amazon-csv": "ratings_Beauty.csv",
    "amazon-json": "reviews.json",
    "steam": "steam_reviews.json",
    "user-item": "data.txt",
    "csv": "log.csv",
}

# values that break naive parsers
NASTY = st.sampled_from(
    [
        "",
        " ",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "-1",
        "0",
        "1e308",
        "99999999999999999999999",
        "3.5",
        "1,2",
        '"',
        "'",
        "::",
        "\t",
        "\x00",
        "é",
        "\ufeff",
        "null",
        "None",
        "[]",
        "{}",
        "-0",
        "2020-01-01",
        "2020-13-45T25:61:00",
        "１２３",
    ]
)
FIELD = st.one_of(st.integers(-(2**70), 2**70).map(str), NASTY, st.text(max_size=8))


def _record(fmt: str) -> st.SearchStrategy[str]:
    """One line of the format, its fields drawn from `FIELD` (so mostly malformed)."""
    if fmt == "movielens-dat":
        return st.lists(FIELD, min_size=1, max_size=5).map("::".join)
    if fmt in ("movielens-csv", "amazon-csv", "csv"):
        return st.lists(FIELD, min_size=1, max_size=5).map(",".join)
    if fmt == "user-item":
        return st.lists(FIELD, min_size=1, max_size=3).map(" ".join)
    if fmt == "amazon-json":
        return st.fixed_dictionaries(
            {}, optional={"reviewerID": FIELD, "asin": FIELD, "unixReviewTime": FIELD}
        ).map(lambda d: __import__("json").dumps(d))
    return st.fixed_dictionaries(  # steam: Python-literal dicts
        {}, optional={"username": FIELD, "product_id": FIELD, "date": FIELD}
    ).map(repr)


HEADERS = {"movielens-csv": "userId,movieId,rating,timestamp", "csv": "user,item,timestamp"}


@st.composite
def _file(draw: st.DrawFn, fmt: str) -> bytes:
    """A file of the format: a header where it has one, records, then perturbations: BOM, CRLF,
    duplicated lines, random bytes, another encoding, gzip."""
    kind = draw(st.sampled_from(["records", "valid-ish", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    lines = draw(st.lists(_record(fmt), min_size=0, max_size=12))
    if kind == "valid-ish" and fmt in ("movielens-dat", "user-item", "csv", "movielens-csv"):
        good = draw(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), max_size=12))
        sep = {"movielens-dat": "::", "user-item": " "}.get(fmt, ",")
        lines += [
            sep.join([str(u), str(i), *(["4", "100"] if fmt != "user-item" else [])])
            for u, i in good
        ]
    if fmt in HEADERS and draw(st.booleans()):
        lines.insert(0, HEADERS[fmt])
    if lines and draw(st.booleans()):
        lines += lines[: draw(st.integers(0, len(lines)))]  # duplicated lines
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = eol.join(lines) + draw(st.sampled_from(["", eol]))
    enc = draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16"]))
    data = text.encode(enc, errors="replace")
    if draw(st.booleans()):
        import gzip

        data = gzip.compress(data)
        if draw(st.booleans()):
            data = data[: len(data) // 2]  # truncated gzip
    return data


def _one_line_naming(err: SeqrecError, path: Path) -> None:
    message = str(err)
    assert "\n" not in message, message
    assert str(path) in message or path.name in message, message


@pytest.mark.parametrize("fmt", sorted(NAMES))
def test_every_reader_gives_a_table_or_one_line(fmt: str) -> None:
    @FUZZ
    @given(data=_file(fmt))
    def check(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / NAMES[fmt]
            path.write_bytes(data)
            try:
                df = read_interactions(path, fmt)
            except SeqrecError as err:
                _one_line_naming(err, path)
                return
            assert df.columns == ["user", "item", "timestamp", "line"] and df.height > 0
            assert df["timestamp"].dtype == pl.Int64 and df["line"].null_count() == 0
            assert df["user"].null_count() == 0 and df["item"].null_count() == 0

    check()


def test_every_format_is_fuzzed() -> None:
    assert set(NAMES) | {"parquet"} == set(FORMATS)


@FUZZ
@given(
    key=st.sampled_from(
        [
            "train.lr",
            "train.batch_size",
            "train.decay",
            "bert4rec.dropout",
            "train.time_budget",
            "cloze.pack",
            "eval.protocols",
            "train.bf16",
            "sasrec.block",
            "nonsense.key",
            "train",
            "train.nope",
            "model",
        ]
    ),
    value=st.one_of(
        NASTY,
        st.text(max_size=12),
        st.integers().map(str),
        st.floats(allow_nan=True).map(str),
        st.sampled_from(["true", "[1, 2]", '"auto"', "{a = 1}"]),
    ),
)
def test_set_values_give_a_config_or_one_line(key: str, value: str) -> None:
    try:
        load_config(RunConfig, None, [f"{key}={value}"])
    except SeqrecError as err:
        assert "\n" not in str(err), str(err)


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.lists(
            st.tuples(
                st.sampled_from(
                    [
                        "[train]",
                        "[bert4rec]",
                        "[x]",
                        "model",
                        "lr",
                        "max_len",
                        "dropout",
                        "[[a]]",
                        "decay",
                    ]
                ),
                st.sampled_from([" = ", "=", " "]),
                st.one_of(NASTY, st.integers().map(str), st.sampled_from(['"sasrec"', "0.1"])),
            ),
            max_size=8,
        ).map(lambda rows: "\n".join("".join(r) for r in rows)),
    )
)
def test_toml_configs_give_a_config_or_one_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(text, encoding="utf-8", errors="replace")
        try:
            load_config(RunConfig, path)
        except SeqrecError as err:
            assert "\n" not in str(err) and "c.toml" in str(err), str(err)


def test_recommend_input_logs_give_recommendations_or_one_line(
    tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from seqrec.cli import main

    items = [str(i) for i in range(1, 8)]
    line = st.lists(st.one_of(FIELD, st.sampled_from(items)), min_size=1, max_size=4).map(",".join)

    @FUZZ
    @given(
        header=st.sampled_from(["user,item", "user,item,timestamp", "a,b", ""]),
        lines=st.lists(line, max_size=10),
        eol=st.sampled_from(["\n", "\r\n"]),
        suffix=st.sampled_from([".csv", ".parquet"]),
    )
    def check(header: str, lines: list[str], eol: str, suffix: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            log, out = Path(tmp) / "log.csv", Path(tmp) / f"recs{suffix}"
            log.write_bytes(eol.join([header, *lines]).encode("utf-8", errors="replace"))
            capsys.readouterr()
            code = main(
                [
                    "recommend",
                    str(tiny_runs["sasrec"]),
                    "--input",
                    str(log),
                    "--output",
                    str(out),
                    "-k",
                    "3",
                    "--quiet",
                ]
            )
            err = capsys.readouterr().err.strip()
            if code == 0:
                assert out.exists()
                table = pl.read_parquet(out) if suffix == ".parquet" else pl.read_csv(out)
                assert table.height > 0
            else:
                assert code == 2 and len(err.splitlines()) == 1 and "log.csv" in err, err
                assert not out.exists()  # nothing half-written
            assert [p.name for p in Path(tmp).iterdir()] in (["log.csv"], ["log.csv", out.name])

    check()
