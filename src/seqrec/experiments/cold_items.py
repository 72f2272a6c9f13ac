"""The cold-item protocol: a share of the items is held out of training altogether, then added
to the trained run from its features (`Recommender.add_items`), and each user's held-out target
is ranked after their history.

    split = hold_out_items(ds, share=0.1, seed=0)   # the log without the cold items
    ... train on split.log with item features, then
    rec = Recommender.from_run(run); rec.add_items(items_table.filter(cold ids), save=False)
    report = rank_targets(split, rec.items, scorer=rec.scores)

What is held out and what is ranked (the vocabulary RecTools uses: warm items were seen in
training, cold items were not):
- the cold items: a seeded `share` of the dataset's items, removed from every sequence, so the
  model never sees them, as input or as target;
- each user's target: the last item of their full sequence (the leave-one-out test item), cold
  or warm; their history: every item before it that is warm;
- ranks: among the whole catalogue (warm and cold items, the history's own items left out), and,
  for a cold target, among the cold items alone; rivals tied with the target are taken in a
  uniformly random order (the expectation is reported), so a scorer whose scores tie by design
  is neither helped nor harmed. Metrics are reported per group: `cold` (the target is a cold
  item) and `warm`.

Baseline scorers for a cold item (`content_scorer`, `category_popularity_scorer`) read the same
item features; a uniformly random ranking's HR@k is k / candidates, computed exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import torch

from seqrec.data.ids import IdCodec
from seqrec.data.item_features import ItemFeatures
from seqrec.data.prepared import PreparedDataset
from seqrec.data.preprocess import left_pad

__all__ = [
    "ColdSplit",
    "category_popularity_scorer",
    "content_scorer",
    "hold_out_items",
    "rank_targets",
]

Scorer = Callable[[Sequence[np.ndarray]], torch.Tensor]


@dataclass
class ColdSplit:
    cold: list[Any]  # the held-out items' external ids
    log: pl.DataFrame  # user, item (external ids), each user's rows in time order: the training log
    users: list[Any]  # the users with a target
    histories: list[list[Any]]  # each user's warm items before the target (external ids)
    targets: list[Any]  # each user's target (external id)


def hold_out_items(ds: PreparedDataset, share: float, seed: int) -> ColdSplit:
    """Hold a seeded `share` of `ds`'s items out (see the module's docstring)."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    seqs = ds.sequences
    rng = np.random.default_rng(seed)
    n_cold = max(1, round(share * seqs.n_items))
    cold = np.zeros(seqs.n_items + 1, dtype=bool)
    cold[rng.choice(np.arange(1, seqs.n_items + 1), size=n_cold, replace=False)] = True
    item_ids = np.asarray(ds.item_ids, dtype=object)
    user_ids = np.asarray(ds.user_ids, dtype=object)
    keep = ~cold[seqs.items]
    log = pl.DataFrame(
        {
            "user": user_ids[seqs.user_index()[keep]].tolist(),
            "item": item_ids[seqs.items[keep] - 1].tolist(),
        }
    )
    users, histories, targets = [], [], []
    for u in range(seqs.n_users):
        row = seqs[u]
        if len(row) < 2:
            continue
        history = row[:-1][~cold[row[:-1]]]
        users.append(user_ids[u])
        histories.append(item_ids[history - 1].tolist())
        targets.append(item_ids[row[-1] - 1])
    return ColdSplit(item_ids[np.flatnonzero(cold[1:])].tolist(), log, users, histories, targets)


def rank_targets(
    split: ColdSplit,
    items: IdCodec,
    scorer: Scorer,
    *,
    ks: Sequence[int] = (10,),
    batch_size: int = 256,
) -> dict[str, dict[str, float]]:
    """HR@k and NDCG@k of `scorer` ((B histories of internal ids) -> (B, n_items + 1) scores)
    per group: "cold" and "warm" ranked among the whole catalogue, "cold_among_cold" among the
    cold items; each with "users" (how many targets) and, for the cold groups, "random_hr@k"
    (k / candidates, a uniformly random ranking's expectation)."""
    n = len(items)
    cold_ids, _ = items.encode(split.cold)
    is_cold = np.zeros(n + 1, dtype=bool)
    is_cold[cold_ids] = True
    hist = [items.encode(h)[0] for h in split.histories]
    target = np.asarray([items.lookup(t) or 0 for t in split.targets])
    if (target == 0).any():
        raise ValueError("a target is not in the scorer's catalogue (were the cold items added?)")
    whole: list[tuple[np.ndarray, np.ndarray]] = []  # (above, tied) per batch
    among_cold: list[tuple[np.ndarray, np.ndarray]] = []
    lengths = np.fromiter((len(h) for h in hist), dtype=np.int64, count=len(hist))
    ends = np.cumsum(lengths)
    flat = np.concatenate(hist) if len(hist) else np.zeros(0, np.int64)
    # (users, longest history) left-padded with 0, the padding column: what each row leaves out
    padded = torch.from_numpy(
        left_pad(flat, ends - lengths, ends, max(1, int(lengths.max(initial=0))))
    )
    seen = torch.zeros(len(hist), n + 1, dtype=torch.bool).scatter_(1, padded, True)
    seen[:, 0] = True
    candidates = (n + 1 - seen.sum(1)).double().numpy()  # every item but the history's
    cold_row = torch.as_tensor(is_cold)[None, :]
    for lo in range(0, len(target), batch_size):
        hi = min(lo + batch_size, len(target))
        scores = scorer(hist[lo:hi]).float().cpu()
        t = torch.as_tensor(target[lo:hi])
        t_score = scores[torch.arange(hi - lo), t][:, None].clone()
        out = seen[lo:hi].clone()  # padding, the history and the target itself are left out
        out[torch.arange(hi - lo), t] = True
        # a NaN score counts above the target; a NaN target is below everything
        above = ((scores > t_score) | scores.isnan() | t_score.isnan()) & ~out
        tied = (scores == t_score) & ~out
        whole.append(((above).sum(1).numpy(), tied.sum(1).numpy()))
        among_cold.append(((above & cold_row).sum(1).numpy(), (tied & cold_row).sum(1).numpy()))
    cold = is_cold[target]
    w_above, w_tied = (np.concatenate(x) for x in zip(*whole, strict=True))
    c_above, c_tied = (np.concatenate(x) for x in zip(*among_cold, strict=True))
    report = {
        "cold": _metrics(w_above[cold], w_tied[cold], ks),
        "warm": _metrics(w_above[~cold], w_tied[~cold], ks),
        "cold_among_cold": _metrics(c_above[cold], c_tied[cold], ks),
    }
    n_cold = len(cold_ids)
    for k in ks if n_cold else ():
        report["cold"][f"random_hr@{k}"] = float(
            np.mean(np.minimum(k, candidates[cold]) / candidates[cold])
        )
        report["cold_among_cold"][f"random_hr@{k}"] = min(k, n_cold) / n_cold
    return report


