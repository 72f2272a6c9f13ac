"""A run carries its data settings: a run trained from Python on a Parquet file with its own
column names is evaluated, refit, asked for a user's top-k and served by the CLI on that file
with no column flags; flags that would change a run's settings are an error, not ignored."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from seqrec.cli import main
from seqrec.config import DataConfig, RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.data.synthetic import synthetic_interactions
from seqrec.training.fit import fit
from seqrec.training.rundir import RunDir


@pytest.fixture(scope="module")
def own_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the log, its prepared directory, the run) trained from Python with custom columns."""
    root = tmp_path_factory.mktemp("own")
    df = synthetic_interactions(n_users=70, n_items=40, min_len=6, max_len=20, seed=6)
    log = root / "events.parquet"
    df.select(
        pl.col("user").alias("uid"), pl.col("item").alias("iid"), pl.col("timestamp").alias("ts")
    ).write_parquet(log)
    ds = prepare(log, data_cfg=DataConfig(user_col="uid", item_col="iid", time_col="ts"))
    cfg = load_config(
        RunConfig,
        None,
        [
            'model="sasrec"',
            "sasrec.d_model=16",
            "sasrec.max_len=10",
            "train.max_epochs=2",
            "train.threads=1",
            'train.loss="ce"',
        ],
    )
    run = fit(ds, cfg, root / "run", progress=False).run_dir
    return log, ds.path, run


def test_the_run_records_the_settings_its_data_was_prepared_with(
    own_run: tuple[Path, Path, Path],
) -> None:
    log, _, run = own_run
    recorded = RunDir(run).config()
    assert (recorded.data.user_col, recorded.data.item_col, recorded.data.time_col) == (
        "uid",
        "iid",
        "ts",
    )
    assert RunDir(run).source()["data"] == str(log.resolve())


def test_evaluate_refit_and_recommend_on_the_run_need_no_flags(
    own_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, prepared, run = own_run
    want = RunDir(run).metrics()
    assert want is not None
    for data in ([], ["--data", str(log)], ["--data", str(prepared)]):  # the file, or prepared
        assert main(["evaluate", str(run), *data, "--json", "--quiet"]) == 0, data
        got = json.loads(capsys.readouterr().out)
        assert got["full"] == pytest.approx(want["test"]["full"]), data
    assert main(["refit", str(run), "--out", str(tmp_path / "refit"), "--quiet"]) == 0
    capsys.readouterr()
    user = str(pl.read_parquet(log)["uid"][0])
    assert main(["recommend", str(run), "--user", user, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["items"]) == 10


@pytest.mark.parametrize(
    "flags",
    [
        ["--set", "eval.batch_size=8"],
        ["--config", "ml-1m-sasrec"],
        ["--format", "csv"],
        ["--min-user-interactions", "3"],
    ],
)
def test_flags_that_would_change_a_runs_settings_are_an_error(
    flags: list[str], own_run: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, run = own_run
    commands = ["evaluate"] + (["attention"] if flags[0] != "--min-user-interactions" else [])
    for command in commands:
        assert main([command, str(run), *flags, "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and flags[0] in err and "is a run" in err, err


def test_recommend_input_reads_the_runs_own_log_with_no_flags(
    own_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, _, run = own_run
    out = tmp_path / "recs.csv"
    assert main(["recommend", str(run), "--input", str(log), "--output", str(out), "--quiet"]) == 0
    recs = pl.read_csv(out)
    users = pl.read_parquet(log)["uid"].n_unique()
    assert recs.height == 10 * users and set(recs.columns) >= {"user", "rank", "item", "score"}


def test_a_log_without_times_or_with_its_own_columns_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    df = synthetic_interactions(n_users=40, n_items=30, seed=11).sort("user", "timestamp")
    log = tmp_path / "log.csv"
    df.select(pl.col("user").alias("who"), pl.col("item").alias("what")).write_csv(log)
    argv = ["stats", "--data", str(log), "--json", "--quiet", "--user-col", "who"]
    assert main([*argv, "--item-col", "what", "--time-col", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == 40
    assert main([*argv, "--item-col", "what"]) == 2  # its default time column is not there
    assert "missing column(s) timestamp" in capsys.readouterr().err


def test_seqrec_serve_on_the_run_answers_for_a_known_user_of_that_file(
    own_run: tuple[Path, Path, Path],
) -> None:
    """`seqrec serve RUN` with no flags: a user of the Parquet log, asked for by id, gets the
    same top-k as `recommend --user` (their history comes with the run, not a flag)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("uvicorn")
    from seqrec.serving.recommender import Recommender

    log, _, run = own_run
    user = str(pl.read_parquet(log)["uid"][0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "seqrec", "serve", str(run), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # until /ready answers (the interpreter and torch start first)
            try:
                urllib.request.urlopen(url + "/ready", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        body = json.dumps({"user": user, "k": 5}).encode()
        req = urllib.request.Request(
            url + "/recommend", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            got = json.loads(r.read())
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    want = Recommender.from_run(run).recommend_user(user, k=5)
    assert [x["item"] for x in got["items"]] == [item for item, _ in want]
