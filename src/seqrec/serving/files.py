"""Histories and recommendations in files (`seqrec recommend --input/--output`), the items'
metadata (titles, genres) shown beside their ids, and the data a run serves with beside its
model (`run_data`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from seqrec.data.candidates import item_popularity
from seqrec.data.ids import same_items
from seqrec.data.io import detect_format, read_interactions
from seqrec.data.prepared import PreparedDataset, load_prepared
from seqrec.errors import ConfigError, DataError
from seqrec.files import bound, read_checked
from seqrec.provenance import atomic_write
from seqrec.training.rundir import RunDir

if TYPE_CHECKING:
    from seqrec.serving.recommender import Recommender
    from seqrec.training.checkpoint import Run

__all__ = [
    "item_metadata",
    "ranked_table",
    "read_histories",
    "read_timed_histories",
    "recommendations_frame",
    "run_data",
    "write_recommendations",
]

ITEM_MAP = "ml-1m.item-map.txt"  # beside the papers' ML-1M file: `paper_id movielens_id`


def item_metadata(
    path: str | Path | None = None, data: str | None = None
) -> dict[str, dict[str, Any]] | None:
    """{str(external item id): {"title", "genres"}} from a MovieLens `movies.dat`: the file
    given, else one found beside the training data (official ML-1M: `movies.dat` in the same
    folder; the papers' file: `../ml-1m/movies.dat`). The papers' `user item` files number
    their items themselves (paper item 10 is MovieLens 2858): their titles are joined through
    the id map beside them (`ml-1m.item-map.txt`), and a given `movies.dat` that cannot be
    joined so is refused in one line rather than showing other films' titles."""
    src = Path(data) if data else None
    renumbered = src is not None and _is_user_item(src)
    mapping: dict[str, str] | None = None
    if renumbered and src is not None:
        id_map = src.parent / ITEM_MAP
        if id_map.exists():
            mapping = {}
            text = read_checked(id_map, bound("items")).decode()
            for line in text.split("\n"):
                if line.strip():
                    ours, movie = line.split()
                    mapping[movie] = ours
        elif path is not None:
            raise ConfigError(
                f"--items {path}: {src.name} numbers its items itself (a `user item` file), "
                f"and no {ITEM_MAP} beside it says which film each is; titles would be wrong"
            )
    if path is None and src is not None:
        if (src.parent / "movies.dat").exists():
            path = src.parent / "movies.dat"
        elif mapping is not None and (src.parent.parent / "ml-1m" / "movies.dat").exists():
            path = src.parent.parent / "ml-1m" / "movies.dat"
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: item metadata file not found")
    out: dict[str, dict[str, Any]] = {}
    text = read_checked(p, bound("items")).decode("latin-1")
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("::")
        if len(parts) != 3:
            raise ConfigError(f"{p}:{n}: expected MovieID::Title::Genres")
        movie, title, genres = parts
        key = mapping.get(movie) if mapping is not None else movie
        if key is not None:
            out[key] = {"title": title, "genres": genres.split("|")}
    return out


def _is_user_item(path: Path) -> bool:
    try:
        return detect_format(path) == "user-item"
    except DataError:
        return False


def read_histories(
    path: str | Path,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
) -> tuple[list[Any], list[list[str]]]:
    """A CSV/Parquet log -> (users, their histories oldest first). Without its time column
    (absent, or `time_col` None) the file order is the time order; ties keep file order (a
    stable sort)."""
    users, histories, _ = read_timed_histories(
        path, user_col=user_col, item_col=item_col, time_col=time_col
    )
    return users, histories


def read_timed_histories(
    path: str | Path,
    *,
    user_col: str = "user",
    item_col: str = "item",
    time_col: str | None = "timestamp",
) -> tuple[list[Any], list[list[str]], list[list[int]] | None]:
    """`read_histories`, and each history's times (seconds) where the file has its time
    column; None where it has none."""
    p = Path(path)
    if p.suffix == ".parquet":
        columns = list(pl.read_parquet_schema(p)) if p.exists() else []
    else:
        columns = []
        if p.exists():  # the header line only
            with p.open(errors="replace") as f:
                columns = f.readline().strip().split(",")
    if time_col not in columns:
        time_col = None
    fmt = "parquet" if p.suffix == ".parquet" else "csv"
    df = read_interactions(p, fmt, user_col=user_col, item_col=item_col, time_col=time_col)
    df = (
        df.sort(["timestamp", "line"])
        .group_by("user", maintain_order=True)
        .agg(pl.col("item"), pl.col("timestamp"))
    )
    times = None if time_col is None else df.get_column("timestamp").to_list()
    return df.get_column("user").to_list(), df.get_column("item").to_list(), times


def write_recommendations(
    path: str | Path,
    users: Sequence[Any],
    recs: Sequence[list[tuple[Any, float]]],
    rec: Recommender | None = None,
) -> Path:
    """One row per (user, rank): user, rank, item, score (+ title when known); .parquet or .csv,
    written to a temporary file and renamed."""
    p = Path(path)
    if p.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"{p}: the output must be a .parquet or .csv file")
    df = recommendations_frame(users, recs, rec)
    buf = io.BytesIO()
    if p.suffix == ".parquet":
        df.write_parquet(buf)
    else:
        df.write_csv(buf)
    atomic_write(p, lambda f: f.write(buf.getvalue()))
    return p