def _metrics(above: np.ndarray, tied: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """{"users", "hr@k", "ndcg@k"} from each target's rivals ranked above it and tied with it:
    the expectation over a uniformly random order of the tied ones (a scorer whose scores tie,
    such as the content baseline on one categorical feature, is neither helped nor harmed).
    A target's ranks above..above+tied are equally likely; those below k count."""
    out: dict[str, float] = {"users": float(len(above))}
    above, tied = above.astype(np.int64), tied.astype(np.int64)
    for k in ks:
        gain = np.concatenate([[0.0], np.cumsum(1 / np.log2(np.arange(k) + 2))])
        lo, hi = np.minimum(above, k), np.minimum(above + tied + 1, k)
        out[f"hr@{k}"] = float(((hi - lo) / (tied + 1)).mean()) if len(above) else 0.0
        out[f"ndcg@{k}"] = float(((gain[hi] - gain[lo]) / (tied + 1)).mean()) if len(above) else 0.0
    return out


def _content_vectors(features: ItemFeatures) -> torch.Tensor:
    """(n_rows, F) each item's features as one unit vector: each categorical feature's values
    one-hot (averaged over a multi-valued one's), the dense columns, side by side."""
    parts = []
    for codes, size in zip(features.codes, features.sizes, strict=True):
        hot = np.zeros((features.n_rows, size + 1), np.float32)
        rows = np.repeat(np.arange(features.n_rows), codes.shape[1])
        np.add.at(hot, (rows, codes.ravel()), 1.0)
        hot[:, 0] = 0
        count = hot.sum(1, keepdims=True)
        parts.append(np.divide(hot, count, out=np.zeros_like(hot), where=count > 0))
    parts.append(features.dense)
    x = torch.from_numpy(np.concatenate(parts, axis=1))
    return torch.nn.functional.normalize(x, dim=1)


def content_scorer(features: ItemFeatures) -> Scorer:
    """The content baseline: the mean of the history's item vectors (`_content_vectors`) ->
    the cosine of every item's vector with it."""
    x = _content_vectors(features)

    def score(histories: Sequence[np.ndarray]) -> torch.Tensor:
        profiles = torch.stack(
            [x[torch.as_tensor(h, dtype=torch.long)].mean(0) if len(h) else x[0] for h in histories]
        )
        return torch.nn.functional.normalize(profiles, dim=1) @ x.T

    return score


def category_popularity_scorer(features: ItemFeatures, popularity: np.ndarray) -> Scorer:
    """Popularity within categories: an item scores the mean training interactions per item of
    its values of the first categorical feature (a cold item, none of its own, is scored by its
    categories'); the same for every history."""
    codes = features.codes[0]
    size = features.sizes[0] + 1
    pop = np.zeros(features.n_rows)  # an item's training interactions (0: a cold item)
    m = min(len(popularity), features.n_rows)
    pop[:m] = popularity[:m]
    valued = codes > 0
    rows = np.repeat(np.arange(features.n_rows), codes.shape[1])[valued.ravel()]
    counts = np.bincount(codes[valued], weights=pop[rows], minlength=size)
    items = np.bincount(codes[valued], weights=(pop[rows] > 0).astype(float), minlength=size)
    per_item = np.divide(counts, items, out=np.zeros(size), where=items > 0)
    score = np.where(valued, per_item[codes], 0.0).sum(1) / np.maximum(valued.sum(1), 1)
    fixed = torch.from_numpy(score.astype(np.float32))

    def scores(histories: Sequence[np.ndarray]) -> torch.Tensor:
        return fixed[None, :].expand(len(histories), -1).clone()

    return scores
