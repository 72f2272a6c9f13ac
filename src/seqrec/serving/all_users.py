"""Every user's top-k to one file, in bounded memory: `seqrec recommend RUN --all-users --output
recs.parquet`, and the estimators' `recommend_all(path)`.

The users are those of the run's prepared data, each after everything the data holds of them
(training, validation and test items), as `Recommender.recommend_user` reads them. They are
scored `chunk` users at a time; each chunk's rows go to a part file in a temporary folder beside
the output, and the parts are then streamed into one file (polars' streaming engine: the whole
table is never in memory) that is renamed into place. A run that fails or is interrupted leaves
the output as it was (absent, or the previous file with `--force`) and no part behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
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
    parts = Path(tempfile.mkdtemp(dir=p.parent, prefix=f".{p.name}.parts."))
    bar = Progress(n, "recommend all users", unit="user", enabled=progress)
    bar.note(f"recommend: the top {k} of {n:,} users -> {p}")
    try:
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
            recommendations_frame(users, recs, rec).write_parquet(parts / f"{i:08d}.parquet")
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
