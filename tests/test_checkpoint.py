"""The run directory refuses what it did not write: a checkpoint or weights file that carries a
pickled object (whose loading would run code) is refused with one line, and nothing in it runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from seqrec.checkpoint import load_run, load_tensors, read_checkpoint
from seqrec.errors import RunError


class _Payload:
    """Unpickling this runs a shell command that creates a file: the attack to refuse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_malicious_checkpoint_is_refused_and_nothing_runs(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy_run(tiny_runs["sasrec"], tmp_path / "run")
    marker = tmp_path / "pwned"
    state = load_tensors(run / "checkpoint.pt")
    state["best_state"] = _Payload(marker)
    torch.save(state, run / "checkpoint.pt")
    (run / "model.pt").unlink()  # load_run falls back to the checkpoint's best state
    with pytest.raises(RunError, match=r"checkpoint\.pt: refused"):
        read_checkpoint(run)
    with pytest.raises(RunError, match=r"checkpoint\.pt: refused"):
        load_run(run)
    assert not marker.exists()


def test_a_malicious_weights_file_is_refused(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    run = _copy_run(tiny_runs["bert4rec"], tmp_path / "run")
    marker = tmp_path / "pwned"
    torch.save({"weight": _Payload(marker)}, run / "model.pt")
    with pytest.raises(RunError, match=r"model\.pt: refused"):
        load_run(run)
    assert not marker.exists()


def test_the_checkpoint_a_run_writes_loads_tensors_only(tiny_runs: dict[str, Path]) -> None:
    state = read_checkpoint(tiny_runs["sasrec"])
    assert state is not None
    assert state["epoch"] == 2 and isinstance(state["optimizer"]["state"], dict)
    assert all(isinstance(v, torch.Tensor) for v in state["model"].values())
