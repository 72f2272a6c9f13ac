"""Every user's top-k streamed to one file (`seqrec recommend RUN --all-users`): the same answers
as one user at a time, across part boundaries; the output whole or untouched, no part left."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from seqrec.cli import main
from seqrec.errors import ConfigError
from seqrec.serving.all_users import write_all_users
from seqrec.serving.recommender import Recommender


def test_every_user_in_parts_is_what_recommend_user_gives(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    # caser has a per-user term: each part must hand the model its users' own rows
    rec = Recommender.from_run(tiny_runs["caser"])
    assert rec.dataset is not None
    out = tmp_path / "recs.parquet"
    assert write_all_users(rec, out, k=5, chunk=7, progress=False) == 120  # 18 parts
    table = pl.read_parquet(out)
    assert table.columns == ["user", "rank", "item", "score", "title"]
    assert table.height == 120 * 5
    users = list(rec.dataset.user_ids)
    assert table.get_column("user").unique(maintain_order=True).to_list() == users
    for user in (users[0], users[6], users[7], users[-1]):  # either side of a part boundary
        mine = table.filter(pl.col("user") == user)
        want = rec.recommend_user(user, 5)
        assert mine.get_column("rank").to_list() == [1, 2, 3, 4, 5]
        assert mine.get_column("item").to_list() == [item for item, _ in want]
        # scored in a batch of 7 rather than alone: the same to float rounding
        assert mine.get_column("score").to_list() == pytest.approx([s for _, s in want], abs=1e-5)
        assert mine.get_column("title").to_list()[0] == f"Movie {want[0][0]} (2000)"
    assert [p.name for p in tmp_path.iterdir()] == ["recs.parquet"]  # no part folder left
    as_csv = tmp_path / "recs.csv"
    write_all_users(rec, as_csv, k=5, chunk=50, progress=False)
    assert pl.read_csv(as_csv).drop("score").equals(table.drop("score"))


def test_a_failure_leaves_the_output_as_it_was(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recommender.from_run(tiny_runs["sasrec"])
    out = tmp_path / "recs.parquet"
    out.write_bytes(b"the previous file")
    calls = []
    real = rec.recommend_encoded

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return real(*args, **kwargs)

    monkeypatch.setattr(rec, "recommend_encoded", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        write_all_users(rec, out, k=3, chunk=10, progress=False)
    assert out.read_bytes() == b"the previous file"
    assert [p.name for p in tmp_path.iterdir()] == ["recs.parquet"]
    with pytest.raises(ConfigError, match="the output must be a .parquet or .csv file"):
        write_all_users(rec, tmp_path / "recs.json", progress=False)
    with pytest.raises(ConfigError, match=r"-k: expected 1\.\.60"):
        write_all_users(rec, out, k=0, progress=False)


def test_all_users_on_the_command_line(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, out = str(tiny_runs["gru4rec"]), tmp_path / "all.csv"
    assert main(["recommend", run, "--all-users", "--output", str(out), "-k", "3", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == f"120 users -> {out}"
    table = pl.read_csv(out)
    assert table.height == 360 and table.get_column("rank").max() == 3
    for argv, message in (
        (["--all-users"], "recommend --all-users needs --output"),
        (["--all-users", "--user", "3", "--output", str(tmp_path / "x.csv")], "exactly one of"),
        (["--all-users", "--output", str(out)], "exists; --force replaces it"),
        (["--all-users", "--output", str(tmp_path / "x.txt")], "must be a .parquet or .csv"),
    ):
        assert main(["recommend", run, *argv, "--quiet"]) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    assert pl.read_csv(out).equals(table)  # the refused run left it as it was


def test_sigterm_removes_the_parts_and_stale_parts_are_removed_first(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal

    rec = Recommender.from_run(tiny_runs["sasrec"])
    out = tmp_path / "recs.parquet"
    real = rec.recommend_encoded
    calls = []

    def terminated(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:  # a part written, the next one under way
            assert len(list(tmp_path.glob(".recs.parquet.parts.*/*.parquet"))) == 1
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(rec, "recommend_encoded", terminated)
    with pytest.raises(SystemExit) as stopped:
        write_all_users(rec, out, k=3, chunk=10, progress=False)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []  # no output, no parts
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler given back
    # folders a SIGKILL left: a dead process's and an unnamed one are removed; a live writer's
    # (this process's pid) is left alone
    dead = tmp_path / ".recs.parquet.parts.999999999-0a0b"
    unnamed = tmp_path / ".recs.parquet.parts.k2x9q_1"
    live = tmp_path / f".recs.parquet.parts.{os.getpid()}-beef"
    for folder in (dead, unnamed, live):
        folder.mkdir()
        (folder / "00000000.parquet").write_bytes(b"part")
    monkeypatch.setattr(rec, "recommend_encoded", real)
    write_all_users(rec, out, k=3, chunk=10, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, live.name])
