"""Declarative sweeps (`seqrec experiment SPEC --data DATA`): a base config, a list of points (an
axis and its values, or labelled points each with its overrides), a budget per point and seeds.
Each point is trained as its own run directory; a finished point is reused after checking its
config, an interrupted one resumes, and the results (JSON, Markdown, PNG) are rewritten after
every point, so a sweep stopped anywhere keeps what it has and continues where it stopped.

A spec (TOML; a path or a shipped name from `seqrec/experiments/`):

    title = "BERT4Rec Table 4: maximum length N, ML-1M"
    base = "ml-1m-bert4rec"          # a shipped config name or a path
    # set = ["bert4rec.dropout=0.0"] # (optional: overrides of the base, for every point that
    #                                #  has no base of its own)
    budget = "5m"                    # per point (optional: the base config's own stopping rule)
    # epochs = 30                    # ... or the same number of epochs for every point, no clock
    seeds = [0]
    metric = "test.pop100.ndcg@10"   # what the table and the figure show
    axis = "bert4rec.max_len"        # either an axis and its values ...
    values = [10, 50, 100, 200, 400]
    # [[series]]                     # ... or one line per model over the same values:
    # label = "SASRec"               # its points are "SASRec 16", "SASRec 32", ...
    # base = "ml-1m-sasrec"
    # axis = "sasrec.d_model"        # (a list of keys sets each to the value)
    # values = [16, 32]              # (optional: this line's own values)
    # set = ["train.lr=1e-3"]        # (optional: overrides for every point of the line)
    # [[points]]                     # ... or labelled points, each with its overrides
    # label = "1 mask"               # and, optionally, its own base config and budget
    # set = ["cloze.max_predictions=1"]
    # [grid]                         # ... or a search: every combination of these values
    # "train.lr" = [1e-3, 2e-3]      #     (points "lr=0.001 d_model=32", ...)
    # "sasrec.d_model" = [32, 64]
    # [random]                       # ... or n points drawn from a space (seeded)
    # n = 8
    # seed = 0
    # space = {"train.lr" = {low = 1e-4, high = 1e-2, log = true}, "sasrec.n_layers" = [1, 2]}
    # (a search chooses on validation: metric = "valid.full.ndcg@10", columns = test metrics)
    # columns = ["test.pop100.hr@10"]  # optional: more metrics in the table
    # paper_table = "bert4rec-table2-ml1m"   # optional: the paper's rows from
    # seqrec.evaluation.reference
    # plot = "bar"                   # optional: bars (default: a line over the points)
    # ensemble = true                # optional: the [[points]] are an ensemble's members: per
    #                                # seed, an "ensemble" row ranks by their runs together,
    #                                # weights chosen on validation (seqrec.experiments.ensemble)
    [paper]                          # optional: the paper's value of `metric`, by label
    "10" = 0.4631
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqrec.config import RunConfig, load_config, parse_override
from seqrec.errors import ConfigError
from seqrec.evaluation.reference import paper_table
from seqrec.files import bound, check_name, read_checked
from seqrec.training.validation import validate

__all__ = ["SPEC_DIR", "ExperimentSpec", "Point", "load_spec", "spec_names"]

SPEC_DIR = Path(__file__).parent  # the shipped specs sit beside this module
_KEYS = {
    "title",
    "base",
    "budget",
    "epochs",
    "seeds",
    "metric",
    "axis",
    "values",
    "points",
    "paper",
    "columns",
    "paper_table",
    "plot",
    "series",
    "set",
    "grid",
    "random",
    "ensemble",
}
ENSEMBLE = "ensemble"  # the label of an ensemble spec's extra row
_METRIC = r"(valid|test)\.\w+\.[\w@]+"


@dataclass(frozen=True)
class Point:
    label: str
    overrides: tuple[str, ...]
    base: str | None = None  # this point's own base config (e.g. another model), else the spec's
    budget: str | None = None  # this point's own time budget, else the spec's
    series: str | None = None  # the line it belongs to (specs with [[series]])


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    title: str
    base: str
    points: tuple[Point, ...]
    budget: str | None = None
    # Every point trains exactly this many epochs, whatever it costs (no time budget, no early
    # stop; a decay fitted to the budget is counted in epochs instead): compares what converges
    # better, where a budget also rewards what trains faster.
    epochs: int | None = None
    seeds: tuple[int, ...] = (0,)
    metric: str = "test.full.ndcg@10"
    # the paper's numbers: label -> {"protocol.metric": value} (the split left out)
    paper: dict[str, dict[str, float]] = field(default_factory=dict)
    columns: tuple[str, ...] = ()  # more metrics ("test.pop100.hr@10") shown beside `metric`
    plot: str = "line"
    x_label: str = ""  # the figure's x axis, for specs with [[series]]
    # the points are the members of an ensemble: per seed, one more row ranks by their runs
    # together (seqrec.experiments.ensemble.evaluate_runs: weights chosen on validation)
    ensemble: bool = False

    def config(self, point: Point, seed: int) -> RunConfig:
        overrides = [*point.overrides, f"train.seed={seed}"]
        budget = point.budget or self.budget
        if budget:
            overrides.append(f"train.time_budget={json.dumps(budget)}")
        cfg = load_config(RunConfig, point.base or self.base, overrides)
        if self.epochs:
            decay = "epochs" if cfg.train.decay == "budget" else cfg.train.decay
            train = dataclasses.replace(
                cfg.train,
                time_budget=None,
                max_epochs=self.epochs,
                max_steps=0,
                patience=0,
                decay=decay,
            )
            cfg = dataclasses.replace(cfg, train=train)
        return validate(cfg)  # a bad value fails here, before any point trains

    def paper_value(self, label: str, metric: str) -> float | None:
        """The paper's value of `metric` ("test.pop100.ndcg@10") for a point, if it gives one:
        a paper reports test numbers, so a validation metric has none beside it."""
        split, rest = metric.split(".", 1)
        return self.paper.get(label, {}).get(rest) if split == "test" else None

    def with_budget(self, budget: str) -> ExperimentSpec:
        """The same sweep with one time budget for every point (`reproduce --time-budget`)."""
        points = tuple(dataclasses.replace(p, budget=None) for p in self.points)
        return dataclasses.replace(self, budget=budget, epochs=None, points=points)

    def with_epochs(self, epochs: int) -> ExperimentSpec:
        """The same sweep with `epochs` epochs a point and no clock (`experiment --epochs`); its
        runs and results go under its own name ("table4-ml1m-30ep") beside the budgeted ones."""
        if epochs < 1:
            raise ConfigError(f"--epochs must be a positive integer, got {epochs}")
        points = tuple(dataclasses.replace(p, budget=None) for p in self.points)
        name = f"{self.name}-{epochs}ep"
        return dataclasses.replace(self, name=name, budget=None, epochs=epochs, points=points)

    def with_overrides(self, sets: Sequence[str]) -> ExperimentSpec:
        """The same sweep with `sets` ("section.key=value", `experiment --set`) applied to every
        point, its own base or not, after the point's own overrides, so they win: e.g. the data
        filter of another file (`--set data.min_item_interactions=1`)."""
        for x in sets:
            if len(parse_override(x)[0]) < 2:  # a bare key: no section
                raise ConfigError(f"--set: expected section.key=value, got {x!r}")
        points = tuple(dataclasses.replace(p, overrides=(*p.overrides, *sets)) for p in self.points)
        return dataclasses.replace(self, points=points)

    def with_seeds(self, seeds: list[int]) -> ExperimentSpec:
        """The same sweep under these training seeds (`experiment --seeds`)."""
        if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise ConfigError(f"--seeds must be distinct integers >= 0, got {seeds}")
        return dataclasses.replace(self, seeds=tuple(seeds))


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read a spec (a path or a shipped name); every problem is one line naming the file."""
    p, raw = _read_spec(path)
    base = _need(p, raw, "base", str)
    points = _points(p, raw)
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
        raise ConfigError(f"{p}: seeds must be a non-empty list of integers")
    metric = raw.get("metric", "valid.full.ndcg@10" if _is_search(raw) else "test.full.ndcg@10")
    if not isinstance(metric, str) or not re.fullmatch(_METRIC, metric):
        raise ConfigError(f"{p}: metric must look like 'test.full.ndcg@10'")
    if _is_search(raw) and not metric.startswith("valid."):
        raise ConfigError(
            f"{p}: a search selects on validation: metric must be a valid.* metric (test "
            f"metrics go in columns), got {metric!r}"
        )
    columns = raw.get("columns", [])
    if not isinstance(columns, list) or not all(
        isinstance(c, str) and re.fullmatch(_METRIC, c) for c in columns
    ):
        raise ConfigError(f"{p}: columns must be a list of metrics like 'test.pop100.hr@10'")
    plot = raw.get("plot", "line")
    if plot not in ("line", "bar"):
        raise ConfigError(f"{p}: plot must be 'line' or 'bar', got {plot!r}")
    paper = _paper(p, raw, metric)
    budget, epochs = _schedule(p, raw, points)
    spec = ExperimentSpec(
        name=check_name(p.stem, f"{p}: the spec name"),
        title=str(raw.get("title", p.stem)),
        base=base,
        points=tuple(points),
        budget=budget,
        epochs=epochs,
        seeds=tuple(seeds),
        metric=metric,
        paper=paper,
        columns=tuple(columns),
        plot=plot,
        x_label=_x_label(raw),
        ensemble=_ensemble(p, raw, points),
    )
    cfgs = []
    for point in spec.points:  # every point's config must load before anything is trained
        try:
            cfgs.append(spec.config(point, spec.seeds[0]))
        except ConfigError as e:
            raise ConfigError(f"{p}: point {point.label!r}: {e}") from None
    if spec.ensemble:  # its members must rank the same users over the same items
        for point, cfg in zip(spec.points[1:], cfgs[1:], strict=True):
            if (cfg.data, cfg.eval) != (cfgs[0].data, cfgs[0].eval):
                raise ConfigError(
                    f"{p}: ensemble: point {point.label!r} prepares the data or evaluates "
                    f"otherwise than {spec.points[0].label!r} ([data] and [eval] must be equal)"
                )
    return spec


