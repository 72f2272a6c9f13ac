"""Leave-one-out (BERT4Rec §4.2, SASRec §IV-A): per user, the last item is the test target, the
second-last the validation target, the rest is training.

- the validation input is the history *before* the validation item (it never sees the test item);
- the test input is the full history before the test item, validation item included;
- users with fewer than 3 items have nothing to hold out: all their items are training data and
  they are not evaluated (with the papers' 5-core filter this never happens).

`LeaveOneOut.training("train+valid")` is what the original BERT4Rec code trains on: every item but
the test one (its gen_data_fin.py puts the validation item into training; the paper's §4.1 text
trains on "the remaining items"). A model trained on it cannot be selected on validation.

The time split (`time_split`, `data.split = "time"`) holds the same parts, cut at a point in
time instead: training is every interaction before the cut; a user with at least one item
before it and two after it is evaluated, the first item after the cut its validation target
(input: the items before the cut) and the second its test target (input: those and the
validation item). Users whose items all come after the cut are cold (nothing to read), those
with one item after it have no test target: neither is evaluated (`TimeSplitCounts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from seqrec.data.preprocess import Sequences

__all__ = [
    "EvalSet",
    "LeaveOneOut",
    "Split",
    "TimeSplitCounts",
    "TrainOn",
    "leave_one_out",
    "time_cut_seconds",
    "time_split",
    "time_split_counts",
]

Split = Literal["valid", "test"]
# what a model learns from: the training part, that and the validation items, or every item
# (nothing held out: the state to serve, tested on nothing)
TrainOn = Literal["train", "train+valid", "all"]


@dataclass(frozen=True)
class EvalSet:
    """The users of one evaluation split, their input histories and their target items."""

    split: Split
    users: np.ndarray  # (E,) internal user index
    histories: Sequences  # row e: the input of users[e], oldest first
    targets: np.ndarray  # (E,) internal item id
    # (E,) when each target was chosen, where the histories have timestamps: the time a
    # recommendation for the row is asked for (a time-aware model reads it); None otherwise
    target_times: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> EvalSet:
        """The users at `rows` (positions in this set), in that order."""
        times = None if self.target_times is None else self.target_times[rows]
        return EvalSet(
            self.split, self.users[rows], self.histories.take(rows), self.targets[rows], times
        )


@dataclass(frozen=True)
class LeaveOneOut:
    """The parts of a split (leave-one-out, or the time split in the same form)."""

    sequences: Sequences  # training + validation + test items of every user
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
        """The sequences a model learns from: `train`, ("train+valid") every user's items but
        the test one, validation item included (the original BERT4Rec code's training data), or
        ("all") every item (a model to serve: nothing is held out from it)."""
        if train_on == "train":
            return self.train
        if train_on == "train+valid":
            users = np.arange(self.sequences.n_users, dtype=np.int64)
            evaluated = np.zeros(self.sequences.n_users, dtype=bool)
            evaluated[self.test.users] = True
            return self.sequences.take(users, drop_last=np.where(evaluated, 1, 0))
        if train_on == "all":
            return self.sequences
        raise ValueError(f"train_on must be 'train', 'train+valid' or 'all', got {train_on!r}")


def leave_one_out(seqs: Sequences) -> LeaveOneOut:
    return _last_two_held_out(seqs, seqs.lengths >= 3)


def _last_two_held_out(seqs: Sequences, is_evaluated: np.ndarray) -> LeaveOneOut:
    """The parts of `seqs` where each evaluated user's last item is the test target and the
    one before it the validation target; the others' items are all training data."""
    all_users = np.arange(seqs.n_users, dtype=np.int64)
    evaluated = all_users[is_evaluated]
    last = seqs.offsets[evaluated + 1] - 1
    train = seqs.take(all_users, drop_last=np.where(is_evaluated, 2, 0))
    times = seqs.times
    valid = EvalSet(
        split="valid",
        users=evaluated,
        histories=seqs.take(evaluated, drop_last=2),
        targets=seqs.items[last - 1],
        target_times=None if times is None else times[last - 1],
    )
    test = EvalSet(
        split="test",
        users=evaluated,
        histories=seqs.take(evaluated, drop_last=1),
        targets=seqs.items[last],
        target_times=None if times is None else times[last],
    )
    return LeaveOneOut(sequences=seqs, train=train, valid=valid, test=test)


@dataclass(frozen=True)
class TimeSplitCounts:
    """Who a time split evaluates: users with history before the cut and two items after it;
    cold users (every item after the cut) and users with one item after it are not."""

    cut: int  # seconds since the epoch: items at or after it are after the cut
    evaluated: int
    cold: int
    one_after: int
    before_only: int  # users with no item after the cut (training data only)


def time_cut_seconds(cut: float | str, times: np.ndarray) -> int:
    """The cut of `data.time_cut` in seconds since the epoch: a fraction in (0, 1) of the
    interactions `times` that come before it, seconds, or an ISO date or time (UTC when it
    names no zone)."""
    from datetime import UTC, datetime

    from seqrec.errors import ConfigError

    if isinstance(cut, str):
        try:
            when = datetime.fromisoformat(cut.strip())
        except ValueError:
            raise ConfigError(
                f"data.time_cut {cut!r}: expected a fraction in (0, 1), seconds since the epoch "
                "or an ISO date such as 2003-01-01"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return int(when.timestamp())
    if 0 < cut < 1:
        if len(times) == 0:
            raise ConfigError("data.time_cut: no interactions to cut")
        ordered = np.sort(times)
        return int(ordered[min(len(ordered) - 1, int(np.ceil(cut * len(ordered))))])
    if cut >= 1:
        return int(cut)
    raise ConfigError(f"data.time_cut must be a fraction in (0, 1) or a time, got {cut!r}")


def time_split(seqs: Sequences, before: np.ndarray) -> LeaveOneOut:
    """The time split of `seqs` (time-ordered) whose user u has `before[u]` items before the
    cut (see the module's docstring)."""
    lengths = seqs.lengths
    before = np.asarray(before, dtype=np.int64)
    after = lengths - before
    users = np.arange(seqs.n_users, dtype=np.int64)
    is_evaluated = (before >= 1) & (after >= 2)
    # every user's items before the cut, and an evaluated user's first two after it: then the
    # evaluated users' last two items are the held-out ones
    kept = seqs.take(users, drop_last=after - np.where(is_evaluated, 2, 0))
    return _last_two_held_out(kept, is_evaluated)


def time_split_counts(before: np.ndarray, lengths: np.ndarray, cut: int) -> TimeSplitCounts:
    after = lengths - before
    return TimeSplitCounts(
        cut=cut,
        evaluated=int(((before >= 1) & (after >= 2)).sum()),
        cold=int((before == 0).sum()),
        one_after=int(((before >= 1) & (after == 1)).sum()),
        before_only=int((after == 0).sum()),
    )
