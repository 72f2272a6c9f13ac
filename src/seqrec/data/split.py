"""Leave-one-out (BERT4Rec §4.2, SASRec §IV-A): per user, the last item is the test target, the
second-last the validation target, the rest is training.

- the validation input is the history *before* the validation item (it never sees the test item);
- the test input is the full history before the test item, validation item included;
- users with fewer than 3 items have nothing to hold out: all their items are training data and
  they are not evaluated (with the papers' 5-core filter this never happens).

`LeaveOneOut.training("train+valid")` is what the original BERT4Rec code trains on: every item but
the test one (its gen_data_fin.py puts the validation item into training; the paper's §4.1 text
trains on "the remaining items"). A model trained on it cannot be selected on validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from seqrec.data.preprocess import Sequences

__all__ = ["EvalSet", "LeaveOneOut", "Split", "TrainOn", "leave_one_out"]

Split = Literal["valid", "test"]
# what a model learns from: the training part, or that and the validation items
TrainOn = Literal["train", "train+valid"]


@dataclass(frozen=True)
class EvalSet:
    """The users of one evaluation split, their input histories and their target items."""

    split: Split
    users: np.ndarray  # (E,) internal user index
    histories: Sequences  # row e: the input of users[e], oldest first
    targets: np.ndarray  # (E,) internal item id


@dataclass(frozen=True)
class LeaveOneOut:
    sequences: Sequences  # full sequences (training + validation + test items)
    train: Sequences  # all but the last two items of every evaluated user
    valid: EvalSet
    test: EvalSet

    def eval_set(self, split: Split) -> EvalSet:
        if split == "valid":
            return self.valid
        if split == "test":
            return self.test
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")

    def training(self, train_on: TrainOn = "train") -> Sequences:
        """The sequences a model learns from: `train`, or ("train+valid") every user's items but
        the test one, validation item included (the original BERT4Rec code's training data)."""
        if train_on == "train":
            return self.train
        if train_on == "train+valid":
            lengths = self.sequences.lengths
            users = np.arange(self.sequences.n_users, dtype=np.int64)
            return self.sequences.take(users, drop_last=np.where(lengths >= 3, 1, 0))
        raise ValueError(f"train_on must be 'train' or 'train+valid', got {train_on!r}")


def leave_one_out(seqs: Sequences) -> LeaveOneOut:
    lengths = seqs.lengths
    all_users = np.arange(seqs.n_users, dtype=np.int64)
    evaluated = all_users[lengths >= 3]
    last = seqs.offsets[evaluated + 1] - 1
    train = seqs.take(all_users, drop_last=np.where(lengths >= 3, 2, 0))
    valid = EvalSet(
        split="valid",
        users=evaluated,
        histories=seqs.take(evaluated, drop_last=2),
        targets=seqs.items[last - 1],
    )
    test = EvalSet(
        split="test",
        users=evaluated,
        histories=seqs.take(evaluated, drop_last=1),
        targets=seqs.items[last],
    )
    return LeaveOneOut(sequences=seqs, train=train, valid=valid, test=test)
