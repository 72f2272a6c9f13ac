"""The stored candidates of the sampled protocols (`uni100`, `pop100`): for each evaluated user,
100 negatives drawn once per split and seed, uniformly or in proportion to popularity, never an
item of the user's sequence (docs/design/evaluation.md; seqrec.evaluation.protocols ranks against
them). They live with the data: `prepare` draws them and stores them beside the sequences, so every
model is ranked against the same ones."""

from __future__ import annotations

import numpy as np

from seqrec.data.preprocess import Sequences

__all__ = [
    "N_NEGATIVES",
    "PROTOCOLS",
    "SAMPLED_PROTOCOLS",
    "item_popularity",
    "sample_negatives",
]

PROTOCOLS = ("full", "uni100", "pop100")
SAMPLED_PROTOCOLS = ("uni100", "pop100")
N_NEGATIVES = 100


def item_popularity(seqs: Sequences) -> np.ndarray:
    """(n_items + 1,) interaction count of every item id (index 0, padding, is 0)."""
    return np.bincount(seqs.items, minlength=seqs.n_items + 1).astype(np.int64)


# the fewest users drawn for at a time, whatever the catalogue (above 65,536 items it is more
# than the dense fallback's bound; below, the bound is larger and the draws are as they were)
MIN_CHUNK_USERS = 256


def sample_negatives(
    seqs: Sequences,
    users: np.ndarray,
    *,
    n: int = N_NEGATIVES,
    weights: np.ndarray | None = None,
    seed: int = 0,
    max_cells: int = 1 << 24,
) -> np.ndarray:
    """(E, n) negatives for each user in `users`, without replacement, never an item of the user's
    full sequence. `weights` (n_items + 1,): sampling weights (None = uniform). A user with fewer
    than n eligible items gets all of them, the rest of the row padded with 0.

    Sampling without replacement in proportion to the weights, restricted to the eligible items,
    is the same as reading an i.i.d. stream of draws from the full weights and keeping the first
    n distinct eligible ones; that stream is what we generate, vectorised over users, extending
    it for the users that need more draws. Users whose eligible items are too few or too light
    for the stream to finish quickly fall back to the Gumbel top-k trick over the whole catalogue.
    """
    rng = np.random.default_rng(seed)
    n_cols = seqs.n_items + 1
    w = np.ones(n_cols) if weights is None else np.asarray(weights, dtype=np.float64).copy()
    w[0] = 0.0  # padding is never a candidate
    cdf = np.cumsum(w) / w.sum()
    # int32 ids: a million users' candidates are 400 MB a split and protocol, not 800
    out = np.zeros((len(users), n), dtype=np.int32)
    zero = w == 0  # never a candidate: padding and zero-weight items
    n_zero = int(zero.sum())
    # users a step: the fallback's dense (rows, catalogue) mask bounds it, but never below
    # MIN_CHUNK_USERS (a catalogue of millions would draw one user at a time; the fallback
    # then takes its rows in pieces of that bound)
    dense_rows = max(1, max_cells // n_cols)
    chunk = max(MIN_CHUNK_USERS, dense_rows)
    for lo in range(0, len(users), chunk):
        rows = np.asarray(users[lo : lo + chunk])
        seen_seqs = seqs.take(rows)
        # never a candidate either: the user's own items, as sorted keys row * n_cols + item (a
        # dense (rows, catalogue) mask would cost the catalogue's size per user)
        seen = np.unique(seen_seqs.user_index() * n_cols + seen_seqs.items)
        block = out[lo : lo + len(rows)]
        counted = np.bincount(seen[~zero[seen % n_cols]] // n_cols, minlength=len(rows))
        eligible = n_cols - n_zero - counted
        todo = np.flatnonzero(eligible >= 2 * n)  # the stream finishes fast for these
        draws = np.zeros((len(todo), 0), dtype=np.int64)
        m = n + n // 2 + 16
        for _ in range(6):
            if len(todo) == 0:
                break
            new = _inverse_cdf(cdf, rng.random((len(todo), m)))
            draws = np.concatenate([draws, np.minimum(new, n_cols - 1)], axis=1)
            blocked = zero[draws] | _among(todo[:, None] * n_cols + draws, seen)
            keep = _first_distinct(draws, n_cols) & ~blocked
            done = keep.sum(1) >= n
            picked = np.cumsum(keep, axis=1) <= n
            sel = keep & picked & done[:, None]
            block[todo[done]] = draws[done][sel[done]].reshape(-1, n)
            todo, draws = todo[~done], draws[~done]
            m *= 2
        unfinished = np.flatnonzero(block[:, 0] == 0)  # rows the stream did not finish
        for at in range(0, len(unfinished), dense_rows):
            rest = unfinished[at : at + dense_rows]
            mask = np.repeat(zero[None, :], len(rest), axis=0)
            mine = seen[np.isin(seen // n_cols, rest)]
            mask[np.searchsorted(rest, mine // n_cols), mine % n_cols] = True
            block[rest] = _gumbel_top_n(w, mask, n, rng)
    return out


def _inverse_cdf(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """searchsorted(cdf, u, side="right"), the same values, looked up in sorted order: on a
    catalogue of millions the lookups then walk the cdf instead of missing the cache at every
    step of every search."""
    flat = u.ravel()
    order = np.argsort(flat)
    out = np.empty(flat.shape, dtype=np.int64)
    out[order] = np.searchsorted(cdf, flat[order], side="right")
    return out.reshape(u.shape)


def _among(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """keys (any shape): True where a key is in `sorted_keys` (sorted, distinct)."""
    if len(sorted_keys) == 0:
        return np.zeros(keys.shape, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _first_distinct(draws: np.ndarray, n_cols: int) -> np.ndarray:
    """(R, M) bool: True where draws[r, j] is the first occurrence of its value in row r."""
    keys = (np.arange(draws.shape[0])[:, None] * n_cols + draws).ravel()
    _, first = np.unique(keys, return_index=True)
    mask = np.zeros(keys.shape, dtype=bool)
    mask[first] = True
    return mask.reshape(draws.shape)


def _gumbel_top_n(w: np.ndarray, seen: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exact weighted sampling without replacement (Gumbel top-k); 0-padded when too few."""
    with np.errstate(divide="ignore"):  # weight 0 -> log 0 = -inf: never drawn
        keys = np.log(w)[None, :] + rng.gumbel(size=seen.shape)
    keys[seen] = -np.inf
    k = min(n, seen.shape[1])
    top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    top_keys = np.take_along_axis(keys, top, axis=1)
    order = np.argsort(-top_keys, axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1)
    top_keys = np.take_along_axis(top_keys, order, axis=1)
    out = np.zeros((seen.shape[0], n), dtype=np.int64)
    out[:, :k] = np.where(np.isfinite(top_keys), top, 0)
    return out
