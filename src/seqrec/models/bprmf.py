"""BPR-MF (Rendle et al., UAI 2009): matrix factorisation trained with the BPR loss, a baseline of
BERT4Rec Table 2. A user u and an item i score <P_u, Q_i> + b_i; the order of a user's items plays
no part.

Training: the shifted next-item task (`NextItemSampler`) gives every training item of a user
(after the first) as a positive of that user, with uniform negatives not in the user's sequence
(`train.n_negatives`), and the `bpr` loss: Rendle's (u, i, j) triples, an epoch visiting each
(u, i) once instead of drawing triples with replacement. The ℓ2 term is `train.weight_decay`.

DEVIATION: an item bias b_i (most BPR-MF implementations have one; Rendle's model has none). It is
what scores a history of a user the model never saw: such a user has no P_u (the user term is left
out, `SequenceModel.uses_users`), so its ranking is the learned item bias: a popularity ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from seqrec.data.batches import NextItemConfig
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    SequenceModel,
    whole_row_batches,
    whole_rows_only,
)

__all__ = ["ENTRY", "BPRMF", "BPRMFConfig", "user_rows"]

if TYPE_CHECKING:
    from seqrec.config import RunConfig


@dataclass(frozen=True)
class BPRMFConfig:
    """Sizes (the BERT4Rec paper's grid for its baselines: d in 16..256)."""

    d_model: int = 64  # factors
    max_len: int = 200  # items per training window (the score reads no history)
    init_std: float = 0.1  # Rendle et al.: N(0, 0.1)


def user_rows(users: torch.Tensor | None, n_users: int, like: torch.Tensor) -> torch.Tensor:
    """(B,) user indices -> rows of a user table whose row 0 is the zero "unknown user": index + 1
    for a user of the training data, 0 for -1, an index out of range, or `users` None."""
    if users is None:
        return torch.zeros(like.shape[0], dtype=torch.long, device=like.device)
    known = (users >= 0) & (users < n_users)
    return torch.where(known, users + 1, torch.zeros_like(users))


class BPRMF(SequenceModel):
    uses_users = True

    def __init__(self, n_items: int, n_users: int, cfg: BPRMFConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or BPRMFConfig()
        self.n_items, self.n_users = n_items, n_users
        # row 0: the unknown user, zero and never trained (padding_idx)
        self.user_emb = nn.Embedding(n_users + 1, cfg.d_model, padding_idx=0)
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)
        self.item_bias = nn.Parameter(torch.zeros(n_items))
        for emb in (self.user_emb, self.item_emb):
            nn.init.normal_(emb.weight, std=cfg.init_std)
            with torch.no_grad():
                emb.weight[0].zero_()

    @property
    def max_len(self) -> int:
        return 1  # the score reads no history; one item keeps the scoring batches small

    def forward(
        self, input_ids: torch.Tensor, users: torch.Tensor | None = None, **layout: torch.Tensor
    ) -> torch.Tensor:
        """(B, L) -> (B, L, D): the user's vector at every position."""
        whole_rows_only("BPR-MF", layout)
        p = self.user_emb(user_rows(users, self.n_users, input_ids))  # (B, D)
        return p[:, None, :].expand(-1, input_ids.shape[1], -1)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.item_emb.weight[1:], self.item_bias

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.user_emb(user_rows(users, self.n_users, histories))


# Rendle et al. train by SGD on sampled triples; here Adam (seqrec's one optimiser), one uniform
# negative per positive, ℓ2 as decoupled weight decay
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """BPR-MF's parameters by formula: user and item factors, item bias."""
    return (n_users + 1 + n_items + 1) * cfg.bpr_mf.d_model + n_items


ENTRY = ModelEntry(
    name="bpr-mf",
    sections={"bpr_mf": BPRMFConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: BPRMF(n_items, n_users, cfg.bpr_mf),
    parameters=_parameters,
    batches=whole_row_batches("bpr-mf", "bpr_mf"),
    whole_rows=True,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "bpr",
        "n_negatives": 1,
    },
)