def _ensemble(p: Path, raw: dict[str, Any], points: list[Point]) -> bool:
    """`ensemble = true`: the spec's [[points]] (two or more) are an ensemble's members."""
    value = raw.get("ensemble", False)
    if not isinstance(value, bool):
        raise ConfigError(f"{p}: ensemble must be true or false")
    if value and ("points" not in raw or len(points) < 2):
        raise ConfigError(f"{p}: ensemble: list its members as two or more [[points]]")
    if value and any(_slug(pt.label) == ENSEMBLE for pt in points):
        raise ConfigError(f"{p}: ensemble: {ENSEMBLE!r} names the ensemble's row, not a point")
    return value


def _read_spec(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The spec's file (a path, else a shipped spec of that name) and its TOML, keys checked."""
    p = Path(path)
    if not p.exists() and (SPEC_DIR / f"{p.name.removesuffix('.toml')}.toml").exists():
        p = SPEC_DIR / f"{p.name.removesuffix('.toml')}.toml"
    if not p.exists() and not p.is_symlink():
        raise ConfigError(
            f"{p}: no such spec file, and not a shipped one ({', '.join(spec_names())})"
        )
    try:
        raw = tomllib.loads(read_checked(p, bound("config")).decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"{p}: unknown key(s) {', '.join(unknown)}; expected {sorted(_KEYS)}")
    return p, raw


def _need(p: Path, raw: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{p}: {key} must be a {getattr(kind, '__name__', kind)}")
    return value


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _points(p: Path, raw: dict[str, Any]) -> list[Point]:
    """The spec's points (a [[series]] list, an axis with values, or [[points]]), each with the
    spec's own `set` first so that a point's overrides win; labels checked distinct."""
    if "series" in raw:
        points = _series_points(p, raw)
    elif "grid" in raw or "random" in raw:
        points = _search_points(p, raw)
    elif "axis" in raw:
        axis = _need(p, raw, "axis", str)
        points = [
            Point(str(v), (f"{axis}={_toml_value(v)}",)) for v in _need(p, raw, "values", list)
        ]
    else:
        points = _listed_points(p, raw)
    if not points:
        raise ConfigError(f"{p}: no points (give axis + values, or [[points]])")
    base_set = raw.get("set", [])
    if not _string_list(base_set):
        raise ConfigError(f"{p}: set must be a list of 'section.key=value'")
    points = [  # the base's overrides come first, so a point's own win
        dataclasses.replace(pt, overrides=(*base_set, *pt.overrides)) if pt.base is None else pt
        for pt in points
    ]
    labels = [pt.label for pt in points]
    if len({_slug(label) for label in labels}) != len(labels):
        raise ConfigError(f"{p}: point labels must differ, also as directory names ({labels})")
    return points


def _series_points(p: Path, raw: dict[str, Any]) -> list[Point]:
    values = _need(p, raw, "values", list)
    points = []
    for i, item in enumerate(_need(p, raw, "series", list)):
        keys = item.get("axis") if isinstance(item, dict) else None
        keys = [keys] if isinstance(keys, str) else keys
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("label"), str)
            or not isinstance(keys, list)
            or not keys
            or not all(isinstance(k, str) for k in keys)
        ):
            raise ConfigError(f"{p}: series[{i}] needs a label and an axis (a key or keys)")
        s_base = item.get("base")
        if s_base is not None and not isinstance(s_base, str):
            raise ConfigError(f"{p}: series[{i}].base must be a config name or path")
        s_values = item.get("values", values)
        if not isinstance(s_values, list) or not s_values:
            raise ConfigError(f"{p}: series[{i}].values must be a non-empty list")
        s_set = item.get("set", [])
        if not _string_list(s_set):
            raise ConfigError(f"{p}: series[{i}].set must be a list of 'section.key=value'")
        for value in s_values:
            sets = (*s_set, *(f"{k}={_toml_value(value)}" for k in keys))
            points.append(Point(f"{item['label']} {value}", sets, s_base, None, item["label"]))
    return points


