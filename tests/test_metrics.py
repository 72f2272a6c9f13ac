from __future__ import annotations

import math

import numpy as np
import pytest

from seqrec.evaluation.metrics import (
    hit_rate,
    ndcg,
    paired_test,
    per_user,
    reciprocal_rank,
    summarize,
)


def test_hand_computed_values() -> None:
    ranks = np.array([2])  # target at 0-based rank 2
    assert hit_rate(ranks, 10)[0] == 1.0
    assert hit_rate(ranks, 2)[0] == 0.0
    assert ndcg(ranks, 10)[0] == pytest.approx(1 / math.log2(4)) == 0.5
    assert ndcg(ranks, 2)[0] == 0.0
    assert reciprocal_rank(ranks)[0] == pytest.approx(1 / 3)
    assert ndcg(np.array([0]), 1)[0] == 1.0


def test_summarize_means_over_users() -> None:
    m = summarize(np.array([0, 1, 9, 10]), ks=(1, 10))
    assert m["hr@1"] == 0.25
    assert m["hr@10"] == 0.75
    assert m["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(11)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 10 + 1 / 11) / 4)
    assert list(m) == ["hr@1", "hr@10", "ndcg@10", "mrr"]


def test_ndcg_never_decreases_with_k() -> None:
    ranks = np.random.default_rng(0).integers(0, 200, size=1000)
    values = [per_user(ranks, f"ndcg@{k}").mean() for k in (1, 5, 10, 20, 50, 100, 200)]
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] > values[0]


def test_unknown_metric() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        per_user(np.array([1]), "precision@3")


def test_paired_test_against_hand_formula() -> None:
    a = np.array([0, 0, 1, 3, 20, 0, 2, 0])
    b = np.array([5, 1, 1, 30, 20, 9, 2, 4])
    r = paired_test(a, b, "mrr")
    d = 1 / (a + 1) - 1 / (b + 1)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert r["t_statistic"] == pytest.approx(t)
    assert r["diff"] == pytest.approx(d.mean())
    assert 0 < r["t_pvalue"] < 0.05 and 0 < r["wilcoxon_pvalue"] < 0.1
    same = paired_test(a, a, "mrr")
    assert same["t_pvalue"] == 1.0 and same["wilcoxon_pvalue"] == 1.0
    with pytest.raises(ValueError, match="same users"):
        paired_test(a, b[:3])
