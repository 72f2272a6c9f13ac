"""TransRec (He, Kang & McAuley, RecSys 2017), a baseline of SASRec Table III: items are points in a
"transition space" and a user a translation vector; after item l, user u is expected at
γ_l + T_u with T_u = t + t_u (a global translation plus the user's own), and item i scores
β_i - d(γ_l + T_u, γ_i) with d the squared Euclidean distance. Item points are kept inside the
unit ball (TransRec §3.2).

As one dot product: -‖a - γ_i‖² = 2 a·γ_i - ‖γ_i‖² - ‖a‖², with a = γ_l + T_u. The last term is
the same for every item of a row, so the features [2a; 1] against the weights [γ_i; β_i - ‖γ_i‖²]
rank the items exactly as TransRec, and give the same difference between any two items (what
the `bpr` loss reads); the scores themselves are TransRec's plus ‖a‖².

Training: the shifted next-item task (`NextItemSampler`): every transition l -> i of a user's
training sequence, with uniform negatives not in the sequence and the `bpr` loss (S-BPR, as in the
paper). A history of a user the model never saw has no t_u: it is translated by the global t
alone.
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
    last_positions,
    whole_row_batches,
    whole_rows_only,
)
from seqrec.models.bprmf import user_rows

__all__ = ["ENTRY", "TransRec", "TransRecConfig"]

if TYPE_CHECKING:
    from seqrec.config import RunConfig


@dataclass(frozen=True)
class TransRecConfig:
    """Sizes (SASRec §IV-B's grid for the baselines: d in 10..50)."""

    d_model: int = 50
    max_len: int = 200  # items per training window; the score reads the last item only
    init_std: float = 0.1


class TransRec(SequenceModel):
    uses_users = True

    def __init__(self, n_items: int, n_users: int, cfg: TransRecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or TransRecConfig()
        self.n_items, self.n_users = n_items, n_users
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)  # γ
        self.user_emb = nn.Embedding(n_users + 1, cfg.d_model, padding_idx=0)  # t_u (0: unknown)
        self.translation = nn.Parameter(torch.zeros(cfg.d_model))  # t
        self.item_bias = nn.Parameter(torch.zeros(n_items))  # β
        nn.init.normal_(self.item_emb.weight, std=cfg.init_std)
        nn.init.zeros_(self.user_emb.weight)  # the original code starts users at the global t
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    @property
    def max_len(self) -> int:
        return 1  # the last item

    def points(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """γ of `ids` (all items 0..n when None), each kept inside the unit ball."""
        g = self.item_emb.weight if ids is None else self.item_emb(ids)
        return g / g.norm(dim=-1, keepdim=True).clamp(min=1.0)

    def forward(
        self, input_ids: torch.Tensor, users: torch.Tensor | None = None, **layout: torch.Tensor
    ) -> torch.Tensor:
        """(B, L) -> (B, L, D + 1): [2a; 1], a = γ_l + t + t_u, at each position's item l."""
        whole_rows_only("TransRec", layout)
        t_u = self.user_emb(user_rows(users, self.n_users, input_ids))  # (B, D)
        a = self.points(input_ids) + (self.translation + t_u)[:, None, :]
        return torch.cat([2 * a, torch.ones_like(a[..., :1])], dim=-1)

    def output_weights(self) -> tuple[torch.Tensor, None]:
        g = self.points()[1:]
        return torch.cat([g, (self.item_bias - (g * g).sum(-1))[:, None]], dim=-1), None

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward(last_positions(histories, 1), users)[:, -1]


# He et al. learn by SGD with ℓ2; SASRec's runs used Adam, as here (ℓ2 as decoupled weight decay)
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """TransRec's parameters by formula: item and user vectors, the global translation, bias."""
    d = cfg.transrec.d_model
    return (n_items + 1 + n_users + 1) * d + d + n_items


ENTRY = ModelEntry(
    name="transrec",
    sections={"transrec": TransRecConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: TransRec(n_items, n_users, cfg.transrec),
    parameters=_parameters,
    batches=whole_row_batches("transrec", "transrec"),
    whole_rows=True,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "bpr",
        "n_negatives": 1,
    },
)
