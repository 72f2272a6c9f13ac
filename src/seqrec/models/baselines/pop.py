"""POP: rank items by how often they occur in the training part (BERT4Rec §4.3, SASRec's PopRec).

The counts come from the training sequences only (all but each user's last two items), so
neither validation nor test items inflate their own popularity.
"""

from __future__ import annotations

import numpy as np
import torch

from seqrec.data.candidates import item_popularity
from seqrec.data.preprocess import Sequences

__all__ = ["Popularity"]


class Popularity:
    """A history-independent scorer: every user gets the same popularity scores."""

    max_len: int | None = 1  # it ignores the history, so give it the shortest one

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = torch.as_tensor(np.asarray(counts), dtype=torch.float32)  # (V,)

    @classmethod
    def fit(cls, train: Sequences) -> Popularity:
        return cls(item_popularity(train))

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        counts = self.counts.to(histories.device)
        return counts.expand(histories.shape[0], -1)  # (B, V)
