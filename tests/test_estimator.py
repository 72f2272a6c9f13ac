"""Your own data in ten lines: a pandas or polars DataFrame of string ids with a datetime column,
rows shuffled -> `fit` -> `recommend` as a DataFrame; save/load; clone; similar items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

import seqrec
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError, DataError

pd = pytest.importorskip("pandas")  # the dev extra installs it; seqrec itself does not need it


def _log(kind: str) -> Any:
    """A practitioner's log: string user and item ids, a datetime column, rows shuffled."""
    df = synthetic_interactions(n_users=70, n_items=40, min_len=6, max_len=20, seed=9)
    frame = pl.DataFrame(
        {
            "user_id": [f"user_{u}" for u in df["user"].to_list()],
            "sku": [f"sku-{i:04d}" for i in df["item"].to_list()],
            "ts": pl.from_epoch(df["timestamp"], time_unit="s"),
        }
    ).sample(fraction=1.0, shuffle=True, seed=0)
    if kind == "pandas":
        return pd.DataFrame({c: frame[c].to_list() for c in frame.columns})
    return frame


def _small(**more: Any) -> seqrec.SASRec:
    return seqrec.SASRec(d_model=16, max_len=10, max_epochs=3, threads=1, **more)


@pytest.mark.parametrize("kind", ["pandas", "polars"])
def test_a_dataframe_in_recommendations_out(kind: str, tmp_path: Path) -> None:
    log = _log(kind)
    model = _small().fit(log, user_col="user_id", item_col="sku", time_col="ts")
    users = ["user_3", "user_7", "user_11"]
    recs = model.recommend(users, k=10, filter_viewed=True, frame="polars")
    assert isinstance(recs, pl.DataFrame) and recs.columns == ["user", "rank", "item", "score"]
    assert recs.height == 30 and recs.group_by("user").len()["len"].to_list() == [10, 10, 10]
    seen = pl.DataFrame({c: list(log[c]) for c in ("user_id", "sku")} if kind == "pandas" else log)
    for user in users:
        mine = set(recs.filter(pl.col("user") == user)["item"].to_list())
        viewed = set(seen.filter(pl.col("user_id") == user)["sku"].to_list())
        assert len(mine) == 10 and not mine & viewed
        assert all(i.startswith("sku-") for i in mine)
    assert (recs["rank"].to_list()[:10]) == list(range(1, 11))
    # save -> load gives identical recommendations
    saved = model.save(tmp_path / "model")
    again = seqrec.load(saved).recommend(users, k=10, frame="polars")
    assert again.drop("score").equals(recs.drop("score"))  # the same items, in the same order
    assert again["score"].to_list() == pytest.approx(recs["score"].to_list(), abs=1e-5)
    # pandas out, on request
    if kind == "pandas":
        out = model.recommend(users[:1], k=3, as_pandas=True)
        assert list(out.columns) == ["user", "rank", "item", "score"] and len(out) == 3


def test_params_clone_and_errors() -> None:
    from sklearn.base import clone

    model = _small(lr=5e-3)
    assert model.get_params()["d_model"] == 16 and model.get_params()["lr"] == 5e-3
    copy = clone(model)
    assert copy is not model and copy.get_params() == model.get_params()
    assert model.set_params(d_model=32) is model and model.get_params()["d_model"] == 32
    cfg = model.run_config()
    assert (cfg.sasrec.d_model, cfg.train.lr, cfg.train.loss) == (32, 5e-3, "ce")
    with pytest.raises(ConfigError, match="unknown parameter 'widht'"):
        seqrec.SASRec(widht=3).run_config()
    with pytest.raises(ConfigError, match=r"sasrec.n_heads must be in \[1, 1024\]"):
        _small(n_heads=0).fit(_log("polars"), user_col="user_id", item_col="sku", time_col="ts")
    with pytest.raises(DataError) as err:
        _small().fit(_log("polars"), user_col="uid", item_col="sku", time_col="ts")
    assert "\n" not in str(err.value) and "missing column(s) uid" in str(err.value)
    assert "user_id, sku, ts" in str(err.value) and "time_col=None" not in str(err.value)
    # a log without timestamps: the line says how to read it in row order
    with pytest.raises(DataError, match=r"missing column\(s\) timestamp; .*time_col=None reads"):
        _small().fit(_log("polars").drop("ts"), user_col="user_id", item_col="sku")
    with pytest.raises(seqrec.SeqrecError, match="not fitted"):
        _small().recommend(["user_3"])


