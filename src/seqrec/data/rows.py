"""How training sequences become rows of a batch: the sliding windows of a long history, batches
of similar lengths, and packing several sequences into one row (seqrec.data.batches reads
them)."""

from __future__ import annotations

import numpy as np

__all__ = ["pack_rows", "sliding_windows"]


def length_grouped(
    lengths: np.ndarray, batch_size: int, bucket_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Sample indices split into batches: shuffled, sorted by length within pools of
    `bucket_batches` batches (so a batch is cut to little padding), batch order shuffled."""
    perm = rng.permutation(len(lengths))
    pool = batch_size * max(1, bucket_batches)
    batches = []
    for lo in range(0, len(perm), pool):
        chunk = perm[lo : lo + pool]
        if bucket_batches > 1:
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def pack_rows(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Place sequences of `lengths` (B,) side by side in rows: (row, offset of its first slot,
    row width). Vectorised: the number of rows is the total length over the longest, and the
    sequences, longest first, are dealt to the rows in snake order (0..R-1, R-1..0, ...), which
    evens out the rows; the width is the fullest row's length. On ML-1M batches of 128 it keeps
    ~1.17 slots per item (first-fit decreasing, a Python loop per sequence: 1.01; unpacked 1.87).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    n_rows = int(-(-lengths.sum() // max(1, int(lengths.max()))))
    order = np.argsort(-lengths, kind="stable")
    k = np.empty(n, dtype=np.int64)
    k[order] = np.arange(n) % (2 * n_rows)
    row = np.where(k < n_rows, k, 2 * n_rows - 1 - k)
    # offsets: a running sum of lengths within each row, in dealing order
    by_row = order[np.argsort(row[order], kind="stable")]
    ends = np.cumsum(lengths[by_row])
    row_start = np.concatenate([[0], ends[:-1]])
    first = np.searchsorted(row[by_row], row[by_row], side="left")  # first of each one's row
    offset = np.empty(n, dtype=np.int64)
    offset[by_row] = row_start - row_start[first]
    width = int((offset + lengths).max())
    return row, offset, width


def packed_slots(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Where `pack_rows` puts every item of sequences of `lengths`: (seq, t, slot, rows, width),
    the sequence of each item, its index in that sequence and its flat index in the
    (rows, width) packed layout."""
    row, offset, width = pack_rows(lengths)
    seq = np.repeat(np.arange(len(lengths)), lengths)  # the sequence of every item
    t = np.arange(len(seq)) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # its index
    slot = row[seq] * width + offset[seq] + t
    return seq, t, slot, int(row.max()) + 1, width


def sliding_windows(lengths: np.ndarray, max_len: int, step: float) -> tuple[np.ndarray, ...]:
    """(row, start, end) of every training window; end is exclusive, offsets within the row.

    A row of at most `max_len` items is one window. A longer row gives windows ending at its
    last item and stepping back by int(step * max_len), plus one starting at 0; step 0 keeps only
    the last window.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    stride = int(step * max_len)
    rows, starts = [np.arange(len(lengths))], [np.maximum(lengths - max_len, 0)]
    if stride > 0:
        long = np.flatnonzero(lengths > max_len)
        extra = (lengths[long] - max_len - 1) // stride  # further windows with start > 0
        k = np.arange(int(extra.max()) if len(extra) else 0) + 1  # steps back from the last
        if len(k):
            grid = lengths[long, None] - max_len - k[None, :] * stride  # (U, K)
            valid = k[None, :] <= extra[:, None]
            rows.append(np.broadcast_to(long[:, None], grid.shape)[valid])
            starts.append(grid[valid])
        rows.append(long)  # the window that starts at the first item
        starts.append(np.zeros(len(long), dtype=np.int64))
    row, start = np.concatenate(rows), np.concatenate(starts)
    order = np.lexsort((start, row))
    row, start = row[order], start[order]
    end = np.minimum(start + max_len, lengths[row])
    return row, start, end
