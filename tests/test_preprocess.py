from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from seqrec.data.preprocess import Sequences, dataset_stats, kcore_mask, preprocess
from seqrec.errors import DataError


def _frame(rows: list[tuple[object, object, int]]) -> pl.DataFrame:
    users, items, ts = zip(*rows, strict=True)
    return pl.DataFrame(
        {
            "user": list(users),
            "item": list(items),
            "timestamp": list(ts),
            "line": list(range(len(rows))),
        }
    )


def test_equal_timestamps_keep_file_order_not_item_order() -> None:
    # items 30, 10, 20 all at t=5 -> file order 30, 10, 20 (sorting by item id: 10, 20, 30)
    df = _frame([(1, 30, 5), (1, 10, 5), (1, 40, 1), (1, 20, 5)])
    pre = preprocess(df, min_user_interactions=1, min_item_interactions=1)
    external = [pre.item_ids[int(i) - 1] for i in pre.sequences[0]]
    assert external == [40, 30, 10, 20]


def test_users_sorted_and_items_keep_contiguous_ids() -> None:
    df = _frame([(2, 3, 0), (1, 1, 0), (1, 2, 1), (2, 1, 1)])
    pre = preprocess(df, min_user_interactions=1, min_item_interactions=1)
    assert pre.user_ids.to_list() == [1, 2]
    assert pre.item_ids.to_list() == [1, 2, 3]  # already 1..n: internal ids equal external ones
    assert pre.sequences[0].tolist() == [1, 2]
    assert pre.sequences[1].tolist() == [3, 1]


def test_kcore_is_iterative() -> None:
    # min 2 per user and per item. Item c occurs once -> dropped; then user v has 1 left -> dropped;
    # then item b has 1 left -> dropped; then user w has 1 left -> dropped ... only u remains.
    users = np.array([0, 0, 0, 1, 1, 2, 2, 3, 3])  # u u u v v w w x x
    items = np.array([0, 3, 3, 1, 2, 1, 3, 0, 3])  # a d d b c b d a d
    keep = kcore_mask(users, items, 2, 2)
    # hand-computed fixpoint: c (once) goes; v then has 1 -> goes; b then has 1 -> goes;
    # w then has 1 (d) -> goes. Left: u (a,d,d), x (a,d): a=2, d=3.
    assert keep.tolist() == [True, True, True, False, False, False, False, True, True]


def test_kcore_thresholds_are_separate() -> None:
    df = _frame([(1, 1, 0), (1, 2, 1), (2, 1, 2)])
    pre = preprocess(df, min_user_interactions=2, min_item_interactions=1)
    assert pre.user_ids.to_list() == [1]
    assert pre.item_ids.to_list() == [1, 2]
    with pytest.raises(DataError, match="no interactions left"):
        preprocess(df, min_user_interactions=5, min_item_interactions=1)


def test_stats_follow_table1_definition() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5], [2, 3, 4, 5, 1, 2]], n_items=5)
    stats = dataset_stats(seqs)
    assert stats["users"] == 2 and stats["items"] == 5 and stats["actions"] == 11
    assert stats["avg_length"] == pytest.approx(
        (11 - 4) / 2
    )  # training part, as Table 1's ML-1m row
    assert stats["density"] == pytest.approx((11 - 4) / (2 * 5))
    assert stats["avg_length_all"] == pytest.approx(5.5)


def test_sequences_take_drops_tail() -> None:
    seqs = Sequences.from_lists([[1, 2, 3], [4], [5, 6, 7, 8]])
    sub = seqs.take(np.array([2, 0]), drop_last=np.array([1, 2]))
    assert [sub[i].tolist() for i in range(sub.n_users)] == [[5, 6, 7], [1]]
    assert seqs.position_index().tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
