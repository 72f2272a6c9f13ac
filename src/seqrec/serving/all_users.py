"""Every user's top-k to one file, in bounded memory: `seqrec recommend RUN --all-users --output
recs.parquet`, and the estimators' `recommend_all(path)`.

The users are those of the run's prepared data, each after everything the data holds of them
(training, validation and test items), as `Recommender.recommend_user` reads them. They are
scored `chunk` users at a time; each chunk's rows go to a part file in a temporary folder beside
the output, and the parts are then streamed into one file (polars' streaming engine: the whole
table is never in memory) that is renamed into place. A run that fails or is interrupted (an
exception, Ctrl-C, SIGTERM) leaves the output as it was (absent, or the previous file with
`--force`) and no part behind; the parts folder of a process killed outright (SIGKILL) is
named after it, and the next run for the same output removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.errors import ConfigError
from seqrec.progress import Progress
from seqrec.serving.files import recommendations_frame
from seqrec.serving.recommender import Recommender

__all__ = ["CHUNK_USERS", "write_all_users"]

# users scored and written per part: their rows (k each) are what memory holds at a time
CHUNK_USERS = 50_000


def write_all_users(
    rec: Recommender,
    path: str | Path,
    k: int = 10,
    exclude_seen: bool = True,
    *,
    candidates: Sequence[Any] | None = None,
    exclude: Sequence[Any] | None = None,
    chunk: int = CHUNK_USERS,
    progress: bool = True,
    at: int | None = None,
) -> int:
    """Write the top-k of every user of `rec`'s training data to `path` (.parquet or .csv): one
    row per (user, rank), the columns of `write_recommendations`, users in the data's order.
    `at`: the time the recommendations are for, seconds (default: when the call starts; read
    by a model of time). Returns the number of users."""
    p = Path(path)
    if p.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"{p}: the output must be a .parquet or .csv file")
    if rec.dataset is None:
        raise ConfigError("recommend --all-users needs the run's prepared data, which is gone")
    if not 1 <= k <= rec.n_items:
        raise ConfigError(f"-k: expected 1..{rec.n_items} (the catalogue), got {k}")
    if chunk < 1:
        raise ConfigError(f"chunk: expected >= 1 users, got {chunk}")
    ds = rec.dataset
    n = ds.n_users
    now = int(time.time()) if at is None else at
    p.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_parts(p)
    # named after this process: a later run can tell it from a live writer's
    parts = p.parent / f".{p.name}.parts.{os.getpid()}-{os.urandom(4).hex()}"
    parts.mkdir(mode=0o700)
    bar = Progress(n, "recommend all users", unit="user", enabled=progress)
    bar.note(f"recommend: the top {k} of {n:,} users -> {p}")
    try:
        with _terminate_as_exit():
            for i, lo in enumerate(range(0, n, chunk)):
                rows = range(lo, min(n, lo + chunk))
                recs = rec.recommend_encoded(
                    [ds.sequences[r] for r in rows],
                    k,
                    exclude_seen,
                    candidates=candidates,
                    exclude=exclude,
                    users=list(rows),
                    times=rec.user_times(rows),
                    at=now,
                )
                users = ds.user_ids[rows.start : rows.stop]
                frame = recommendations_frame(users, recs, rec)
                frame.write_parquet(parts / f"{i:08d}.parquet")
                bar.update(len(rows))
                bar.report(part=f"{i + 1} of {-(-n // chunk)}")  # a line a part off a terminal
            tmp = parts / f"all{p.suffix}"
            table = pl.scan_parquet(sorted(parts.glob("[0-9]*.parquet")))
            if p.suffix == ".parquet":
                table.sink_parquet(tmp)
            else:
                table.sink_csv(tmp)
            os.replace(tmp, p)  # created as any new file is: the umask's permissions
    finally:
        bar.close()
        shutil.rmtree(parts, ignore_errors=True)
    return n


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (a service manager stopping the job) raised as SystemExit while the parts are
    written, so that they are removed on the way out; only where the process had the default
    handler (an application's own is left alone) and on the main thread (signals go there)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _remove_stale_parts(p: Path) -> None:
    """The parts folders of earlier runs for `p` whose process is gone (killed outright): those
    named after a process that no longer runs, or made by a version that did not name them."""
    for folder in p.parent.glob(f".{p.name}.parts.*"):
        pid = folder.name.rsplit(".", 1)[-1].split("-", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue  # another process writing the same output now
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
