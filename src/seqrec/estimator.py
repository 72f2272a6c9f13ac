"""Your own data in a few lines: an estimator with scikit-learn's conventions over the run
directory (the unit of record) and the Recommender (what the CLI and the server call).

    model = seqrec.SASRec().fit(df, user_col="user_id", item_col="sku", time_col="ts")
    model.recommend(["user_17"], k=10)          # DataFrame: user, rank, item, score
    model.similar_items(["sku-0042"], k=5)      # DataFrame: item, rank, similar, score
    model.evaluate()                            # the test split under every protocol
    model.refit()                               # on every item, for serving
    model.save("models/sasrec"); seqrec.load("models/sasrec").recommend(["user_17"])

A fit trains until validation stops improving (the recipe's patience, within its max_epochs):
the same data and seed give the same model. `time_budget` caps it by the clock, and the number
of steps then depends on the machine (the run says so). Answers come as the kind of frame the
data was (pandas in, pandas out; polars; Arrow), or as `frame=` says.

Parameters are the fields of the model's config sections, of [train] and of [data]
(`d_model`, `lr`, `batch_size`, `loss`, `split`, ...), by name; `config=` starts from a shipped
recipe or a TOML file; `set=["section.key=value"]` reaches any key by its dotted name. They are
validated in `fit` (`get_params`, `set_params` and `sklearn.base.clone` work as for any
estimator; `seqrec.search` tries a grid of them, selecting on validation).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.config import RunConfig, default_config, load_config
from seqrec.data.frames import FRAME_KINDS, as_kind, frame_kind
from seqrec.data.prepare import prepared
from seqrec.data.prepared import SAME_COLUMN, PreparedDataset
from seqrec.errors import ConfigError, SeqrecError
from seqrec.models.registry import entry
from seqrec.outputs import check_out_dir, check_out_file
from seqrec.serving.files import ranked_table
from seqrec.serving.indexing import index_if_large
from seqrec.serving.recommender import MODEL, POPULARITY, Recommender
from seqrec.training.policy import ANY_LOG_ADAPT, refit_config
from seqrec.training.rundir import RunDir
from seqrec.training.validation import validate, with_items_table

__all__ = ["BERT4Rec", "Model", "SASRec", "load"]


class Model:
    """A sequential recommender: `Model("gru4rec", d_model=64)` for any registered model."""

    def __init__(
        self,
        model: str = "sasrec",
        *,
        config: str | None = None,
        time_budget: str | None = None,
        set: Sequence[str] = (),
        **params: Any,
    ) -> None:
        self.model = model
        self.config = config
        self.time_budget = time_budget
        self.set = tuple(set)
        self.params = dict(params)
        self.run_dir_: Path | None = None
        self.frame_ = "polars"  # the kind of frame answers come as: the fitted data's
        self.validated_metrics_: dict[str, Any] | None = None  # before a refit on every item
        self.items_table_: Any = None  # the items table fit was given
        self._rec: Recommender | None = None
        self._tmp: list[tempfile.TemporaryDirectory[str]] = []

    # ---------------------------------------------------------- scikit-learn's conventions

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments, as given."""
        return {
            "model": self.model,
            "config": self.config,
            "time_budget": self.time_budget,
            "set": self.set,
            **self.params,
        }

    def set_params(self, **params: Any) -> Model:
        for key, value in params.items():
            if key in ("model", "config", "time_budget"):
                setattr(self, key, value)
            elif key == "set":
                self.set = tuple(value)
            else:
                self.params[key] = value
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v not in (None, ()))
        return f"{type(self).__name__}({args})"

    # ---------------------------------------------------------------------------- config

    def run_config(self) -> RunConfig:
        """The resolved config: the model's defaults (or `config`), the parameters by name,
        `set`, the time budget; every value checked (one ConfigError line)."""
        entry(self.model)
        base = load_config(RunConfig, self.config) if self.config else default_config(self.model)
        if base.model != self.model:
            raise ConfigError(f"config {self.config!r} is a {base.model} recipe, not {self.model}")
        overrides = [f"{self._key(base, k)}={_toml(v)}" for k, v in self.params.items()]
        if not self.config:  # the model's defaults, their sizes and loss fitted to the data
            overrides.insert(0, ANY_LOG_ADAPT)
        if self.time_budget is not None:
            overrides.append(f"train.time_budget={json.dumps(self.time_budget)}")
        cfg = load_config(RunConfig, None, [*overrides, *self.set], base=base)
        # every check a training makes without the data (ranges, the loop's, the negatives',
        # the model's, the memory its layers ask for), before `fit` prepares anything
        return validate(cfg, where=type(self).__name__)

    def _key(self, cfg: RunConfig, name: str) -> str:
        """The dotted key of a parameter: the model's sections first, then [train], then [data]
        (`split="time", time_cut="2000-12-01"`)."""
        sections = [*cfg.sections, ("train", cfg.train), ("data", cfg.data), ("items", cfg.items)]
        for section, value in sections:
            if name in {f.name for f in dataclasses.fields(value)}:
                return f"{section}.{name}"
        known = sorted({f.name for _, v in sections for f in dataclasses.fields(v)})
        raise ConfigError(
            f"{type(self).__name__}: unknown parameter {name!r}; known: {', '.join(known)} "
            "(set=['section.key=value'] reaches any other key)"
        )

    # ------------------------------------------------------------------------------- fit

    def fit(
        self,
        data: Any,
        *,
        user_col: str | None = None,
        item_col: str | None = None,
        time_col: str | None = SAME_COLUMN,
        time_budget: str | None = None,
        valid: bool = True,
        final: bool = False,
        out: str | Path | None = None,
        progress: bool = True,
        items: Any = None,
        item_features: Sequence[str] | str | dict[str, str] | None = None,
    ) -> Model:
        """Train on `data` (a DataFrame, a file, a dataset name or a PreparedDataset) and return
        self. `items`: an items table (a frame or a file) whose `item_features` columns
        ("genres", or "genres:categories"; a {name: kind} dict) the model reads beside the ids
        (seqrec.data.items_table): new items can then be added (`add_items`). Training stops when
        validation has not improved for the recipe's patience (or at its max_epochs, or when
        `time_budget` runs out). `valid`: hold each user's second-last item out to choose the
        state on (False: train on it too, and keep the last state). `final`: then `refit()`, so
        that the model learns every item (the state to serve). `out`: the run directory (default:
        a temporary one, kept while this object lives; `save` copies it). `progress`: a bar on a
        terminal, a line an epoch elsewhere."""
        if time_budget is not None:
            self.time_budget = time_budget
        cfg = self.run_config()
        if not valid:
            train = dataclasses.replace(cfg.train, train_on="train+valid", patience=0)
            cfg = dataclasses.replace(cfg, train=train)
        if final and not valid:
            raise ConfigError("final=True refits for the epochs validation chose: keep valid=True")
        cfg = with_items_table(cfg, items, item_features, where=f"{type(self).__name__}.fit")
        self.items_table_ = items
        self.frame_ = frame_kind(data)
        ds = prepared(data, cfg, progress, user_col=user_col, item_col=item_col, time_col=time_col)
        source = {"data": str(data)} if isinstance(data, str | Path) else None
        self._train(ds, cfg, None if final else out, progress, source)
        if final:
            self.refit(out=out, progress=progress)
        return self

    def add_items(self, items: Any) -> list[Any]:
        """New items (an items table with the fitted feature columns: a frame or a file) added
        to the catalogue without retraining, each scored from its features; the run directory
        records them. Returns their ids."""
        return self.recommender_.add_items(items)

    def refit(self, *, out: str | Path | None = None, progress: bool = True) -> Model:
        """Train the fitted config again on every item of every user (nothing held out), for
        the epochs its validation chose (as `seqrec refit --all`), and serve that: a model that
        knows each user's latest items. Its metrics then hold no test numbers (nothing is left
        to test on); those of the validated run are in `validated_metrics_`."""
        if self.run_dir_ is None:
            raise SeqrecError(f"{type(self).__name__} is not fitted: call fit first")
        run = RunDir(self.run_dir_)
        metrics = run.metrics() or {}
        if metrics.get("train_on") == "all":
            return self  # already trained on everything
        cfg = refit_config(
            run.config(),
            int(metrics.get("best_epoch", -1)),
            metrics.get("lr_reductions", ()),
            "all",
        )
        self.validated_metrics_ = metrics
        self._train(
            self.dataset_, cfg, out, progress, {"refit_of": str(self.run_dir_)}, run.item_features()
        )
        return self

    def _train(
        self,
        ds: PreparedDataset,
        cfg: RunConfig,
        out: str | Path | None,
        progress: bool,
        source: dict[str, Any] | None,
        items: tuple[Any, Any] | None = None,
    ) -> None:
        from seqrec.training.fit import fit

        if out is None:  # a temporary run directory, kept while this object lives
            tmp = tempfile.TemporaryDirectory(prefix="seqrec-run-")
            self._tmp.append(tmp)
            out = Path(tmp.name) / "run"
        result = fit(
            ds,
            cfg,
            Path(out),
            progress=progress,
            source=source,
            items_table=self.items_table_,
            items=items,
        )
        self.run_dir_ = result.run_dir
        index_if_large(result.run_dir, progress=progress)
        self._rec = Recommender.from_run(result.run_dir, device=result.model.device)
        self._rec.dataset = ds

    @property
    def recommender_(self) -> Recommender:
        if self._rec is None:
            raise SeqrecError(f"{type(self).__name__} is not fitted: call fit (or seqrec.load)")
        return self._rec

    @property
    def dataset_(self) -> PreparedDataset:
        ds = self.recommender_.dataset
        if ds is None:
            raise SeqrecError("the run's prepared data is gone: recommend_histories still works")
        return ds

    @property
    def metrics_(self) -> dict[str, Any] | None:
        """The run's recorded metrics: validation and test under every protocol."""
        return RunDir(self.run_dir_).metrics() if self.run_dir_ else None

    # ------------------------------------------------------------------------ recommend

    def recommend(
        self,
        users: Sequence[Any] | None = None,
        k: int = 10,
        filter_viewed: bool = True,
        items: Sequence[Any] | None = None,
        *,
        exclude: Sequence[Any] | None = None,
        frame: str = "auto",
        as_pandas: bool = False,
        at: int | None = None,
    ) -> Any:
        """Top-k for users of the training data (default: all of them), after everything the
        data holds of each: a DataFrame `user, rank, item, score`, of the kind the fitted data
        was (`frame`: "auto", "polars", "pandas", "arrow"; `as_pandas` is frame="pandas").
        `filter_viewed` leaves out what a user has seen; `items` restricts the candidates;
        `exclude` leaves these items out; `at`: the time the recommendations are for, seconds
        since the epoch (default: now; read by a model of when items happened, HSTU's
        time bias). An unknown user is one ConfigError line."""
        rec, ds = self.recommender_, self.dataset_
        kind = self._kind(frame, as_pandas)
        users = list(ds.user_ids) if users is None else list(users)
        rows = rec.user_rows(users)
        recs = rec.recommend_encoded(
            [ds.sequences[r] for r in rows],
            k,
            filter_viewed,
            candidates=items,
            exclude=exclude,
            users=rows,
            times=rec.user_times(rows),
            at=at,
        )
        return as_kind(ranked_table("user", users, recs), kind)

    def recommend_all(
        self,
        path: str | Path,
        k: int = 10,
        filter_viewed: bool = True,
        items: Sequence[Any] | None = None,
        *,
        exclude: Sequence[Any] | None = None,
        progress: bool = True,
        replace: bool = False,
        at: int | None = None,
    ) -> Path:
        """`recommend` for every user of the training data, written to `path` (.parquet or
        .csv) in bounded memory rather than returned (`seqrec.serving.all_users`): for a million
        users. An existing file is refused unless `replace` (then replaced atomically); `at`:
        as `recommend`'s. Returns the path."""
        from seqrec.serving.all_users import write_all_users

        try:
            check_out_file(Path(path), replace=replace, inputs=[self.run_dir_])
        except ConfigError as e:  # the command line's words, as Python says them
            raise ConfigError(str(e).replace("--force", "replace=True")) from None
        write_all_users(
            self.recommender_,
            path,
            k,
            filter_viewed,
            candidates=items,
            exclude=exclude,
            progress=progress,
            at=at,
        )
        return Path(path)

    def recommend_histories(
        self,
        histories: Sequence[Sequence[Any]],
        k: int = 10,
        filter_viewed: bool = True,
        items: Sequence[Any] | None = None,
        *,
        exclude: Sequence[Any] | None = None,
        frame: str = "auto",
        as_pandas: bool = False,
        times: Sequence[Sequence[int]] | None = None,
        at: int | None = None,
    ) -> Any:
        """Top-k for histories of item ids (oldest first; unknown items dropped): a DataFrame
        `history, rank, item, score, scored_by` (`history`: the position in `histories`;
        `scored_by`: "model", or "popularity" for an empty history, whose scores are the
        training counts: another scale). `times` (in the shape of `histories`, seconds) and
        `at` (default: now): when the items happened and when the recommendations are for,
        which a model of time (HSTU's time bias) needs and the others ignore."""
        rec = self.recommender_
        kind = self._kind(frame, as_pandas)
        encoded, kept = rec.encode_batch(histories, times)
        ids = [e.ids for e in encoded]
        recs = rec.recommend_encoded(
            ids, k, filter_viewed, candidates=items, exclude=exclude, times=kept, at=at
        )
        table = ranked_table("history", list(range(len(histories))), recs)
        by = [MODEL if len(e) else POPULARITY for e in ids]
        scored_by = [by[h] for h in table.get_column("history").to_list()]
        return as_kind(table.with_columns(pl.Series("scored_by", scored_by, pl.String)), kind)

    def similar_items(
        self,
        items: Sequence[Any],
        k: int = 10,
        *,
        frame: str = "auto",
        as_pandas: bool = False,
    ) -> Any:
        """The k items closest to each of `items` by the cosine of the model's output
        embeddings (item-to-item): a DataFrame `item, rank, similar, score`."""
        kind = self._kind(frame, as_pandas)
        rows = [
            (item, rank, similar, score)
            for item, found in zip(items, self.recommender_.similar_items(items, k), strict=True)
            for rank, (similar, score) in enumerate(found, 1)
        ]
        df = pl.DataFrame(rows, schema=["item", "rank", "similar", "score"], orient="row")
        return as_kind(df, kind)

    def _kind(self, frame: str, as_pandas: bool) -> str:
        """The kind of frame an answer comes as."""
        if as_pandas:
            return "pandas"
        if frame == "auto":
            return self.frame_
        if frame not in FRAME_KINDS:
            raise ConfigError(f"frame: expected auto, {', '.join(FRAME_KINDS)}; got {frame!r}")
        return frame

    # ----------------------------------------------------------------- evaluate, save

    def evaluate(
        self,
        protocols: Sequence[str] = ("full", "uni100", "pop100"),
        split: str = "test",
        ks: Sequence[int] = (1, 5, 10),
        draws: int = 1,
    ) -> dict[str, dict[str, float]]:
        """Metrics of the fitted model on `split` of its data under each protocol. `draws` > 1:
        the sampled protocols (uni100, pop100) are ranked against that many draws of their
        candidates, the stored one first; each of their metrics (the stored draw's) then has
        `<metric>_mean` and `<metric>_std` over the draws beside it. A model refitted on every
        item has trained on the test items: nothing is left to measure it on (the validated
        run's metrics are `validated_metrics_`)."""
        from seqrec.evaluation.protocols import evaluate_split, parse_protocols

        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise ConfigError(f"evaluate: draws: expected an integer >= 1, got {draws!r}")
        if (self.metrics_ or {}).get("train_on") == "all":
            raise ConfigError(
                "evaluate: this model was refitted on every item, the test ones too; its "
                "validated run's metrics are validated_metrics_"
            )

        report = evaluate_split(
            self.dataset_,
            self.recommender_.model,
            "valid" if split == "valid" else "test",
            protocols=parse_protocols(",".join(protocols)),
            ks=ks,
            draws=draws,
        )
        return report.metrics_with_draws()

    def save(self, path: str | Path) -> Path:
        """Copy the run directory to `path` (new or empty): `seqrec.load(path)` gives the same
        recommendations."""
        if self.run_dir_ is None:
            raise SeqrecError(f"{type(self).__name__} is not fitted: nothing to save")
        path = Path(path)
        check_out_dir(path, "run", inputs=[self.run_dir_])
        if path.exists():
            path.rmdir()  # empty (checked)
        shutil.copytree(self.run_dir_, path, ignore=shutil.ignore_patterns(".lock"))
        return path


