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
    with pytest.raises(ValueError, match="train_on"):
        s.training("all")  # type: ignore[arg-type]
