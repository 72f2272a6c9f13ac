"""Bounded memory on any input (seqrec.data.io.ReadLimits): gzip bombs, endless and special
files, megabyte lines and fields end in one `DataError` line, under a memory cap, before the
input is read whole; and files of megabytes fuzzed the way the small ones are in test_fuzz."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqrec.data.io import read_interactions
from seqrec.data.reading import ReadLimits
from seqrec.errors import DataError, SeqrecError


@pytest.fixture
def capped_prepare(memory_cap: Callable[[], None]) -> Callable[..., tuple[int, str]]:
    """`seqrec prepare --data FILE` in a process whose address space is capped (conftest's
    memory_cap: 1 GiB over what importing seqrec takes); its exit status and stderr."""

    def run(data: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        return _capped_prepare(memory_cap, data, *flags, env=env)

    return run


def _capped_prepare(
    cap: Callable[[], None], data: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "seqrec", "prepare", "--data", str(data), "--quiet", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stderr.strip()


def _gzip_lines(path: Path, line: bytes, total: int) -> Path:
    """`total` bytes of `line` repeated, gzipped (a small file that decompresses hugely)."""
    block = line * ((1 << 20) // len(line))
    with gzip.open(path, "wb", compresslevel=6) as f:
        for _ in range(total // len(block)):
            f.write(block)
    return path


def _one_line(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    assert err.count("\n") == 0 and err.startswith("seqrec: error: "), err[:2000]
    for w in words:
        assert w in err, err


def test_a_gzip_bomb_stops_at_its_ratio_under_a_memory_cap(
    tmp_path: Path, capped_prepare: Callable[..., tuple[int, str]]
) -> None:
    bomb = _gzip_lines(tmp_path / "bomb.txt.gz", b"1 1\n", 1 << 30)  # 1 GiB of records
    assert bomb.stat().st_size < 2_000_000
    rc, err = capped_prepare(bomb)
    _one_line(rc, err, "bomb.txt.gz", "gzip bomb", "SEQREC_MAX_GZIP_RATIO")


def test_the_byte_budget_holds_when_the_ratio_is_lifted(
    tmp_path: Path, capped_prepare: Callable[..., tuple[int, str]]
) -> None:
    bomb = _gzip_lines(tmp_path / "bomb.txt.gz", b"1 1\n", 256 << 20)
    env = {"SEQREC_MAX_GZIP_RATIO": "1e9", "SEQREC_MAX_INPUT_BYTES": str(100 << 20)}
    rc, err = capped_prepare(bomb, env=env)
    _one_line(rc, err, "over 104,857,600 bytes", "SEQREC_MAX_INPUT_BYTES")
    plain = tmp_path / "big.txt"
    plain.write_bytes(b"1 1\n" * (1 << 20))  # 4 MiB, over a 1 MiB budget: refused unread
    rc, err = capped_prepare(plain, env={"SEQREC_MAX_INPUT_BYTES": str(1 << 20)})
    _one_line(rc, err, "4,194,304 bytes, over the 1,048,576")


def test_a_megabyte_line_stops_at_the_line_limit_under_a_memory_cap(
    tmp_path: Path, capped_prepare: Callable[..., tuple[int, str]]
) -> None:
    # 256 MiB of commas after a header in 0.26 MB: it once took polars 4.7 GB to refuse
    bomb = tmp_path / "log.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b"user,item,timestamp\n")
        for _ in range(256):
            f.write(b"," * (1 << 20))
    rc, err = capped_prepare(bomb)
    _one_line(rc, err, "log.csv.gz", "a line longer than 1,048,576 bytes")


def test_endless_and_special_files_are_refused_unread(
    tmp_path: Path, capped_prepare: Callable[..., tuple[int, str]]
) -> None:
    rc, err = capped_prepare(Path("/dev/zero"), "--format", "user-item")
    _one_line(rc, err, "/dev/zero", "not a regular file")
    fifo = tmp_path / "log.txt"
    os.mkfifo(fifo)  # opening it would block forever
    rc, err = capped_prepare(fifo)
    _one_line(rc, err, "log.txt", "not a regular file")


def test_wide_files_and_long_fields_are_one_short_line(tmp_path: Path) -> None:
    wide = tmp_path / "log.csv"
    wide.write_text(",".join(f"c{i}" for i in range(5000)) + "\n" + "1," * 4999 + "1\n")
    with pytest.raises(DataError, match="more than 1,000 fields in its first line"):
        read_interactions(wide)
    assert (
        read_interactions(
            wide, limits=ReadLimits(max_fields=10_000), time_col=None, user_col="c0", item_col="c1"
        ).height
        == 1
    )
    long = tmp_path / "ratings.dat"
    long.write_text("1::2::4::" + "9x" * 200_000 + "\n")  # a 400 KB timestamp
    with pytest.raises(DataError) as err:
        read_interactions(long)
    assert len(str(err.value)) < 300 and "is not an integer" in str(err.value)


def test_parquet_rows_are_checked_from_the_footer(tmp_path: Path) -> None:
    path = tmp_path / "log.parquet"
    pl.DataFrame({"user": [1, 2, 3], "item": [4, 5, 6], "timestamp": [7, 8, 9]}).write_parquet(path)
    assert read_interactions(path).height == 3
    with pytest.raises(DataError, match="3 rows, over the 2 a reader takes"):
        read_interactions(path, limits=ReadLimits(max_rows=2))
    with pytest.raises(DataError, match="missing column"):
        read_interactions(path, user_col="uid")


def test_limits_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQREC_MAX_LINE_BYTES", "12")
    monkeypatch.setenv("SEQREC_MAX_GZIP_RATIO", "2.5")
    assert ReadLimits.from_env() == ReadLimits(max_line_bytes=12, max_ratio=2.5)
    monkeypatch.setenv("SEQREC_MAX_ROWS", "lots")
    with pytest.raises(DataError, match=r"\$SEQREC_MAX_ROWS='lots': expected a number"):
        ReadLimits.from_env()


# ------------------------------------------------------------- fuzzing with files of megabytes

EXAMPLES = max(4, int(os.environ.get("SEQREC_FUZZ_EXAMPLES", "60")) // 6)
NAMES = {"movielens-dat": "ratings.dat", "user-item": "data.txt", "csv": "log.csv"}
GOOD = {
    "movielens-dat": b"%d::%d::4::%d\n",
    "user-item": b"%d %d\n",
    "csv": b"%d,%d,%d\n",
}


@st.composite
def _big_file(draw: st.DrawFn, fmt: str) -> bytes:
    """0.5-4 MB of valid records with a few hostile splices: random bytes, a long run of one
    byte (a long line or many fields), a cut; gzipped or not."""
    n = draw(st.integers(40_000, 300_000))
    rng_seed = draw(st.integers(0, 2**31))
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    users, items = rng.integers(1, 500, n), rng.integers(1, 300, n)
    line = GOOD[fmt]
    body = b"".join(
        line % ((u, i) if fmt == "user-item" else (u, i, t))
        for t, (u, i) in enumerate(zip(users.tolist(), items.tolist(), strict=True))
    )
    if fmt == "csv":
        body = b"user,item,timestamp\n" + body
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(body)))
        splice = draw(
            st.one_of(
                st.binary(min_size=1, max_size=64),
                st.tuples(
                    st.sampled_from([b",", b" ", b"x", b":", b"\x00"]), st.integers(1, 3 << 20)
                ).map(lambda t: t[0] * t[1]),
            )
        )
        body = body[:at] + splice + body[at:]
    if draw(st.booleans()):
        body = body[: draw(st.integers(1, len(body)))]
    if draw(st.booleans()):
        body = gzip.compress(body, compresslevel=1)
    return body


@pytest.mark.parametrize("fmt", sorted(NAMES))
def test_files_of_megabytes_give_a_table_or_one_line(fmt: str) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=_big_file(fmt))
    def check(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / NAMES[fmt]
            path.write_bytes(data)
            try:
                df = read_interactions(path, fmt)
            except SeqrecError as err:
                message = str(err)
                assert "\n" not in message and len(message) < 1000, message[:2000]
                assert path.name in message, message
                return
            assert df.columns == ["user", "item", "timestamp", "line"] and df.height > 0

    check()
