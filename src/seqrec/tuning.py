"""Hyperparameter search from Python (`seqrec.search`): every point of a grid (or `n_trials`
of them, or draws from distributions) fitted on the same prepared data, the best chosen on
validation.

    result = seqrec.search(seqrec.SASRec(), {"d_model": [32, 64], "lr": [1e-3, 4e-3]}, df,
                           user_col="user_id", item_col="sku", time_col="ts")
    result.best_params, result.best_score      # chosen on the validation metric
    result.trials                               # a DataFrame: one row a point
    result.best_model.recommend(["user_17"])    # the fitted best

The data is prepared once, so a [data] setting cannot be searched (prepare per setting and
search each). Selection reads only the validation split; the test split of the best model is
`result.best_model.evaluate()`, measured once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from seqrec.data.frames import frame_kind
from seqrec.data.prepare import prepared
from seqrec.data.prepared import SAME_COLUMN
from seqrec.errors import ConfigError
from seqrec.estimator import Model

__all__ = ["SearchResult", "search"]

Params = Mapping[str, Any] | Sequence[Mapping[str, Any]]


@dataclass
class SearchResult:
    """What a search found: the best point, its validation score and fitted model, and every
    trial (`trials`: the point's parameters, the validation metric, epochs, why it stopped,
    seconds)."""

    best_params: dict[str, Any]
    best_score: float
    best_model: Model
    metric: str  # "valid <protocol> <metric>", what the points were compared on
    trials: pl.DataFrame


def search(
    model: Model,
    params: Params,
    data: Any,
    *,
    n_trials: int | None = None,
    seed: int = 0,
    user_col: str | None = None,
    item_col: str | None = None,
    time_col: str | None = SAME_COLUMN,
    progress: bool = True,
) -> SearchResult:
    """Fit a copy of `model` for each point of `params` on `data` and keep the one with the
    best validation metric (the recipe's `val_protocol` and `val_metric`).

    `params`: a dict of parameter -> values (a grid: every combination), a list of such dicts
    (their grids one after another), or a dict whose values are distributions (anything with
    scikit-learn's `rvs(random_state=)`, e.g. scipy.stats.loguniform) beside lists. `n_trials`:
    that many points, drawn with `seed` (without repetition from a grid); needed when a value
    is a distribution. Parameters are checked before anything is fitted."""
    points = _points(params, n_trials, seed)
    if not points:
        raise ConfigError("search: no points (an empty grid)")
    base = model.run_config()
    for point in points:  # every point's config checked before the first fit
        trial = _copy(model).set_params(**point)
        cfg = trial.run_config()
        if cfg.data != base.data or cfg.eval != base.eval:
            raise ConfigError(
                f"search: {point} changes the data or evaluation settings; the data is "
                "prepared once: search those by preparing each and searching per setting"
            )
    ds = prepared(data, base, progress, user_col=user_col, item_col=item_col, time_col=time_col)
    protocol, metric = base.train.val_protocol, base.train.val_metric
    rows, best, best_score, best_params = [], None, -np.inf, None
    for i, point in enumerate(points):
        if progress:
            print(f"search: point {i + 1} of {len(points)}: {point}", flush=True)
        trial = _copy(model).set_params(**point)
        started = time.perf_counter()
        trial.fit(ds, progress=progress)
        m = trial.metrics_ or {}
        score = float(m["valid"][protocol][metric])
        rows.append(
            {
                **{k: _cell(v) for k, v in point.items()},
                f"valid_{protocol}_{metric}": score,
                "epochs": m.get("epochs"),
                "stopped": m.get("stopped"),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        if score > best_score:
            best, best_score, best_params = trial, score, dict(point)
    assert best is not None and best_params is not None
    best.frame_ = frame_kind(data)  # answers as the data was given
    return SearchResult(
        best_params=best_params,
        best_score=best_score,
        best_model=best,
        metric=f"valid {protocol} {metric}",
        trials=pl.DataFrame(rows, strict=False),
    )


def _points(params: Params, n_trials: int | None, seed: int) -> list[dict[str, Any]]:
    """The points to fit: the grid (every combination, or `n_trials` of them), or `n_trials`
    draws where a value is a distribution."""
    grids = [params] if isinstance(params, Mapping) else list(params)
    if not grids or not all(isinstance(g, Mapping) for g in grids):
        raise ConfigError("search: params must be a dict of parameter -> values, or a list of them")
    if n_trials is not None and n_trials < 1:
        raise ConfigError(f"search: n_trials must be >= 1, got {n_trials}")
    rng = np.random.default_rng(seed)
    sampled = any(hasattr(v, "rvs") for g in grids for v in g.values())
    for g in grids:
        for key, values in g.items():
            if not hasattr(values, "rvs") and (
                isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values
            ):
                raise ConfigError(
                    f"search: {key}: expected a non-empty list of values or a distribution, "
                    f"got {values!r}"
                )
    if sampled:
        if n_trials is None:
            raise ConfigError("search: a distribution among the values needs n_trials")
        out = []
        for _ in range(n_trials):
            g = grids[int(rng.integers(len(grids)))]
            out.append({k: _draw(v, rng) for k, v in g.items()})
        return out
    grid = [
        dict(zip(g.keys(), combo, strict=True))
        for g in grids
        for combo in itertools.product(*g.values())
    ]
    if n_trials is None or n_trials >= len(grid):
        return grid
    return [grid[i] for i in sorted(rng.choice(len(grid), size=n_trials, replace=False))]


def _draw(values: Any, rng: np.random.Generator) -> Any:
    if hasattr(values, "rvs"):
        value = values.rvs(random_state=int(rng.integers(2**31)))
        return value.item() if hasattr(value, "item") else value
    return values[int(rng.integers(len(values)))]


def _copy(model: Model) -> Model:
    """An unfitted copy with the same parameters (scikit-learn's clone, without sklearn)."""
    return type(model)(**model.get_params())


def _cell(value: Any) -> Any:
    """A parameter's value as a table cell (a tuple or list as its text)."""
    return value if isinstance(value, int | float | str | bool) or value is None else repr(value)