class SASRec(Model):
    """SASRec (Kang & McAuley 2018), from the `sasrec-ce` recipe: cross-entropy over the
    catalogue (a logQ-corrected sampled softmax beyond 32,768 items), trained until validation
    stops improving, history length and batch fitted to the data. `config="ml-1m-sasrec"` (or
    `loss="bce"`) for the paper's BCE; `config=None` for the model's bare defaults."""

    def __init__(
        self,
        *,
        config: str | None = "sasrec-ce",
        time_budget: str | None = None,
        set: Sequence[str] = (),
        **params: Any,
    ) -> None:
        super().__init__("sasrec", config=config, time_budget=time_budget, set=set, **params)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = super().get_params(deep)
        params.pop("model")
        return params


class BERT4Rec(Model):
    """BERT4Rec (Sun et al. 2019), from the `bert4rec` recipe: the paper's model and Cloze task
    with a learning rate that learns on any log, trained until validation stops improving,
    history length, batch and loss fitted to the data. `config=None` for the paper's own
    defaults (lr 1e-4, 200 epochs), `config="ml-1m-bert4rec"` for its ML-1M recipe."""

    def __init__(
        self,
        *,
        config: str | None = "bert4rec",
        time_budget: str | None = None,
        set: Sequence[str] = (),
        **params: Any,
    ) -> None:
        super().__init__("bert4rec", config=config, time_budget=time_budget, set=set, **params)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = super().get_params(deep)
        params.pop("model")
        return params


def _toml(value: Any) -> str:
    """A parameter's value as an override's TOML text; a date or datetime as its ISO text."""
    if isinstance(value, dt.date | dt.time):
        value = value.isoformat()
    return json.dumps(value)


def load(path: str | Path, *, device: str = "auto", trust: bool = False) -> Model:
    """A fitted Model from a run directory (`Model.save`, or any `seqrec train` run), scoring
    on `device` (auto: a GPU when there is one, as training does)."""
    from seqrec.training.setup import resolve_device

    device = str(resolve_device(device))
    run = RunDir(path, trust=trust)
    cfg = run.config()
    cls = {"sasrec": SASRec, "bert4rec": BERT4Rec}.get(cfg.model)
    model = cls() if cls is not None else Model(cfg.model)
    model.run_dir_ = Path(path)
    # the run's prepared data, where it still is, for recommending to its users
    model._rec = Recommender.from_run(path, device=device, trust=trust)
    return model
