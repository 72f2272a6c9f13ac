"""A small synthetic interaction log with sequential structure a model can learn.

SYNTHETIC, not real data: used by the tests and by the main job when no real dataset is reachable.
Items sit on a hidden ring; each user starts at a random item and, at every step, moves to the
ring successor of the current item with probability `p_next` (else jumps to an item drawn from a
Zipf-like popularity law). A sequential model can therefore predict the next item far better than
popularity can; POP scores only what the popularity law gives it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["synthetic_interactions"]


def synthetic_interactions(
    n_users: int = 500,
    n_items: int = 200,
    min_len: int = 8,
    max_len: int = 40,
    p_next: float = 0.8,
    seed: int = 0,
) -> pl.DataFrame:
    """Interactions table (user, item, timestamp, line); users 1.., items 1001.."""
    rng = np.random.default_rng(seed)
    ring = rng.permutation(n_items)  # successor of item ring[j] is ring[j + 1]
    succ = np.empty(n_items, dtype=np.int64)
    succ[ring] = np.roll(ring, -1)
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    pop = pop[rng.permutation(n_items)]
    pop /= pop.sum()
    lengths = rng.integers(min_len, max_len + 1, size=n_users)
    steps = int(lengths.max())
    cur = rng.choice(n_items, size=n_users, p=pop)
    seq = np.empty((n_users, steps), dtype=np.int64)
    for t in range(steps):  # vectorised over users; steps is small
        seq[:, t] = cur
        jump = rng.choice(n_items, size=n_users, p=pop)
        cur = np.where(rng.random(n_users) < p_next, succ[cur], jump)
    keep = np.arange(steps)[None, :] < lengths[:, None]
    users = np.repeat(np.arange(1, n_users + 1), lengths)
    items = seq[keep] + 1001
    # a shared clock with some ties, so the stable sort matters
    ts = 1_000_000_000 + np.repeat(rng.integers(0, 10**6, size=n_users), lengths)
    ts = ts + (np.arange(keep.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)) // 2 * 60
    return pl.DataFrame(
        {
            "user": users.astype(np.int64),
            "item": items.astype(np.int64),
            "timestamp": ts.astype(np.int64),
            "line": np.arange(len(users), dtype=np.int64),
        }
    )
