"""Every benchmark program imports and answers --help, and every measurement module of
benchmarks/suite imports: a move that breaks one (a module renamed, an import path changed)
fails here, not on the day someone runs it."""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
PROGRAMS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
SUITE = sorted(p.stem for p in (BENCHMARKS / "suite").glob("*.py") if p.stem != "__init__")


@pytest.fixture()
def benchmarks_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.parametrize("program", [p for p in PROGRAMS if p != "claims.py"])
def test_every_program_answers_help(
    program: str,
    benchmarks_path: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / program), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(BENCHMARKS / program), run_name="__main__")
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert len(out.strip()) > 40, out  # its usage or its docstring


@pytest.mark.parametrize("module", SUITE)
def test_every_measurement_module_imports(module: str, benchmarks_path: None) -> None:
    loaded = importlib.import_module(f"suite.{module}")
    assert callable(getattr(loaded, "main", None)), module


def test_the_walk_sees_the_programs() -> None:
    assert {"peers.py", "speed.py", "sparse_logs.py", "recipes.py"} <= set(PROGRAMS)
    assert len(SUITE) > 20
