"""The sampled protocols over several candidate draws: each draw is the one `prepare` makes with
that seed, the stored draw first; the report's spread is computed from each draw's metrics; the
command line and the estimator report it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from seqrec.cli import main
from seqrec.config import EvalConfig
from seqrec.data.prepare import prepare
from seqrec.data.prepared import draw_seeds
from seqrec.data.synthetic import synthetic_interactions
from seqrec.evaluation.protocols import evaluate_split
from seqrec.models.baselines import Popularity

N_NEG = 20  # candidates per user: fewer than the eligible items of every user here


def _log(path: Path) -> Path:
    df = synthetic_interactions(n_users=80, n_items=150, min_len=4, max_len=12, seed=3)
    lines = [f"{u}::{i}::5::{t}" for u, i, t in df.select("user", "item", "timestamp").iter_rows()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _prepared(src: Path, out: Path, seed: int = 42):  # type: ignore[no-untyped-def]
    cfg = EvalConfig(n_negatives=N_NEG, negative_seed=seed)
    return prepare(src, out=out, eval_cfg=cfg, progress=False)


def test_draw_seeds_put_the_stored_seed_first() -> None:
    assert draw_seeds(42, 1) == [42]
    assert draw_seeds(42, 4) == [42, 0, 1, 2]
    assert draw_seeds(1, 4) == [1, 0, 2, 3]  # never the stored seed twice


def test_each_draw_is_the_draw_prepare_makes_with_its_seed(tmp_path: Path) -> None:
    src = _log(tmp_path / "ratings.dat")
    ds = _prepared(src, tmp_path / "p42")
    assert ds.candidate_seed == 42
    for split in ("valid", "test"):
        draws = ds.candidate_draws(split, 3)  # seeds 42 (stored), 0, 1
        assert len(draws) == 3
        for seed, drawn in zip([42, 0, 1], draws, strict=True):
            other = _prepared(src, tmp_path / f"p{seed}-{split}", seed=seed)
            for p in ("uni100", "pop100"):
                assert drawn[p].shape == (len(ds.split.eval_set(split).targets), N_NEG)
                assert np.array_equal(drawn[p], other.negatives(split)[p])
        assert not np.array_equal(draws[0]["uni100"], draws[1]["uni100"])
    with pytest.raises(ValueError, match="expected 1..1,000, got 0"):
        ds.candidate_draws("test", 0)
    with pytest.raises(ValueError, match="expected 1..1,000, got 1000000000"):
        ds.candidate_draws("test", 10**9)  # refused before a seed is drawn


def test_the_spread_is_that_of_each_draws_own_metrics(tmp_path: Path) -> None:
    src = _log(tmp_path / "ratings.dat")
    ds = _prepared(src, tmp_path / "p")
    scorer = Popularity.fit(ds.split.train)
    report = evaluate_split(ds, scorer, "test", draws=3, ks=[10])
    assert set(report.draws) == {"uni100", "pop100"}  # the full ranking draws nothing
    for p in ("uni100", "pop100"):
        values = report.draws[p]["ndcg@10"]
        assert values[0] == report.metrics[p]["ndcg@10"]  # the stored draw first
        for seed, value in zip([42, 0, 1], values, strict=True):
            alone = evaluate_split(_prepared(src, tmp_path / f"s{seed}", seed=seed), scorer, "test")
            assert value == pytest.approx(alone.metrics[p]["ndcg@10"], abs=1e-12)
        assert len(set(values)) > 1  # the draws differ, so the spread measures something
        spread = report.over_draws()[p]["ndcg@10"]
        assert spread["mean"] == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert spread["std"] == pytest.approx(statistics.stdev(values), abs=1e-12)
        assert (spread["min"], spread["max"], spread["draws"]) == (min(values), max(values), 3)
        flat = report.metrics_with_draws()[p]
        assert flat["ndcg@10_mean"] == spread["mean"] and flat["ndcg@10_std"] == spread["std"]
    once = evaluate_split(ds, scorer, "test", ks=[10])
    assert once.draws == {} and once.metrics_with_draws() == once.metrics
    assert once.metrics == report.metrics  # more draws leave the stored draw's numbers as they are


def test_evaluate_draws_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "ratings.dat")
    base = ["evaluate", "pop", "--data", str(src), "--quiet", "--set", f"eval.n_negatives={N_NEG}"]
    assert main([*base, "--draws", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    ds = _prepared(src, tmp_path / "p")
    want = evaluate_split(ds, Popularity.fit(ds.split.train), "test", draws=3).metrics_with_draws()
    assert got["uni100"]["ndcg@10_mean"] == pytest.approx(want["uni100"]["ndcg@10_mean"])
    assert got["pop100"]["hr@10_std"] == pytest.approx(want["pop100"]["hr@10_std"])
    assert "ndcg@10_mean" not in got["full"]
    assert main([*base, "--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "Over 3 candidate draws (eval.negative_seed 42, the stored one, then 0, 1)" in out
    assert "| uni100 | " in out and " ± " in out
    for bad, message in (
        (["--draws", "0"], "--draws: expected an integer >= 1, got 0"),
        (["--draws", "2", "--protocol", "full"], "--draws: the protocols (full) hold no sampled"),
    ):
        assert main([*base, *bad]) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
