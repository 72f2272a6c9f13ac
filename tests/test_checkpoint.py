"""The run directory refuses what it did not write and survives what can go wrong while it is
written: a pickled object in a weight file (whose loading would run code), a damaged, truncated
or swapped weight file, a second training on the same directory, a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqrec.errors import RunError
from seqrec.training import lock, rundir
from seqrec.training.checkpoint import load_run
from seqrec.training.manifest import load_tensors
from seqrec.training.rundir import RunDir


class _Payload:
    """Unpickling this runs a shell command that creates a file: the attack to refuse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _record(run: Path, name: str) -> None:
    """What an attacker who can write the directory would also do: record the file's digest."""
    digests = json.loads((run / "sha256.json").read_text())
    digests[name] = hashlib.sha256((run / name).read_bytes()).hexdigest()
    (run / "sha256.json").write_text(json.dumps(digests))


def test_a_malicious_checkpoint_is_refused_and_nothing_runs(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy_run(tiny_runs["sasrec"], tmp_path / "run")
    marker = tmp_path / "pwned"
    state = load_tensors(run / "checkpoint.pt")
    state["best_state"] = _Payload(marker)
    torch.save(state, run / "checkpoint.pt")
    (run / "checkpoint.prev.pt").unlink()
    (run / "model.pt").unlink()  # load_run falls back to the checkpoint's best state
    with pytest.raises(RunError, match=r"checkpoint\.pt: its sha256 is not one this run recorded"):
        RunDir(run).checkpoint()
    _record(run, "checkpoint.pt")  # the digest check passed: the restricted unpickler refuses
    with pytest.raises(RunError, match=r"checkpoint\.pt: refused"):
        RunDir(run).checkpoint()
    with pytest.raises(RunError, match=r"checkpoint\.pt: refused"):
        load_run(run)
    assert not marker.exists()


def test_a_malicious_weights_file_is_refused(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    run = _copy_run(tiny_runs["bert4rec"], tmp_path / "run")
    marker = tmp_path / "pwned"
    torch.save({"weight": _Payload(marker)}, run / "model.pt")
    with pytest.raises(RunError, match=r"model\.pt: its sha256 is not one"):
        load_run(run)
    _record(run, "model.pt")
    with pytest.raises(RunError, match=r"model\.pt: refused"):
        load_run(run)
    assert not marker.exists()


def test_the_checkpoint_a_run_writes_loads_tensors_only(tiny_runs: dict[str, Path]) -> None:
    state = RunDir(tiny_runs["sasrec"]).checkpoint()
    assert state is not None
    assert state["epoch"] == 2 and isinstance(state["optimizer"]["state"], dict)
    assert all(isinstance(v, torch.Tensor) for v in state["model"].values())
    digests = json.loads((tiny_runs["sasrec"] / "sha256.json").read_text())
    # every file a loader reads, each by name (the JSON files too: an edited config is refused)
    assert set(digests) == {
        "checkpoint.pt",
        "checkpoint.prev.pt",
        "model.pt",
        "config.json",
        "vocab.json",
        "metrics.json",
    }


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap"])
def test_damaged_weights_are_one_line_errors(
    tiny_runs: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    run = _copy_run(tiny_runs["bert4rec"], tmp_path / "run")
    weights = run / "model.pt"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:  # another run's weights of the same shape
        other = tiny_runs["bert4rec"] / "checkpoint.prev.pt"
        torch.save(load_tensors(other)["model"], weights)
    with pytest.raises(RunError, match=r"model\.pt: its sha256 is not one this run recorded"):
        load_run(run)


def test_resume_falls_back_to_the_previous_checkpoint(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy_run(tiny_runs["sasrec"], tmp_path / "run")
    (run / "checkpoint.pt").write_bytes(b"half a checkpoint")
    state = RunDir(run).checkpoint()
    assert state is not None and state["epoch"] == 1  # the epoch before the damaged one
    assert "checkpoint.pt: its sha256 is not one" in capsys.readouterr().err
    (run / "checkpoint.prev.pt").write_bytes(b"also damaged")
    with pytest.raises(RunError, match="checkpoint"):
        RunDir(run).checkpoint()


def test_a_second_training_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with (
        RunDir(run).lock(),
        pytest.raises(RunError, match=r"in use by another writer \(pid \d+ on "),
        RunDir(run).lock(),
    ):
        pass
    assert not (run / ".lock").exists()
    # a lock left by a process that is gone is taken over
    run.mkdir(exist_ok=True)
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    (run / ".lock").write_text(f"{dead} {os.uname().nodename}")
    with RunDir(run).lock():
        assert (run / ".lock").read_text().startswith(str(os.getpid()))


def test_a_full_disk_keeps_the_last_good_checkpoint(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy_run(tiny_runs["sasrec"], tmp_path / "run")
    before = RunDir(run).checkpoint()
    assert before is not None

    def full(path: Path, write: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(rundir, "atomic_write", full)
    with pytest.raises(RunError, match=r"checkpoint\.pt: could not be written \(No space left"):
        RunDir(run).save_checkpoint({"epoch": 99})
    monkeypatch.undo()
    after = RunDir(run).checkpoint()
    assert after is not None and after["epoch"] == before["epoch"]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


_RACER = """
import os, sys, time
from pathlib import Path
from seqrec.training.rundir import RunDir
from seqrec.errors import RunError
run, marker, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
held = twice = 0
for _ in range(rounds):
    try:
        with RunDir(run).lock():
            try:  # a second holder would find the marker there
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                twice += 1
                continue
            held += 1
            time.sleep(0.0005)
            os.close(fd)
            os.unlink(marker)
    except RunError:
        pass
print(held, twice)
"""


def test_the_lock_is_exclusive_when_two_processes_race_400_times(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "holder"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(run), str(marker), "400"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append([int(x) for x in out.split()])
    assert sum(twice for _, twice in results) == 0  # never two holders at once
    assert all(held > 0 for held, _ in results)  # and each process held it at times


def test_a_stale_lock_is_taken_over_and_another_hosts_needs_break_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # a live pid with another start time: a reused pid, not the holder
    (run / ".lock").write_text(f"{os.getpid()} 1 {socket.gethostname()}")
    with RunDir(run).lock():
        mine = (run / ".lock").read_text().split()
        assert mine[0] == str(os.getpid()) and mine[1] != "1"
    # the same pid with its real start time and no flock (an older seqrec's lock): held
    (run / ".lock").write_text(
        f"{os.getpid()} {lock._start_time(os.getpid())} {socket.gethostname()}"
    )
    with pytest.raises(RunError, match="in use by another writer"), RunDir(run).lock():
        pass
    # another host's lock: seqrec cannot tell, so it says how to take it
    (run / ".lock").write_text("4242 123 elsewhere.example")
    with (
        pytest.raises(RunError, match=r"pid 4242 on elsewhere\.example\).*--break-lock"),
        RunDir(run).lock(),
    ):
        pass
    with RunDir(run).lock(break_lock=True):
        assert (run / ".lock").read_text().split()[-1] == socket.gethostname()