def _is_search(raw: dict[str, Any]) -> bool:
    return "grid" in raw or "random" in raw


def _search_points(p: Path, raw: dict[str, Any]) -> list[Point]:
    """A grid (every combination of the values, in the keys' order) or a random search (`n`
    points drawn with `seed` from `space`: a list is a choice, {low, high, log} a range; a
    drawn number keeps 4 significant digits). One series, "search", so the results name the
    best point."""
    if "grid" in raw and "random" in raw:
        raise ConfigError(f"{p}: give a grid or a random search, not both")
    if "grid" in raw:
        grid = raw["grid"]
        if (
            not isinstance(grid, dict)
            or not grid
            or not all(isinstance(v, list) and v for v in grid.values())
        ):
            raise ConfigError(f"{p}: [grid] maps keys to non-empty lists of values")
        combos: list[dict[str, Any]] = [{}]
        for key, values in grid.items():
            combos = [{**c, key: v} for c in combos for v in values]
    else:
        combos = _random_combos(p, raw["random"])
    points = []
    for i, combo in enumerate(combos):
        label = " ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in combo.items())
        if "random" in raw:
            label = f"#{i + 1} {label}"
        sets = tuple(f"{k}={_toml_value(v)}" for k, v in combo.items())
        points.append(Point(label, sets, None, None, "search"))
    return points


