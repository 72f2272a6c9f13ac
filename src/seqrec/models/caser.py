"""Caser (Tang & Wang, WSDM 2018): convolutions over the embeddings of the last L items plus a user
embedding, a baseline of BERT4Rec Table 2 and SASRec Table III.

The L most recent items' embeddings form an L x d "image". Horizontal filters of every height
h = 1..L (n_h of each, width d) slide over it and are max-pooled over time; n_v vertical filters
(L x 1) take weighted sums of its rows. Their outputs, after dropout, go through a fully
connected layer to z (d); the next item i scores <W'_i, [z; P_u]> + b'_i (Caser §3).

Training: the shifted next-item task (`NextItemSampler`): every position t of a user's training
sequence predicts s_{t+1} from the L items up to s_t (fewer at the start: zero-padded, as in the
original code), with the `bce` loss over `train.n_negatives` uniform negatives (the original
code: 3). DEVIATION: one target per window (Caser's T = 1) instead of its T = 3 following items.
A history of a user the model never saw has no P_u: its user term is left out (zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batches import NextItemConfig
from seqrec.errors import ConfigError
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    SequenceModel,
    last_positions,
    linear,
    whole_row_batches,
    whole_rows_only,
)
from seqrec.models.bprmf import user_rows

__all__ = ["ENTRY", "Caser", "CaserConfig"]

if TYPE_CHECKING:
    from seqrec.config import RunConfig


@dataclass(frozen=True)
class CaserConfig:
    """Caser §4 (ML-1M): L = 5, d = 50, n_v = 4, n_h = 16, dropout 0.5."""

    window: int = 5  # L: the most recent items each prediction reads
    d_model: int = 50  # d
    n_v: int = 4  # vertical filters
    n_h: int = 16  # horizontal filters of each height 1..L
    dropout: float = 0.5
    max_len: int = 200  # items per training window (each position reads its last `window`)


class Caser(SequenceModel):
    uses_users = True

    def __init__(self, n_items: int, n_users: int, cfg: CaserConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or CaserConfig()
        if cfg.window < 1:
            raise ConfigError(f"caser.window must be >= 1, got {cfg.window}")
        self.n_items, self.n_users = n_items, n_users
        L, d = cfg.window, cfg.d_model
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.user_emb = nn.Embedding(n_users + 1, d, padding_idx=0)  # row 0: unknown user
        self.conv_v = nn.Conv2d(1, cfg.n_v, (L, 1))
        self.conv_h = nn.ModuleList(nn.Conv2d(1, cfg.n_h, (h, d)) for h in range(1, L + 1))
        self.dropout = nn.Dropout(cfg.dropout)
        self.fc = nn.Linear(cfg.n_v * d + cfg.n_h * L, d)
        self.out_emb = nn.Embedding(n_items + 1, 2 * d, padding_idx=0)  # W'
        self.out_bias = nn.Parameter(torch.zeros(n_items))  # b'
        for emb, std in ((self.item_emb, 1 / d), (self.user_emb, 1 / d), (self.out_emb, 1 / d)):
            nn.init.normal_(emb.weight, std=std)  # original code: N(0, 1/d)
            with torch.no_grad():
                emb.weight[0].zero_()

    @property
    def max_len(self) -> int:
        return self.cfg.window

    def forward(
        self, input_ids: torch.Tensor, users: torch.Tensor | None = None, **layout: torch.Tensor
    ) -> torch.Tensor:
        """(B, T) -> (B, T, 2d): [z_t; P_u] at every position t."""
        whole_rows_only("Caser", layout)
        B, T = input_ids.shape
        d = self.cfg.d_model
        z = F.relu(self.fc(self.dropout(self.convolutions(input_ids))))  # (B, T, d)
        p = self.user_emb(user_rows(users, self.n_users, input_ids))  # (B, d)
        return torch.cat([z, p[:, None, :].expand(B, T, d)], dim=-1)

    def convolutions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, n_v * d + n_h * L): at each position t, Caser's convolutions over the
        "image" of the L items up to t (zero rows before the first item, as the original code's
        padding): the vertical filters' outputs, then each height's horizontal ones after ReLU
        and max-pooling over the image (§3.2).

        Neighbouring images share L - 1 rows, so each filter runs once along the whole sequence
        (a 1-D convolution) and each image's max is a sliding max over its L - h + 1 outputs: the
        same numbers as the 2-D convolutions `conv_v` / `conv_h` applied image by image (tested),
        at a cost that does not grow with L x h."""
        B, T = input_ids.shape
        L, d = self.cfg.window, self.cfg.d_model
        x = self.item_emb(F.pad(input_ids, (L - 1, 0))).transpose(1, 2)  # (B, d, T + L - 1)
        # vertical: each filter a weighted sum of the image's L rows, every dimension alike
        w_v = self.conv_v.weight.reshape(-1, 1, L)  # (n_v, 1, L)
        v = F.conv1d(x.reshape(B * d, 1, T + L - 1), w_v, self.conv_v.bias)  # (B d, n_v, T)
        outs = [v.reshape(B, d, -1, T).permute(0, 3, 2, 1).reshape(B, T, -1)]
        for h, conv in enumerate(self.conv_h, start=1):
            assert isinstance(conv, nn.Conv2d)
            w = conv.weight.reshape(conv.out_channels, h, d).transpose(1, 2)  # (n_h, d, h)
            c = F.relu(F.conv1d(x, w, conv.bias))  # (B, n_h, T + L - h)
            outs.append(F.max_pool1d(c, kernel_size=L - h + 1, stride=1).transpose(1, 2))
        return torch.cat(outs, dim=-1)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out_emb.weight[1:], self.out_bias

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward(last_positions(histories, self.cfg.window), users)[:, -1]


# the original code's recipe: Adam, lr 1e-3, ℓ2 1e-6 (here decoupled weight decay), BCE with 3
# negatives per target
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """Caser's parameters by formula: embeddings, the vertical and horizontal filters, the
    fully-connected layer, output vectors and bias."""
    c = cfg.caser
    L, d = c.window, c.d_model
    convs = c.n_v * L + c.n_v + sum(c.n_h * h * d + c.n_h for h in range(1, L + 1))
    fc = linear(c.n_v * d + c.n_h * L, d)
    return (n_items + 1 + n_users + 1) * d + convs + fc + (n_items + 1) * 2 * d + n_items


ENTRY = ModelEntry(
    name="caser",
    sections={"caser": CaserConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: Caser(n_items, n_users, cfg.caser),
    parameters=_parameters,
    batches=whole_row_batches("caser", "caser"),
    whole_rows=True,
    train_defaults={
        **BASELINE_TRAIN,
        "weight_decay": 1e-6,
        "loss": "bce",
        "n_negatives": 3,
    },
)
