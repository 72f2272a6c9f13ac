"""Shared by the item-features tests: a planted log whose users each keep to one genre, its items
table, a small config that reads the table's features, and a JSON POST for the service tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec.config import RunConfig, load_config

__all__ = ["N_GENRES", "PER_GENRE", "feature_config", "planted_log", "post_json"]

N_GENRES, PER_GENRE = 4, 10


def planted_log(seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """40 items in 4 genres (item i: genre i % 4); each user picks from one genre; the items
    table names the genre and a title with it."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(160):
        g = u % N_GENRES
        pool = [i for i in range(1, N_GENRES * PER_GENRE + 1) if i % N_GENRES == g]
        for t, i in enumerate(rng.choice(pool, size=8, replace=False)):
            rows.append((u, int(i), t))
    log = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    items = pl.DataFrame(
        {
            "item": list(range(1, N_GENRES * PER_GENRE + 5)),
            "genre": [f"g{i % N_GENRES}" for i in range(1, N_GENRES * PER_GENRE + 5)],
            "title": [
                f"film {i} of kind {i % N_GENRES}" for i in range(1, N_GENRES * PER_GENRE + 5)
            ],
        }
    )
    return log, items


def feature_config(model: str, table: Path, *more: str) -> RunConfig:
    sizes = {
        "sasrec": ["sasrec.d_model=16", "sasrec.max_len=10"],
        "bert4rec": ["bert4rec.d_model=16", "bert4rec.max_len=10"],
        "lrurec": ["lrurec.d_model=16", "lrurec.max_len=10"],
        "gru4rec": ["gru4rec.d_model=16", "gru4rec.hidden=16", "gru4rec.max_len=10"],
    }[model]
    return load_config(
        RunConfig,
        None,
        [
            f"model={json.dumps(model)}",
            *sizes,
            f"items.table={json.dumps(str(table))}",
            'items.features=["genre", "title:text"]',
            "items.id_dropout=0.5",
            "train.max_epochs=3",
            "train.patience=0",
            "train.batch_size=32",
            "train.lr=1e-2",
            "train.threads=1",
            'train.device="cpu"',
            *more,
        ],
    )


def post_json(url: str, body: object, timeout: float = 60) -> tuple[int, Any]:
    """POST `body` as JSON: (status, the JSON answer), an HTTP error's too."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
