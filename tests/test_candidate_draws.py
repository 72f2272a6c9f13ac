"""benchmarks/analyses.py candidate-draws: a trained run evaluated again under other candidate
draws; its own draw must give back the test numbers the run recorded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_the_own_draw_gives_back_the_runs_numbers_and_the_others_differ(
    benchmark_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    from seqrec.config import RunConfig, load_config
    from seqrec.data.prepare import prepare
    from seqrec.data.synthetic import synthetic_interactions
    from seqrec.training.fit import fit

    # more items than the 100 negatives plus any history: a draw is a choice among them (with
    # fewer, every draw would be all the unseen items and give the same number)
    df = synthetic_interactions(n_users=60, n_items=200, min_len=5, max_len=12, seed=1)
    data = tmp_path / "log.csv"
    df.select("user", "item", "timestamp").write_csv(data)
    cfg = load_config(
        RunConfig,
        None,
        [
            "model='bpr-mf'",
            "bpr_mf.d_model=8",
            "train.max_epochs=1",
            "data.min_item_interactions=1",
        ],
    )
    ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, out=tmp_path / "prepared")
    assert ds.stats["items"] > 150
    run = fit(ds, cfg, tmp_path / "run", progress=False, source={"data": str(data)}).run_dir

    got = benchmark_script("candidate_draws").run_draws(run, "uni100", 3, tmp_path / "draws")
    recorded = json.loads((run / "metrics.json").read_text())["test"]["uni100"]
    assert got["own_seed"] == 42 and got["draw_seeds"] == [0, 1, 2]
    assert got["own"] == {"hr@10": recorded["hr@10"], "ndcg@10": recorded["ndcg@10"]}
    ndcg = got["values"]["ndcg@10"]
    assert len(ndcg) == 3 and all(0.0 <= v <= 1.0 for v in ndcg)
    # other candidates, other numbers: a draw is not the run's own draw again
    assert len({recorded["ndcg@10"], *ndcg}) > 1


def test_a_summary_over_draws_by_hand(benchmark_script: Callable[[str], ModuleType]) -> None:
    summary = benchmark_script("candidate_draws")._summary([0.80, 0.82, 0.84], 0.81, 0.82)
    assert summary["mean"] == pytest.approx(0.82) and summary["std"] == pytest.approx(0.02)
    assert (summary["min"], summary["max"], summary["own_draw"]) == (0.80, 0.84, 0.81)
    assert summary["draws_at_or_above_paper"] == 2  # 0.82 and 0.84 reach 0.82
    assert "paper" not in benchmark_script("candidate_draws")._summary([0.1, 0.2], 0.1, None)