def _random_combos(p: Path, spec: Any) -> list[dict[str, Any]]:
    import math

    import numpy as np

    space = spec.get("space") if isinstance(spec, dict) else None
    n, seed = (spec.get("n"), spec.get("seed", 0)) if isinstance(spec, dict) else (None, None)
    if not isinstance(space, dict) or not space or type(n) is not int or n < 1:
        raise ConfigError(f"{p}: [random] needs n >= 1 and a space of keys")
    if type(seed) is not int:
        raise ConfigError(f"{p}: random.seed must be an integer")
    rng = np.random.default_rng(seed)
    combos = []
    for _ in range(n):
        combo: dict[str, Any] = {}
        for key, dist in space.items():
            if isinstance(dist, list) and dist:
                combo[key] = dist[int(rng.integers(len(dist)))]
            elif isinstance(dist, dict) and {"low", "high"} <= set(dist):
                low, high = float(dist["low"]), float(dist["high"])
                if not low < high or (dist.get("log") and low <= 0):
                    raise ConfigError(f"{p}: random.space.{key}: need 0 < low < high for log")
                if dist.get("log"):
                    x = math.exp(rng.uniform(math.log(low), math.log(high)))
                else:
                    x = rng.uniform(low, high)
                combo[key] = float(f"{x:.4g}")
            else:
                raise ConfigError(
                    f"{p}: random.space.{key}: a list of choices or {{low, high, log}}"
                )
        combos.append(combo)
    return combos


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _listed_points(p: Path, raw: dict[str, Any]) -> list[Point]:
    points = []
    for i, item in enumerate(_need(p, raw, "points", list)):
        if not isinstance(item, dict) or not isinstance(item.get("label"), str):
            raise ConfigError(f"{p}: points[{i}] needs a label (a string) and a set list")
        sets = item.get("set", [])
        if not _string_list(sets):
            raise ConfigError(f"{p}: points[{i}].set must be a list of 'section.key=value'")
        point_base, point_budget = item.get("base"), item.get("budget")
        if point_base is not None and not isinstance(point_base, str):
            raise ConfigError(f"{p}: points[{i}].base must be a config name or path")
        if point_budget is not None and not isinstance(point_budget, str):
            raise ConfigError(f"{p}: points[{i}].budget must be a duration string such as '5m'")
        points.append(Point(item["label"], tuple(sets), point_base, point_budget))
    return points


