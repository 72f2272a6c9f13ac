"""FPMC and FMC (Rendle et al., WWW 2010), baselines of BERT4Rec Table 2 and SASRec Table III.

FPMC scores item i for user u after item l (sequences: baskets of one item) as
<V^{U,I}_u, V^{I,U}_i> + <V^{I,L}_i, V^{L,I}_l>: a matrix factorisation term and a factorised
first-order Markov chain. FMC is the chain alone (`fpmc.user_term = false`). Both are one dot
product here: the features [V^{U,I}_u; V^{L,I}_l] against the item weights [V^{I,U}_i; V^{I,L}_i].

Training: the shifted next-item task (`NextItemSampler`): every transition l -> i of a user's
training sequence, with uniform negatives not in the user's sequence and the `bpr` loss (S-BPR,
Rendle et al. §5). A history of a user the model never saw has no V^{U,I}_u: its user term is
left out, so it is scored by the Markov chain from its last item (FMC).
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

__all__ = ["ENTRY", "FPMC", "FPMCConfig"]

if TYPE_CHECKING:
    from seqrec.config import RunConfig


@dataclass(frozen=True)
class FPMCConfig:
    """Sizes (the BERT4Rec paper's grid for its baselines: d in 16..256)."""

    d_model: int = 64  # factors of each of the two terms
    user_term: bool = True  # false: FMC, the factorised Markov chain alone
    max_len: int = 200  # items per training window; the score reads the last item only
    init_std: float = 0.01  # Rendle et al. §6: N(0, 0.01)


class FPMC(SequenceModel):
    uses_users = True

    def __init__(self, n_items: int, n_users: int, cfg: FPMCConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or FPMCConfig()
        self.n_items, self.n_users = n_items, n_users
        d = cfg.d_model
        self.prev_emb = nn.Embedding(n_items + 1, d, padding_idx=0)  # V^{L,I}_l
        self.next_emb = nn.Embedding(n_items + 1, d, padding_idx=0)  # V^{I,L}_i
        embs = [self.prev_emb, self.next_emb]
        if cfg.user_term:
            self.user_emb = nn.Embedding(n_users + 1, d, padding_idx=0)  # V^{U,I}_u (0: unknown)
            self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)  # V^{I,U}_i
            embs += [self.user_emb, self.item_emb]
        for emb in embs:
            nn.init.normal_(emb.weight, std=cfg.init_std)
            with torch.no_grad():
                emb.weight[0].zero_()

    @property
    def max_len(self) -> int:
        return 1  # the last item

    def forward(
        self, input_ids: torch.Tensor, users: torch.Tensor | None = None, **layout: torch.Tensor
    ) -> torch.Tensor:
        """(B, L) -> (B, L, D or 2D): at each position the features of the next item's score,
        [V^{U,I}_u; V^{L,I}_l] (FMC: V^{L,I}_l) with l the item at that position."""
        whole_rows_only("FPMC", layout)
        chain = self.prev_emb(input_ids)  # (B, L, D); padding gives 0
        if not self.cfg.user_term:
            return chain
        p = self.user_emb(user_rows(users, self.n_users, input_ids))  # (B, D)
        return torch.cat([p[:, None, :].expand_as(chain), chain], dim=-1)

    def output_weights(self) -> tuple[torch.Tensor, None]:
        if not self.cfg.user_term:
            return self.next_emb.weight[1:], None
        return torch.cat([self.item_emb.weight[1:], self.next_emb.weight[1:]], dim=-1), None

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward(last_positions(histories, 1), users)[:, -1]


# Rendle et al. learn by SGD on sampled quadruples with ℓ2; here Adam (seqrec's one optimiser),
# one uniform negative per transition, ℓ2 as decoupled weight decay
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """FPMC's parameters by formula: the Markov-chain pair, and the MF pair with user_term."""
    d = cfg.fpmc.d_model
    mf = (n_users + 1 + n_items + 1) * d if cfg.fpmc.user_term else 0
    return 2 * (n_items + 1) * d + mf


ENTRY = ModelEntry(
    name="fpmc",
    sections={"fpmc": FPMCConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: FPMC(n_items, n_users, cfg.fpmc),
    parameters=_parameters,
    batches=whole_row_batches("fpmc", "fpmc"),
    whole_rows=True,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "bpr",
        "n_negatives": 1,
    },
)