def test_similar_items_histories_and_evaluate(tmp_path: Path) -> None:
    model = seqrec.Model("gru4rec", d_model=16, hidden=16, max_len=10, max_epochs=2, threads=1)
    model.fit(_log("polars"), user_col="user_id", item_col="sku", time_col=None)
    a, b = model.dataset_.item_ids[:2]
    sim = model.similar_items([a, b], k=5)
    assert sim.columns == ["item", "rank", "similar", "score"] and sim.height == 10
    assert a not in sim.filter(pl.col("item") == a)["similar"].to_list()
    assert sim["score"].to_list()[:5] == sorted(sim["score"].to_list()[:5], reverse=True)
    with pytest.raises(ConfigError, match="unknown item"):
        model.similar_items(["no-such-sku"])
    hist = model.recommend_histories([[a, b], [], ["unknown"]], k=4)
    assert hist.group_by("history").len().sort("history")["len"].to_list() == [4, 4, 4]
    metrics = model.evaluate(protocols=("full", "pop100"))
    assert set(metrics) == {"full", "pop100"} and 0 <= metrics["full"]["ndcg@10"] <= 1
    assert model.metrics_ is not None and model.metrics_["test"]["full"] == metrics["full"]
    drawn = model.evaluate(protocols=("full", "pop100"), draws=3)  # the stored draw and 2 more
    assert drawn["pop100"]["ndcg@10"] == metrics["pop100"]["ndcg@10"]
    assert drawn["pop100"]["ndcg@10_std"] >= 0 and "ndcg@10_mean" not in drawn["full"]
    with pytest.raises(ConfigError, match="draws: expected an integer >= 1"):
        model.evaluate(draws=0)
    # every user to a file, in parts: the rows `recommend` gives for all of them
    path = model.recommend_all(tmp_path / "all.parquet", k=4, progress=False)
    every = model.recommend(k=4, frame="polars")
    assert pl.read_parquet(path).drop("score").equals(every.drop("score"))
    with pytest.raises(ConfigError, match="exists; replace=True replaces it"):
        model.recommend_all(path, k=4, progress=False)
    assert model.recommend_all(path, k=2, progress=False, replace=True) == path
    assert pl.read_parquet(path).height == 2 * every.get_column("user").n_unique()


def test_the_time_split_as_keywords_and_an_unquoted_date() -> None:
    """`split="time", time_cut=...` by name (a string, a date or a datetime), and a date given
    unquoted in `set` or on the command line (it was a confusing type error without the inner
    quotes)."""
    import datetime as dt

    from seqrec.config import RunConfig, load_config

    for cut, want in [
        ("2000-12-01", "2000-12-01"),
        (dt.date(2000, 12, 1), "2000-12-01"),
        (dt.datetime(2000, 12, 1, 6, 30), "2000-12-01T06:30:00"),
        (0.8, 0.8),
    ]:
        data = seqrec.SASRec(split="time", time_cut=cut).run_config().data
        assert (data.split, data.time_cut) == ("time", want)
    cfg = load_config(RunConfig, None, ['model="sasrec"', "data.time_cut=2000-12-01"])
    assert cfg.data.time_cut == "2000-12-01"
    assert seqrec.SASRec(set=["data.time_cut=2000-12-01"]).run_config().data.time_cut == (
        "2000-12-01"
    )
    with pytest.raises(ConfigError, match="unknown parameter 'time_cutt'"):
        seqrec.SASRec(time_cutt=0.5).run_config()
