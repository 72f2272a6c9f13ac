"""Scores over the catalogue a block of items at a time: what a model gives the evaluation so that
a large catalogue's scores never sit in memory at once."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["BlockScores"]


class BlockScores:
    """One batch's scores over the catalogue, computed a block of items at a time: column c is
    item c's score for each history and column 0 (padding) is -inf, as in `score`'s matrix."""

    def __init__(
        self,
        features: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        bf16: bool = False,
    ) -> None:
        self.features, self.weight, self.bias, self.bf16 = features, weight, bias, bf16
        self.n_columns = weight.shape[0] + 1

    def _autocast(self) -> Any:
        return torch.autocast(self.features.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.no_grad()
    def pairs(self, items: torch.Tensor) -> torch.Tensor:
        """(B, k) item ids -> (B, k) float32 scores of those items (-inf for id 0)."""
        with self._autocast():
            w = self.weight[(items - 1).clamp(min=0)]  # (B, k, D)
            out = torch.einsum("bd,bkd->bk", self.features.to(w.dtype), w).float()
        if self.bias is not None:
            out = out + self.bias[(items - 1).clamp(min=0)].float()
        return out.masked_fill(items == 0, -math.inf)

    def blocks(self, width: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(first column, (B, c) float32 scores of columns first..first + c - 1), c <= width,
        covering columns 0..n_items in order."""
        for lo in range(0, self.n_columns, width):
            hi = min(self.n_columns, lo + width)
            first = max(lo, 1)  # column 0 is the padding
            with torch.no_grad(), self._autocast():
                block = (self.features @ self.weight[first - 1 : hi - 1].T).float()
                if self.bias is not None:
                    block += self.bias[first - 1 : hi - 1].float()
                if lo == 0:
                    block = torch.cat([block.new_full((block.shape[0], 1), -math.inf), block], 1)
            yield lo, block
