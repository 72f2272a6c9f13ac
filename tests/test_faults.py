"""Fault injection: a training killed with SIGKILL at random moments, many of them in the middle
of writing its checkpoint, resumes every time, and the finished run equals an uninterrupted one
bit for bit (its schedule counts epochs, and every epoch's randomness comes from the seed)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from seqrec.data.prepare import prepare_frame
from seqrec.data.synthetic import synthetic_interactions

# The training process: prepared data and config from argv; it prints "ready" once imported.
# Every file write is slowed down in its middle, so that kills land inside writes often.
WORKER = r"""
import sys, time
from pathlib import Path
from seqrec import provenance
from seqrec.training import rundir
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import load_prepared
from seqrec.training.fit import fit

real = provenance.atomic_write

def slow_write(path, write):
    def halves(f):
        class Slow:
            def write(self, data):
                f.write(data[: len(data) // 2]); f.flush(); time.sleep(0.02)
                return f.write(data[len(data) // 2 :])
        write(Slow())
    real(path, halves)

rundir.atomic_write = slow_write
prepared, out, resume = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
cfg = load_config(RunConfig, None, sys.argv[4:])
ds = load_prepared(prepared)
print("ready", flush=True)
fit(ds, cfg, out, resume=resume, progress=False)
print("finished", flush=True)
"""

SETTINGS = [
    "bert4rec.max_len=12",
    "bert4rec.d_model=16",
    "bert4rec.attn_dropout=0.0",
    "train.max_epochs=40",
    "train.batch_size=32",
    "train.lr=5e-3",
    "train.eval_every=1",
    "train.patience=0",
    "train.threads=1",
]


def _start(prepared: Path, out: Path, resume: bool) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", WORKER, str(prepared), str(out), "1" if resume else "0"]
    return subprocess.Popen(cmd + SETTINGS, stdout=subprocess.PIPE, text=True)


def _epochs_logged(out: Path) -> int:
    try:
        return len((out / "log.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    df = synthetic_interactions(n_users=150, n_items=30, min_len=6, max_len=14, seed=5)
    prepared = prepare_frame(df, tmp_path / "prepared", name="toy").path
    ref = _start(prepared, tmp_path / "ref", resume=False)
    assert ref.wait(timeout=300) == 0
    # one epoch's wall clock (training, validating, writing) on this machine: a kill waits less,
    # so that each life ends inside the epoch after the one it logged, however fast the machine
    ref_log = [json.loads(x) for x in (tmp_path / "ref" / "log.jsonl").read_text().splitlines()]
    epoch_wall = (ref_log[-1]["elapsed_s"] - ref_log[0]["elapsed_s"]) / (len(ref_log) - 1)
    rng = np.random.default_rng(0)
    out, kills, mid_write, finished = tmp_path / "killed", 0, 0, False
    killed_after_finish = False
    for _ in range(100):
        proc = _start(prepared, out, resume=(out / "config.json").exists())
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # let this life log one more epoch (so every life makes progress), then kill it at a
        # random moment of the next one: training, validating or writing its files
        start = _epochs_logged(out)
        while _epochs_logged(out) <= start and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(float(rng.uniform(0.0, min(0.15, epoch_wall))))
        if proc.poll() is not None:  # finished before the kill
            assert proc.wait() == 0
            finished = True
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if (out / "metrics.json").exists():  # killed after the run had finished its last write
            finished = killed_after_finish = True
            break
        leftovers = [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".lock"]
        mid_write += bool(leftovers)  # killed inside a write: its temporary file remains
    assert finished and kills >= 20, kills
    assert mid_write >= 3, mid_write
    want = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    got = json.loads((out / "metrics.json").read_text())
    assert got["test"] == want["test"] and got["valid"] == want["valid"]
    assert got["best_epoch"] == want["best_epoch"] and got["steps"] == want["steps"]
    assert (out / "model.pt").read_bytes() == (tmp_path / "ref" / "model.pt").read_bytes()
    if not killed_after_finish:  # else its lock is a dead process's, taken over by the next user
        assert not (out / ".lock").exists()
        assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no leftovers at the end


# The same training, killed (SIGKILL, by itself) halfway through its `kill_at`-th file write:
# every write goes through atomic_write (rundir's, and write_json's in provenance), numbered
# from 0 in the order the run makes them; -1 kills none and prints each write's file name.
EACH_WRITE = r"""
import os, signal, sys
from pathlib import Path
from seqrec import provenance
from seqrec.training import rundir
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import load_prepared
from seqrec.training.fit import fit

real, count = provenance.atomic_write, [0]
prepared, out, resume = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
kill_at = int(sys.argv[4])

def killing_write(path, write):
    n = count[0]
    count[0] += 1
    if kill_at < 0:
        print("write", Path(path).name, flush=True)

    def halves(f):
        class Half:
            def write(self, data):
                f.write(data[: len(data) // 2])
                f.flush()
                if n == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return f.write(data[len(data) // 2 :])
        write(Half())
    real(path, halves)

rundir.atomic_write = provenance.atomic_write = killing_write
cfg = load_config(RunConfig, None, sys.argv[5:])
fit(load_prepared(prepared), cfg, out, resume=resume, progress=False)
"""


def _life(
    prepared: Path, out: Path, resume: bool, kill_at: int
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", EACH_WRITE, str(prepared), str(out), str(int(resume))]
    settings = [s for s in SETTINGS if not s.startswith("train.max_epochs")]
    return subprocess.run(
        [*cmd, str(kill_at), *settings, "train.max_epochs=3"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_sigkill_inside_each_write_window_then_resume_gives_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """Not a random moment: the process killed halfway through the first write of each run file
    (the manifest, the config, the vocab, the checkpoint, the log, the weights, the metrics), and
    through the second checkpoint's (the one that moves the first to checkpoint.prev.pt). After
    each kill the run is resumed (or, when it had not started, started again) and must end
    bit-identical to an uninterrupted one."""
    df = synthetic_interactions(n_users=60, n_items=30, min_len=6, max_len=14, seed=5)
    prepared = prepare_frame(df, tmp_path / "prepared", name="toy").path
    ref = _life(prepared, tmp_path / "ref", resume=False, kill_at=-1)
    assert ref.returncode == 0, ref.stderr[-2000:]
    names = [line.split()[1] for line in ref.stdout.splitlines() if line.startswith("write ")]
    firsts: dict[str, int] = {}
    for i, name in enumerate(names):
        firsts.setdefault(name.lstrip("."), i)
    windows = sorted({*firsts.values(), [i for i, n in enumerate(names) if "checkpoint" in n][1]})
    assert {"config.json", "vocab.json", "sha256.json", "log.jsonl", "metrics.json"} <= set(firsts)
    assert any(n.startswith("checkpoint.pt") for n in firsts)
    assert any(n.startswith("model.pt") for n in firsts)
    want = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    for i in windows:
        out = tmp_path / f"killed-{i}"
        dead = _life(prepared, out, resume=False, kill_at=i)
        assert dead.returncode == -signal.SIGKILL, (names[i], dead.stderr[-2000:])
        again = _life(prepared, out, resume=(out / "config.json").exists(), kill_at=10**9)
        assert again.returncode == 0, (names[i], again.stderr[-2000:])
        got = json.loads((out / "metrics.json").read_text())
        assert got["test"] == want["test"] and got["valid"] == want["valid"], names[i]
        assert (out / "model.pt").read_bytes() == (tmp_path / "ref" / "model.pt").read_bytes()
        assert not [p for p in out.iterdir() if p.name.startswith(".")], names[i]


@pytest.mark.slow
def test_a_run_read_while_it_trains_loads_or_is_one_line(tmp_path: Path) -> None:
    """`seqrec evaluate` / `recommend` on a run that is training: every look at it, at any moment
    of its writes, loads a consistent model or says in one line why not (no weights yet, a file
    being replaced) - never a traceback."""
    from seqrec.errors import SeqrecError
    from seqrec.training.checkpoint import load_run

    df = synthetic_interactions(n_users=150, n_items=30, min_len=6, max_len=14, seed=5)
    prepared = prepare_frame(df, tmp_path / "prepared", name="toy").path
    out = tmp_path / "run"
    proc = _start(prepared, out, resume=False)
    loaded, refused, reasons = 0, 0, set()
    try:
        while proc.poll() is None:
            try:
                run = load_run(out)
                assert run.model is not None
                loaded += 1
            except SeqrecError as err:
                assert "\n" not in str(err), str(err)
                refused += 1
                reasons.add(str(err).split(": ", 1)[-1][:40])
    finally:
        proc.kill()
        proc.wait()
    assert loaded >= 10, (loaded, refused, reasons)
