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