def recommendations_frame(
    users: Sequence[Any],
    recs: Sequence[list[tuple[Any, float]]],
    rec: Recommender | None = None,
) -> pl.DataFrame:
    """One row per (user, rank): user, rank, item, score (+ title when `rec` knows titles)."""
    rows = [
        (u, r, item, score)
        for u, rr in zip(users, recs, strict=True)
        for r, (item, score) in enumerate(rr, 1)
    ]
    # the ids keep their type: integer ids stay integers (the run's vocab holds them as such)
    integers = all(isinstance(row[2], int) and not isinstance(row[2], bool) for row in rows)
    item_type = pl.Int64 if integers else pl.String
    if not integers:
        rows = [(u, r, str(item), score) for u, r, item, score in rows]
    df = pl.DataFrame(
        rows,
        schema={"user": None, "rank": pl.Int64, "item": item_type, "score": pl.Float64},
        orient="row",
    )
    if rec is not None and rec.metadata is not None:
        titles = [(rec.describe(i) or {}).get("title") for i in df.get_column("item")]
        df = df.with_columns(pl.Series("title", titles, dtype=pl.String))
    return df


def ranked_table(
    key: str, keys: Sequence[Any], recs: list[list[tuple[Any, float]]]
) -> pl.DataFrame:
    """One row per (key, rank): `key` (each list's user or history), rank, item, score."""
    rows = [
        (u, rank, item, score)
        for u, rr in zip(keys, recs, strict=True)
        for rank, (item, score) in enumerate(rr, 1)
    ]
    return pl.DataFrame(rows, schema=[key, "rank", "item", "score"], orient="row")


def run_data(
    run: Run, *, trust: bool = False, metadata: str | Path | None = None
) -> tuple[PreparedDataset | None, np.ndarray, dict[str, dict[str, Any]] | None]:
    """What a loaded run serves with beside its model: its prepared data while it still exists
    and is this run's (for `recommend_user`), the training popularity (the run's vocab, else
    counted again from that data; one line when neither is left) and the item titles (the
    dataset's own, ML-1M's `movies.dat` beside it, or the file `metadata` names)."""
    prepared = run.source.get("prepared")
    dataset = load_prepared(prepared) if prepared and Path(prepared).exists() else None
    trained = run.item_ids[: len(dataset.item_ids)] if dataset is not None else []
    if dataset is not None and not same_items(dataset.item_ids, trained):
        dataset = None  # prepared again with other settings since: not this run's data
    elif dataset is not None:
        dataset.item_ids = trained  # the same ids: held once (ten million are 360 MB)
    vocab = RunDir(run.path, trust=trust).vocab()
    if "popularity" in vocab:
        popularity = np.asarray(vocab["popularity"], dtype=np.float32)
    elif dataset is not None:
        popularity = item_popularity(dataset.split.train).astype(np.float32)
    else:
        raise ConfigError(f"{run.path}: no popularity in its vocab and its prepared data is gone")
    # the raw file the data came from: the prepared manifest's, else the run's if a path
    data = run.source.get("data")
    if dataset is not None:
        data = dataset.manifest.get("key", {}).get("source", {}).get("path", data)
    raw = data if isinstance(data, str) and Path(data).is_file() else None
    return dataset, popularity, item_metadata(metadata, raw)
