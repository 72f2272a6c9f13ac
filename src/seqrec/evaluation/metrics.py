"""Pure metric functions over 0-based ranks of the single relevant item.

rank r = number of candidates ranked above the target (ties count against it, see evaluate.py).
HR@k = [r < k];  NDCG@k = [r < k] / log2(r + 2);  MRR = 1 / (r + 1).
With one relevant item, HR@k equals Recall@k and MRR equals MAP (BERT4Rec §4.2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = [
    "DEFAULT_KS",
    "hit_rate",
    "metric_names",
    "ndcg",
    "paired_test",
    "per_user",
    "reciprocal_rank",
    "summarize",
]

DEFAULT_KS = (1, 5, 10)


def hit_rate(ranks: np.ndarray, k: int) -> np.ndarray:
    return (np.asarray(ranks) < k).astype(np.float64)


def ndcg(ranks: np.ndarray, k: int) -> np.ndarray:
    r = np.asarray(ranks, dtype=np.float64)
    return np.where(r < k, 1.0 / np.log2(r + 2.0), 0.0)


def reciprocal_rank(ranks: np.ndarray) -> np.ndarray:
    return 1.0 / (np.asarray(ranks, dtype=np.float64) + 1.0)


def metric_names(ks: Sequence[int] = DEFAULT_KS) -> list[str]:
    """The reported metrics: HR@k for every k, NDCG@k for k > 1 (NDCG@1 == HR@1), MRR."""
    return [f"hr@{k}" for k in ks] + [f"ndcg@{k}" for k in ks if k > 1] + ["mrr"]


def per_user(ranks: np.ndarray, name: str) -> np.ndarray:
    """One metric's value for every user, by name (`hr@10`, `ndcg@5`, `mrr`)."""
    if name == "mrr":
        return reciprocal_rank(ranks)
    kind, _, k = name.partition("@")
    if kind == "hr" and k.isdigit():
        return hit_rate(ranks, int(k))
    if kind == "ndcg" and k.isdigit():
        return ndcg(ranks, int(k))
    raise ValueError(f"unknown metric {name!r}; expected hr@K, ndcg@K or mrr")


def summarize(ranks: np.ndarray, ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """Mean of every reported metric over users."""
    if len(ranks) == 0:
        raise ValueError("no ranks to summarize")
    return {name: float(per_user(ranks, name).mean()) for name in metric_names(ks)}


def paired_test(
    ranks_a: np.ndarray, ranks_b: np.ndarray, metric: str = "ndcg@10"
) -> dict[str, float]:
    """Compare two result sets user by user (same users, same order): paired t-test and Wilcoxon
    signed-rank test on the per-user metric. p-values are two-sided."""
    a, b = np.asarray(ranks_a), np.asarray(ranks_b)
    if a.shape != b.shape:
        raise ValueError(f"paired test needs the same users: {a.shape} vs {b.shape}")
    va, vb = per_user(a, metric), per_user(b, metric)
    diff = va - vb
    if np.all(diff == 0):
        t_p = w_p = 1.0
        t_stat = 0.0
    else:
        t = stats.ttest_rel(va, vb)
        t_stat, t_p = float(t.statistic), float(t.pvalue)
        w_p = float(stats.wilcoxon(va, vb, zero_method="wilcox").pvalue)
    return {
        "metric_a": float(va.mean()),
        "metric_b": float(vb.mean()),
        "diff": float(diff.mean()),
        "t_statistic": t_stat,
        "t_pvalue": t_p,
        "wilcoxon_pvalue": w_p,
        "n_users": int(len(a)),
    }
