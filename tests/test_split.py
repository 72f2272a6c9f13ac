from __future__ import annotations

import pytest

from seqrec.data.preprocess import Sequences
from seqrec.data.split import leave_one_out


def test_leave_one_out_inputs_and_targets() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]], n_items=10)
    s = leave_one_out(seqs)
    # users with < 3 items are training-only and not evaluated
    assert s.test.users.tolist() == [0, 2]
    assert s.train[0].tolist() == [1, 2, 3] and s.train[1].tolist() == [6, 7]
    assert s.train[2].tolist() == [8]
    assert s.valid.targets.tolist() == [4, 9]
    assert s.test.targets.tolist() == [5, 10]
    # validation never sees the validation or the test item
    assert s.valid.histories[0].tolist() == [1, 2, 3]
    # the test input is everything before the test item, validation item included (a known trap)
    assert s.test.histories[0].tolist() == [1, 2, 3, 4]
    assert s.test.histories[1].tolist() == [8, 9]


def test_validation_input_never_contains_test_item() -> None:
    seqs = Sequences.from_lists([[3, 1, 2, 7, 9, 4], [5, 6, 8, 1]], n_items=9)
    s = leave_one_out(seqs)
    for e, user in enumerate(s.valid.users):
        full = seqs[user].tolist()
        assert s.valid.histories[e].tolist() == full[:-2]
        assert s.test.histories[e].tolist() == full[:-1]


def test_training_on_train_plus_valid_adds_each_validation_item_and_never_a_test_one() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]], n_items=10)
    s = leave_one_out(seqs)
    assert [s.training("train")[u].tolist() for u in range(3)] == [[1, 2, 3], [6, 7], [8]]
    # the original BERT4Rec code's training data: all but the test item (users with < 3 items:
    # all of theirs, as before)
    both = s.training("train+valid")
    assert [both[u].tolist() for u in range(3)] == [[1, 2, 3, 4], [6, 7], [8, 9]]
    assert both.n_items == 10
    assert s.training("all") is seqs  # every item: the state to serve
    with pytest.raises(ValueError, match="train_on"):
        s.training("everything")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- time split


def _hand_made_log() -> tuple[object, list[tuple[str, str, int]]]:
    """Five users around a cut at t = 100: a (2 before, 3 after), b (1 before, 2 after), c (3
    before, 1 after), d (all after: cold), e (all before)."""
    import polars as pl

    rows = [
        ("a", "i1", 10), ("a", "i2", 20), ("a", "i3", 100), ("a", "i4", 110), ("a", "i5", 120),
        ("b", "i2", 50), ("b", "i5", 130), ("b", "i1", 140),
        ("c", "i3", 30), ("c", "i4", 40), ("c", "i1", 60), ("c", "i2", 150),
        ("d", "i4", 105), ("d", "i5", 115), ("d", "i3", 125),
        ("e", "i5", 5), ("e", "i3", 15), ("e", "i2", 25),
    ]  # fmt: skip
    order = [3, 17, 0, 9, 14, 5, 11, 1, 16, 7, 2, 13, 4, 12, 6, 15, 8, 10]  # shuffled
    frame = pl.DataFrame(
        {
            "user": [rows[i][0] for i in order],
            "item": [rows[i][1] for i in order],
            "ts": [rows[i][2] for i in order],
        }
    )
    return frame, rows


def test_the_time_split_trains_before_the_cut_and_holds_out_the_next_items_after_it(
    tmp_path: object,
) -> None:
    from pathlib import Path

    import numpy as np

    from seqrec.config import DataConfig
    from seqrec.data.prepare import prepare
    from seqrec.data.prepared import load_prepared

    frame, rows = _hand_made_log()
    cfg = DataConfig(min_user_interactions=1, min_item_interactions=1, split="time", time_cut=100)
    ds = prepare(frame, data_cfg=cfg, time_col="ts", out=Path(str(tmp_path)) / "p", progress=False)
    items = {i: ds.item_ids.index(i) + 1 for i in ("i1", "i2", "i3", "i4", "i5")}
    users = {u: ds.user_ids.index(u) for u in "abcde"}
    time_of = {(u, items[i]): t for u, i, t in rows}
    split = ds.split
    # training: every interaction before the cut, and nothing at or after it
    for name, u in users.items():
        trained = split.train.items[split.train.offsets[u] : split.train.offsets[u + 1]]
        assert all(time_of[(name, int(i))] < 100 for i in trained)
        want = [items[i] for n, i, t in sorted(rows, key=lambda r: r[2]) if n == name and t < 100]
        assert trained.tolist() == want
    # evaluated: a and b (history before the cut, two items after); targets after the cut
    assert sorted(split.test.users.tolist()) == sorted([users["a"], users["b"]])
    by_user = dict(zip(split.valid.users.tolist(), split.valid.targets.tolist(), strict=True))
    assert by_user == {users["a"]: items["i3"], users["b"]: items["i5"]}
    by_user = dict(zip(split.test.users.tolist(), split.test.targets.tolist(), strict=True))
    assert by_user == {users["a"]: items["i4"], users["b"]: items["i1"]}
    for es in (split.valid, split.test):
        for u, target in zip(es.users.tolist(), es.targets.tolist(), strict=True):
            name = ds.user_ids[u]
            assert time_of[(name, target)] >= 100
    # the test input is the history before the cut and the validation item
    a = split.test.users.tolist().index(users["a"])
    hist = split.test.histories
    assert hist.items[hist.offsets[a] : hist.offsets[a + 1]].tolist() == [
        items["i1"], items["i2"], items["i3"]
    ]  # fmt: skip
    # who is not evaluated, and why, is recorded; the split survives a reload
    assert ds.stats["time_split"] == {
        "cut": 100, "evaluated": 2, "cold": 1, "one_after": 1, "before_only": 1
    }  # fmt: skip
    again = load_prepared(ds.path)
    assert np.array_equal(again.split.test.targets, split.test.targets)
    # a fraction cuts at that share of the interactions: 0.5 of 18 -> the 10th time (100)
    half = DataConfig(min_user_interactions=1, min_item_interactions=1, split="time", time_cut=0.5)
    ds2 = prepare(
        frame, data_cfg=half, time_col="ts", out=Path(str(tmp_path)) / "q", progress=False
    )
    assert ds2.stats["time_split"]["cut"] == 100


def test_a_time_split_without_a_cut_or_times_is_one_line(tmp_path: object) -> None:
    from pathlib import Path

    from seqrec.config import DataConfig
    from seqrec.data.prepare import prepare
    from seqrec.errors import ConfigError

    frame, _ = _hand_made_log()
    with pytest.raises(ConfigError, match="needs data.time_cut"):
        prepare(frame, data_cfg=DataConfig(split="time"), time_col="ts", progress=False)
    with pytest.raises(ConfigError, match="needs a time column"):
        prepare(frame, data_cfg=DataConfig(split="time", time_cut=0.5), time_col=None)
    with pytest.raises(ConfigError, match="expected a fraction in"):
        prepare(
            frame,
            data_cfg=DataConfig(split="time", time_cut="yesterday"),
            time_col="ts",
            out=Path(str(tmp_path)) / "p",
            progress=False,
        )
