"""Learning curves where people look: a run's log.csv (a row an epoch, the validation metric
where validated) and `seqrec plot RUN [RUN ...]` drawing validation curves to a PNG."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from seqrec.cli import main


def test_the_csv_log_has_a_row_per_epoch_with_its_validation(tiny_runs: dict[str, Path]) -> None:
    run = tiny_runs["sasrec"]
    jsonl = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    csv = pl.read_csv(run / "log.csv")
    assert csv.height == len(jsonl) == 3
    assert csv["epoch"].to_list() == [0, 1, 2]
    key = next(k for k in jsonl[0] if k.startswith("valid_"))
    assert csv[key].to_list() == pytest.approx([x[key] for x in jsonl])


def test_plot_draws_the_curves_of_several_runs(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_runs["sasrec"], a)
    shutil.copytree(tiny_runs["bert4rec"], b)
    out = tmp_path / "curves.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert main(["plot", str(a)]) == 0 and (a / "curves.png").exists()  # default: in the run
    assert main(["plot", str(a), "--out", str(out)]) == 2  # exists: --force replaces it
    assert "--force" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_tensorboard_events_are_read_back_by_tensorboards_own_reader(tmp_path: Path) -> None:
    """train.tensorboard = true: the run's tensorboard/ folder holds the log's numbers, by epoch,
    as TensorBoard reads them (its EventAccumulator), the validation metric at the epochs that
    were validated."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from seqrec.data.synthetic import synthetic_interactions

    df = synthetic_interactions(n_users=40, n_items=25, seed=3)
    data = tmp_path / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    data.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    sets = ["sasrec.max_len=8", "sasrec.d_model=8", "train.max_epochs=4", "train.eval_every=2"]
    sets += ["train.threads=1", "train.tensorboard=true"]
    run = tmp_path / "run"
    argv = ["train", "sasrec", "--data", str(data), "--out", str(run), "--quiet"]
    assert main([*argv, *(x for s in sets for x in ("--set", s))]) == 0
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/seq_per_s", "valid/full_ndcg@10"} <= set(scalars)
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([x["loss"] for x in log], rel=1e-6)
    valid = events.Scalars("valid/full_ndcg@10")
    assert [e.step for e in valid] == [1, 3]  # every second epoch
    assert [e.value for e in valid] == pytest.approx(
        [x["valid_full_ndcg@10"] for x in log if "valid_full_ndcg@10" in x], rel=1e-6
    )
    csv = pl.read_csv(run / "log.csv")  # the CSV: a row an epoch, the metric where validated
    assert csv["valid_full_ndcg@10"].is_not_null().to_list() == [False, True, False, True]


def test_tensorboard_without_its_package_is_one_line_before_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name)
    )
    data = tmp_path / "ratings.dat"
    data.write_text("".join(f"{u}::{i}::4::{i}\n" for u in range(1, 6) for i in range(1, 8)))
    run = tmp_path / "run"
    argv = ["train", "sasrec", "--data", str(data), "--out", str(run), "--quiet"]
    assert main([*argv, "--set", "train.tensorboard=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "seqrec[tensorboard]" in err and "\n" not in err
    assert not run.exists()
