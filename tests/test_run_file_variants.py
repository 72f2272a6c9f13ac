"""Every file a run directory can hold, tried in every damaged form: a symlink out of the run to an
endless device, a FIFO, a sparse giant, the file cut in half, and its first bytes forged with
the manifest rewritten to match. Each is one line naming the file, never a traceback, a hang or
an allocation of what the file claims; an item index, which only speeds a run up, leaves the
run serving exactly. The files come from `RUN_FILES` itself: a run file added without a line in
`READ_BY` fails the first test, so the day a file is added it is tried."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from seqrec.errors import SeqrecError
from seqrec.outputs import (
    CHECKPOINT,
    CODE_DIFF,
    CONFIG,
    DIGESTS,
    EVENTS,
    INDEX,
    ITEMS,
    LOCK,
    LOG,
    LOG_CSV,
    METRICS,
    PREVIOUS,
    RUN_FILES,
    RUN_OUTPUTS,
    VOCAB,
    WEIGHTS,
)
from seqrec.serving.recommender import Recommender
from seqrec.training.rundir import RunDir


def _serve(run: Path) -> Any:
    return Recommender.from_run(run)


# Each run file -> what reads it (a loader whose failure must be one line naming the file), or
# None with the reason nothing of seqrec's reads it back.
READ_BY: dict[str, Callable[[Path], Any] | None] = {
    CONFIG: _serve,
    VOCAB: _serve,
    DIGESTS: _serve,
    WEIGHTS: _serve,
    METRICS: _serve,
    ITEMS: _serve,
    INDEX: _serve,  # a damaged index: the run serves exactly, and says so on stderr
    CHECKPOINT: lambda run: RunDir(run).checkpoint(),  # --resume
    PREVIOUS: lambda run: RunDir(run).checkpoint(),
    LOG: lambda run: RunDir(run).log(),  # seqrec plot, report
    CODE_DIFF: lambda run: RunDir(run).code_diff(),  # seqrec report
    LOG_CSV: None,  # written for spreadsheets; seqrec reads log.jsonl
    EVENTS: None,  # a folder of TensorBoard's files, for TensorBoard
    LOCK: None,  # 256 bytes read at most (pid, start time, host), while taking the lock
    **dict.fromkeys(RUN_OUTPUTS),  # exports and pictures: for other programs
}
READ = sorted(name for name, loader in READ_BY.items() if loader is not None)
VARIANTS = ("symlink to /dev/zero", "fifo", "sparse giant", "cut short", "forged header")


def test_every_run_file_is_listed() -> None:
    assert set(READ_BY) == set(RUN_FILES)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run holding every file a loader reads: item features, an item index, a checkpoint and
    the one before it, a log and a code diff."""
    pytest.importorskip("faiss")
    from planted import feature_config, planted_log
    from seqrec.data.prepare import prepare
    from seqrec.serving.indexing import build_index
    from seqrec.training.fit import fit

    root = tmp_path_factory.mktemp("variants")
    log, items = planted_log()
    table = root / "items.csv"
    items.filter(pl.col("item") <= 40).write_csv(table)
    ds = prepare(log, out=root / "prepared", name="planted", progress=False)
    cfg = feature_config("sasrec", table, "train.max_epochs=2")
    fit(ds, cfg, root / "run", progress=False, keep_checkpoints=True)
    run = root / "run"
    build_index(Recommender.from_run(run, exact=True), sample=10)
    shutil.copy(run / CHECKPOINT, run / PREVIOUS)
    (run / CODE_DIFF).write_text("diff --git a/x b/x\n")
    digests = json.loads((run / DIGESTS).read_text())
    digests[PREVIOUS] = digests[CHECKPOINT]
    (run / DIGESTS).write_text(json.dumps(digests))
    for name in READ:
        assert (run / name).is_file(), name
    return run


def _damage(run: Path, name: str, variant: str) -> None:
    path = run / name
    data = path.read_bytes()
    path.unlink()
    if variant == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif variant == "fifo":
        os.mkfifo(path)  # opening it to read would block for ever
    elif variant == "sparse giant":
        with path.open("wb") as f:
            f.truncate(65 << 30)  # past every bound; no disk used
    elif variant == "cut short":
        path.write_bytes(data[: len(data) * 2 // 5])  # mid-record, wherever the records end
    else:  # forged: the first bytes garbage, and the manifest rewritten to match
        forged = b"\x00garbage{[" * 8 + data[80:]
        path.write_bytes(forged)
        if name != DIGESTS:
            digests = json.loads((run / DIGESTS).read_text())
            digests[name] = hashlib.sha256(forged).hexdigest()
            (run / DIGESTS).write_text(json.dumps(digests))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", READ)
def test_every_damaged_run_file_is_one_line_naming_it(
    name: str,
    variant: str,
    full_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    shutil.copytree(full_run, run, symlinks=True)
    _damage(run, name, variant)
    loader = READ_BY[name]
    assert loader is not None
    if name in (CHECKPOINT, PREVIOUS):  # each falls back on the other: tried alone
        (run / (PREVIOUS if name == CHECKPOINT else CHECKPOINT)).unlink()
    if name == CODE_DIFF and variant in ("cut short", "forged header"):
        assert isinstance(loader(run), str)  # text shown as it is, whatever it holds
        return
    if name == INDEX:  # the run serves, every item scored, and one line says why
        rec = loader(run)
        assert rec.index is None and rec.recommend([1, 5, 9], k=3)
        message = capsys.readouterr().err.strip()
    else:
        with pytest.raises(SeqrecError) as err:
            loader(run)
        message = str(err.value)
    assert name in message, message
    assert "\n" not in message and "Traceback" not in message and len(message) < 1000, message
