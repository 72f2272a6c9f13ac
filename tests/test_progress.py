"""Progress without a terminal: a piped `seqrec train` writes one plain line per epoch and one per
phase (preparing, the final evaluation), never a carriage-return redraw; on a terminal it is
tqdm's bar."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqrec.data.synthetic import synthetic_interactions
from seqrec.progress import Progress, interactive


def _log(tmp_path: Path) -> Path:
    df = synthetic_interactions(n_users=60, n_items=40, seed=8)
    p = tmp_path / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    p.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    return p


def test_a_piped_training_writes_a_line_per_epoch_and_no_redraws(tmp_path: Path) -> None:
    data, out = _log(tmp_path), tmp_path / "run"
    sets = ["sasrec.max_len=8", "sasrec.d_model=8", "train.max_epochs=6", "train.threads=1"]
    sets.append("train.batch_size=8")  # several batches an epoch: a line a batch would show
    argv = [sys.executable, "-m", "seqrec", "train", "sasrec", "--data", str(data)]
    argv += ["--out", str(out), *[x for s in sets for x in ("--set", s)]]
    env = {k: v for k, v in os.environ.items() if k != "SEQREC_PROGRESS"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = proc.stderr.splitlines()
    epochs = [line for line in lines if line.startswith("train sasrec: epoch ")]
    assert len(epochs) == 6, lines
    assert "loss " in epochs[0] and "seq_s " in epochs[0] and epochs[-1].endswith(" s")
    # each line's val is that epoch's own value (log.jsonl), the best so far beside it
    logged = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    key = next(k for k in logged[-1] if k.startswith("valid_"))
    best, at = -1.0, -1
    for printed, row in zip(epochs, logged, strict=True):
        value = row.get(key)
        if value is not None and value > best:
            best, at = value, row["epoch"]
            assert (row["best_valid"], row["best_epoch"]) == (best, at)
        shown = "-" if value is None else f"{value:.4f}"
        tail = "" if at < 0 else " (best)" if value == best else f" (best {best:.4f} @{at})"
        assert f", val {shown}{tail}, " in printed, (printed, row)
    assert len(lines) <= len(epochs) + 8, lines  # the epochs, and a line per phase
    assert any("evaluating epoch" in line for line in lines)
    assert any(line.startswith("prepare ratings: reading") for line in lines)
    # evaluating the run, piped: its phase lines, no bar frames
    ev = subprocess.run(
        [sys.executable, "-m", "seqrec", "evaluate", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert ev.returncode == 0 and "\r" not in ev.stderr
    assert ev.stderr.count("\n") <= 3 and "evaluate test: " in ev.stderr
    # recommendations for a file of histories, piped: no bar frames (they once went in)
    log = tmp_path / "log.csv"
    rows = synthetic_interactions(n_users=30, n_items=40, seed=9).select("user", "item")
    rows.write_csv(log)
    argv = [sys.executable, "-m", "seqrec", "recommend", str(out), "--input", str(log)]
    rec = subprocess.run(
        [*argv, "--output", str(tmp_path / "recs.csv"), "--unknown", "drop"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert rec.returncode == 0, rec.stderr
    assert "\r" not in rec.stderr and "recommend:" not in rec.stderr
    assert (tmp_path / "recs.csv").read_text().count("\n") == 30 * 10 + 1


def test_the_mode_follows_the_terminal_or_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SEQREC_PROGRESS", raising=False)
    assert interactive(io.StringIO()) is False  # not a terminal: lines
    monkeypatch.setenv("SEQREC_PROGRESS", "bar")
    assert interactive(io.StringIO()) is True
    monkeypatch.setenv("SEQREC_PROGRESS", "lines")
    bar = Progress(10, "work", unit="step")
    bar.update(4)
    bar.report(loss="0.5")
    bar.note("a phase")
    bar.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("work: loss 0.5; 4/10 step (40%), ") and err[1] == "a phase"
    silent = Progress(10, "work", enabled=False)
    silent.report(loss="0.5")
    silent.note("nothing")
    assert capsys.readouterr().err == ""


def test_a_notebook_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a Jupyter kernel (IPython's ZMQ shell) stderr is no terminal, yet a bar is shown
    (tqdm.auto's); an IPython terminal shell or plain Python writes lines."""
    import sys
    import types

    monkeypatch.delenv("SEQREC_PROGRESS", raising=False)

    class ZMQInteractiveShell:  # the class name Jupyter's kernel gives its shell
        pass

    class TerminalInteractiveShell:
        pass

    for shell, want in ((ZMQInteractiveShell, True), (TerminalInteractiveShell, False)):
        fake = types.ModuleType("IPython")
        fake.get_ipython = shell  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "IPython", fake)
        assert interactive(io.StringIO()) is want
    monkeypatch.delitem(sys.modules, "IPython")
    assert interactive(io.StringIO()) is False
