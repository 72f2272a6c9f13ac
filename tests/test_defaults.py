"""Good by default: a fit that stops on validation (the same model twice), a log kept whole, the
loss and sizes fitted to the catalogue, honest warnings, frames out as they came in, a refit on
every item, exclusions, and a search from Python."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

import seqrec
from seqrec.config import RunConfig, default_config, load_config
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.training.policy import LARGE_CATALOGUE, adapt_to_data, refit_config, sampled_negatives
from seqrec.training.rundir import RunDir

pd = pytest.importorskip("pandas")  # the dev extra installs it; seqrec itself does not need it


def _log(n_users: int = 60, n_items: int = 30, seed: int = 4) -> pl.DataFrame:
    df = synthetic_interactions(n_users=n_users, n_items=n_items, min_len=6, max_len=16, seed=seed)
    return pl.DataFrame(
        {
            "user_id": [f"u{u}" for u in df["user"].to_list()],
            "sku": [f"s{i:03d}" for i in df["item"].to_list()],
            "ts": df["timestamp"],
        }
    )


COLS = {"user_col": "user_id", "item_col": "sku", "time_col": "ts"}


def _tiny(**more: Any) -> seqrec.SASRec:
    """The sasrec-ce recipe, small: it stops on validation (patience 2, a plateau of 1)."""
    params = {"d_model": 16, "max_len": 10, "threads": 1, "patience": 2, "plateau_patience": 1}
    return seqrec.SASRec(**{**params, **more})


# ------------------------------------------------------------------------ converges, the same


def test_two_fits_with_one_seed_give_the_same_model_and_stop_on_patience() -> None:
    """No time budget: the run ends on the patience rule (recorded), and a second fit with the
    same seed gives the same top-10s and scores, on a CPU (on a GPU the atomic additions of
    the embeddings' gradients make two runs differ in the last digits)."""
    log = _log()
    users = ["u1", "u5", "u9", "u20"]
    answers = []
    for _ in range(2):
        model = _tiny(device="cpu").fit(log, **COLS, progress=False)
        m = model.metrics_
        assert m is not None and m["stopped"] == "early_stopping"
        assert m["steps_set_by"] == "data" and m["epochs"] < 200
        assert m["epochs"] - 1 - m["best_epoch"] == 2  # two validations without improvement
        answers.append(model.recommend(users, k=10))
    a, b = answers
    assert a["item"].to_list() == b["item"].to_list()
    assert np.allclose(a["score"].to_numpy(), b["score"].to_numpy(), atol=1e-6, rtol=0)


def test_the_plateau_schedule_halves_the_rate_and_a_refit_replays_it() -> None:
    from seqrec.training.loop import _LoopState

    t = load_config(RunConfig, "sasrec-ce").train
    assert (t.decay, t.plateau_patience, t.plateau_factor, t.time_budget) == (
        "plateau",
        2,
        0.5,
        None,
    )
    loop, model = _LoopState(), torch.nn.Linear(1, 1)
    for epoch, value in enumerate([0.1, 0.2, 0.2, 0.1, 0.3, 0.2, 0.2, 0.2, 0.2]):
        loop.record(value, epoch, model, t)
    # no improvement at epochs 2, 3 (a plateau of 2: lowered after 3), then 5..8 (after 6, 8)
    assert loop.reductions == [3, 6, 8] and loop.best["epoch"] == 4
    cfg = refit_config(load_config(RunConfig, "sasrec-ce"), 4, loop.reductions, "all")
    # the refit trains epochs 0..4: the rate lowered after epoch 3, as the run lowered it
    assert (cfg.train.plateau_at, cfg.train.max_epochs, cfg.train.train_on) == ((3,), 5, "all")
    with pytest.raises(ConfigError, match="plateau_factor must be in"):
        seqrec.SASRec(plateau_factor=1.0).run_config()


def test_a_time_budget_says_the_clock_set_the_steps(capsys: pytest.CaptureFixture[str]) -> None:
    model = _tiny(max_epochs=3).fit(_log(), **COLS, time_budget="1h", progress=False)
    assert model.metrics_ is not None and model.metrics_["steps_set_by"] == "data"
    model = _tiny(max_steps=3, decay="budget").fit(_log(), **COLS, time_budget="1h", progress=False)
    assert model.metrics_ is not None and model.metrics_["steps_set_by"] == "clock"
    assert "depends on this machine's speed" in capsys.readouterr().err


# ----------------------------------------------------------------------------- data kept


def _rare_log() -> pl.DataFrame:
    """40 users of 4 items each over 40 items that each appear 4 times, and 3 more items that
    appear 2, 4 and 2 times (users u40, u41 and u0 hold them): every item 2 to 4 times."""
    rows = [(f"u{u}", f"i{(u + j * 10) % 40}", j) for u in range(40) for j in range(4)]
    rows += [("u40", "x0", 0), ("u40", "x1", 1), ("u40", "x2", 2)]
    rows += [("u41", "x0", 0), ("u41", "x1", 1), ("u41", "x2", 2), ("u41", "x1", 3)]
    rows += [("u0", "x1", 9)]
    return pl.DataFrame(rows, schema=["user_id", "sku", "ts"], orient="row")


def test_a_log_is_kept_whole_and_a_requested_kcore_says_what_it_removed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = _rare_log()
    counts = log.group_by("sku").len()["len"]
    assert counts.min() == 2 and counts.max() == 4  # the log this test is about
    model = _tiny(max_epochs=1).fit(log, **COLS, progress=False)
    ds = model.dataset_
    assert (ds.n_users, ds.n_items) == (42, 43)  # every user and item kept
    assert ds.stats["actions"] == log.height == 168
    assert ds.stats["kcore"] == {
        "min_user": 1,
        "min_item": 1,
        "removed": {"users": 0, "items": 0, "interactions": 0},
    }
    assert model.metrics_ is not None and model.metrics_["data"]["items"] == 43
    assert "core removed" not in capsys.readouterr().err
    # a 3-core, asked for: x0 and x2 (2 each) go; then u40 holds 1 item and u41 2 (x1 twice):
    # they go, and x1 is left with u0's 1: it goes too
    model = _tiny(max_epochs=1, min_item_interactions=3, min_user_interactions=3)
    model.fit(log, **COLS, progress=False)
    err = capsys.readouterr().err
    assert "the 3-user/3-item core removed 2 users, 3 items and 8 of 168 interactions" in err
    assert model.dataset_.stats["kcore"]["removed"] == {"users": 2, "items": 3, "interactions": 8}


def test_the_papers_datasets_keep_their_five_core_by_name() -> None:
    from seqrec.data.preprocess import kcore_thresholds
    from seqrec.data.settings import DataConfig

    assert kcore_thresholds(DataConfig(), "movielens-dat", papers=True) == (5, 5)
    assert kcore_thresholds(DataConfig(), "movielens-dat") == (1, 1)
    assert kcore_thresholds(DataConfig(), "user-item", papers=True) == (1, 1)
    assert kcore_thresholds(DataConfig(min_item_interactions=3), None) == (1, 3)


# ------------------------------------------------------------------ fitted to the catalogue


def test_a_large_catalogue_gets_a_sampled_softmax_and_an_explicit_loss_wins() -> None:
    cfg = load_config(RunConfig, "sasrec-ce")
    lengths = np.full(100, 30)
    small, said = adapt_to_data(cfg, lengths, LARGE_CATALOGUE)
    assert small.train.loss == "ce" and small.train.batch_size == 64  # halved beyond 20,000
    big, said = adapt_to_data(cfg, lengths, 54_542)
    t = big.train
    assert (t.loss, t.negatives_per, t.logq) == ("sampled_softmax", "batch", True)
    assert t.n_negatives == sampled_negatives(54_542) == 54_542 // 16
    assert t.batch_size == 128  # a sampled softmax keeps the batch
    assert any("sampled_softmax over 3,408 items" in s for s in said)
    assert (sampled_negatives(10_000), sampled_negatives(10**7)) == (2048, 8192)
    explicit = seqrec.SASRec(loss="ce").run_config()
    assert "loss" not in explicit.adapt
    assert adapt_to_data(explicit, lengths, 54_542)[0].train.loss == "ce"


def test_every_model_fits_its_history_length_to_the_data() -> None:
    lengths = np.full(50, 12)
    for name in ("lrurec", "gru4rec", "bert4rec", "sasrec"):
        cfg = seqrec.Model(name, config=None).run_config()  # the model's defaults, no recipe
        assert set(cfg.adapt) == {"max_len", "batch_size", "loss"}
        assert default_config(name).adapt == ()  # a config file adapts only what it names
        fitted, _ = adapt_to_data(cfg, lengths, 500)
        section = next(s for _, s in fitted.sections if hasattr(s, "max_len"))
        assert section.max_len == 16  # 12 rounded up to 8s, at least 16


# --------------------------------------------------------------------------------- warnings


def test_a_run_of_less_than_one_pass_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    model = _tiny(max_steps=1, batch_size=8).fit(_log(), **COLS, progress=False)
    assert model.metrics_ is not None and 0 < model.metrics_["passes"] <= 8 / 60
    assert "of one pass over the training sequences" in capsys.readouterr().err


def test_the_same_top10_for_everyone_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    from seqrec.training.run_checks import _same_top10

    model = _tiny(max_epochs=1).fit(_log(), **COLS, progress=False)
    ds = model.dataset_
    assert model.metrics_ is not None and model.metrics_["same_top10"] is False  # it learned

    class Constant:  # ranks by a fixed score per item: popularity alone
        max_len = 10

        def score(self, histories: torch.Tensor, users: Any = None) -> torch.Tensor:
            return torch.arange(ds.n_items + 1, dtype=torch.float32).expand(len(histories), -1)

    cfg = load_config(RunConfig, "sasrec-ce")
    assert _same_top10(cfg, ds, Constant(), torch.device("cpu"))  # type: ignore[arg-type]
    assert "the same top-10" in capsys.readouterr().err


# ------------------------------------------------------------------------ frames, refit, rules


@pytest.mark.parametrize("kind", ["pandas", "polars"])
def test_frames_out_are_the_kind_that_came_in(kind: str) -> None:
    log = _log()
    data = pd.DataFrame({c: log[c].to_list() for c in log.columns}) if kind == "pandas" else log
    model = _tiny(max_epochs=1).fit(data, **COLS, progress=False)
    item = model.dataset_.item_ids[0]
    recs = model.recommend(["u1", "u2"], k=3)
    hist = model.recommend_histories([[item]], k=3)
    sim = model.similar_items([item], k=3)
    want = pd.DataFrame if kind == "pandas" else pl.DataFrame
    assert all(isinstance(x, want) for x in (recs, hist, sim))
    assert list(recs.columns) == ["user", "rank", "item", "score"] and len(recs) == 6
    # pandas answers need no pyarrow: the ranks stay integers, the ids strings
    if kind == "pandas":
        assert str(recs["rank"].dtype) == "int64" and recs["item"].iloc[0].startswith("s")
    other = model.recommend(["u1"], k=2, frame="polars" if kind == "pandas" else "pandas")
    assert not isinstance(other, want)
    with pytest.raises(ConfigError, match="frame: expected auto, polars, pandas, arrow"):
        model.recommend(["u1"], frame="excel")


def test_refit_trains_every_item_for_the_validated_epochs(tmp_path: Path) -> None:
    model = _tiny().fit(_log(), **COLS, progress=False)
    validated = model.metrics_
    assert validated is not None
    first = model.run_dir_
    model.refit()
    m = model.metrics_
    assert m is not None and model.run_dir_ != first
    assert (m["train_on"], m["epochs"]) == ("all", validated["best_epoch"] + 1)
    assert "test" not in m and "valid" not in m and model.validated_metrics_ == validated
    with pytest.raises(ConfigError, match="refitted on every item"):
        model.evaluate()
    # the refit learned from every item: the training sequences are the whole histories
    cfg = RunDir(model.run_dir_).config()
    assert cfg.train.train_on == "all" and cfg.train.time_budget is None
    assert model.dataset_.split.training("all").lengths.sum() == model.dataset_.stats["actions"]
    again = _tiny().fit(_log(), **COLS, progress=False, final=True)
    assert again.metrics_ is not None and again.metrics_["train_on"] == "all"
    assert (
        again.recommend(["u1"], k=5)["item"].to_list()
        == model.recommend(["u1"], k=5)["item"].to_list()
    )


def test_exclusions_per_call_and_for_every_call() -> None:
    model = _tiny(max_epochs=1).fit(_log(), **COLS, progress=False)
    top = model.recommend(["u3"], k=5)["item"].to_list()
    fewer = model.recommend(["u3"], k=5, exclude=top[:2] + ["not-an-item"])["item"].to_list()
    assert not set(top[:2]) & set(fewer) and fewer[:3] == top[2:]
    rec = model.recommender_
    assert rec.exclude_items([top[0], "unknown-sku"]) == ["unknown-sku"]
    assert top[0] not in model.recommend(["u3"], k=5)["item"].to_list()
    hist = model.recommend_histories([[], [model.dataset_.item_ids[1]]], k=3)
    assert hist["scored_by"].to_list() == ["popularity"] * 3 + ["model"] * 3
    assert top[0] not in hist["item"].to_list()
    rec.exclude_items([])
    assert model.recommend(["u3"], k=5)["item"].to_list() == top


# ---------------------------------------------------------------------------------- search


def test_search_fits_every_point_and_keeps_the_best_on_validation() -> None:
    log = _log()
    result = seqrec.search(
        _tiny(max_epochs=2), {"d_model": [8, 16], "lr": [1e-3]}, log, **COLS, progress=False
    )
    assert result.trials.height == 2 and result.metric == "valid full ndcg@10"
    scores = result.trials["valid_full_ndcg@10"].to_list()
    assert result.best_score == max(scores)
    assert result.best_params == {"d_model": [8, 16][int(np.argmax(scores))], "lr": 1e-3}
    assert result.best_model.metrics_ is not None
    assert result.best_model.recommend(["u1"], k=3).height == 3
    # n_trials of a grid: distinct points, drawn with the seed
    from seqrec.tuning import _points

    grid = {"d_model": [8, 16, 32], "lr": [1e-3, 2e-3]}
    picked = _points(grid, 4, seed=1)
    assert len(picked) == 4 and len({tuple(p.items()) for p in picked}) == 4
    assert picked == _points(grid, 4, seed=1)

    class Uniform:  # a distribution, as scipy.stats gives
        def rvs(self, random_state: int) -> float:
            return float(np.random.default_rng(random_state).uniform(1e-3, 1e-2))

    draws = _points({"lr": Uniform(), "d_model": [16]}, 3, seed=0)
    assert len(draws) == 3 and all(1e-3 <= p["lr"] <= 1e-2 for p in draws)
    with pytest.raises(ConfigError, match="needs n_trials"):
        _points({"lr": Uniform()}, None, 0)
    with pytest.raises(ConfigError, match="changes the data or evaluation settings"):
        seqrec.search(_tiny(), {"min_user_interactions": [1, 2]}, log, **COLS)
    with pytest.raises(ConfigError, match="expected a non-empty list"):
        seqrec.search(_tiny(), {"lr": 1e-3}, log, **COLS)
    assert not math.isnan(result.best_score)
