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

from seqrec.data.prepared import prepare_frame
from seqrec.data.synthetic import synthetic_interactions

# The training process: prepared data and config from argv; it prints "ready" once imported.
# Every file write is slowed down in its middle, so that kills land inside writes often.
WORKER = r"""
import sys, time
from pathlib import Path
from seqrec import provenance, rundir
from seqrec.config import RunConfig, load_config
from seqrec.data.prepared import load_prepared
from seqrec.train import fit

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