def _paper(p: Path, raw: dict[str, Any], metric: str) -> dict[str, dict[str, float]]:
    """The published numbers beside the points: a shipped paper table, and [paper] numbers of
    `metric` by point label."""
    paper: dict[str, dict[str, float]] = {}
    if "paper_table" in raw:
        try:
            paper = paper_table(str(raw["paper_table"]))
        except KeyError as e:
            raise ConfigError(f"{p}: paper_table: {e.args[0]}") from None
    own = raw.get("paper", {})
    if not isinstance(own, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in own.values()
    ):
        raise ConfigError(f"{p}: [paper] maps point labels to numbers")
    for label, value in own.items():  # a number: the paper's value of `metric`
        paper.setdefault(str(label), {})[metric.split(".", 1)[1]] = float(value)
    return paper


def _schedule(p: Path, raw: dict[str, Any], points: list[Point]) -> tuple[str | None, int | None]:
    """The spec's budget or its fixed epochs (not both, also not with per-point budgets)."""
    budget = raw.get("budget")
    if budget is not None and not isinstance(budget, str):
        raise ConfigError(f"{p}: budget must be a duration string such as '5m'")
    epochs = raw.get("epochs")
    if epochs is not None and (
        not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1
    ):
        raise ConfigError(f"{p}: epochs must be a positive integer, got {epochs!r}")
    if epochs is not None and (budget is not None or any(pt.budget for pt in points)):
        raise ConfigError(f"{p}: give epochs or a budget (per spec or per point), not both")
    return budget, epochs


def _x_label(raw: dict[str, Any]) -> str:
    """The key a [[series]] spec sweeps, as the figure's x label ("d_model")."""
    if "series" not in raw:
        return ""
    axis = raw["series"][0]["axis"]
    return str(axis if isinstance(axis, str) else axis[0]).rsplit(".", 1)[-1]


def _toml_value(value: Any) -> str:
    """A spec value as the right-hand side of a `--set` override."""
    return json.dumps(value) if isinstance(value, str) else str(value).lower()


def _slug(label: str) -> str:
    """A point's run-directory name ("gru4rec+" -> "gru4rec-plus")."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label.replace("+", "-plus")).strip("_") or "point"
