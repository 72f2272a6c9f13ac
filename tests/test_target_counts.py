"""benchmarks/analyses.py target-counts: how often each held-out target was seen in the trained-on
items, checked against counts done by hand on three users."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from seqrec.data.preprocess import Sequences
from seqrec.data.split import leave_one_out


def test_counts_of_the_targets_in_the_trained_on_items(
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    # users: [1 2 | 3 | 4], [1 3 | 2 | 5], [2 1 | 4 | 1]  (training part | valid | test)
    items = np.array([1, 2, 3, 4, 1, 3, 2, 5, 2, 1, 4, 1], dtype=np.int64)
    split = leave_one_out(Sequences(items, np.array([0, 4, 8, 12], dtype=np.int64), n_items=5))
    got = benchmark_script("target_counts").target_counts(split)
    # training part: item 1 x3, 2 x2, 3 x1, 4 and 5 never; valid targets 3, 2, 4 -> 1, 2, 0
    valid = got["valid_on_train"]
    assert valid["median"] == 1 and valid["at_most_0"] == pytest.approx(1 / 3)
    assert valid["at_most_2"] == 1.0 and valid["targets"] == 3
    # test targets 4, 5, 1 -> 0, 0, 3 in the training part
    test = got["test_on_train"]
    assert test["median"] == 0 and test["at_most_0"] == pytest.approx(2 / 3)
    assert test["at_most_2"] == pytest.approx(2 / 3) and test["at_most_5"] == 1.0
    # validation items trained on: 4 once (the third user's), 5 never, 1 three times
    both = got["test_on_train+valid"]
    assert both["median"] == 1 and both["at_most_0"] == pytest.approx(1 / 3)
