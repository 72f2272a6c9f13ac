"""NCF / NeuMF (He et al., WWW 2017), a baseline of BERT4Rec Table 2: a GMF branch (the element-wise
product of a user and an item vector) and an MLP branch (a tower over the concatenated user and
item vectors), their last layers concatenated and projected to one score (NCF §3.4). The order of a
user's items plays no part.

The score of a (user, item) pair is not a dot product with an output layer, so the model has its
own `pair_logits` (what the sampled losses read) and `score` (every item, in chunks).

Training: the shifted next-item task (`NextItemSampler`) gives every training item of a user as a
positive of that user, with `train.n_negatives` uniform negatives not in the user's sequence
(NCF §4.1: 4) and the `bce` loss (NCF's log loss). DEVIATION: NeuMF trained from scratch (NCF
§3.4.1 pre-trains GMF and MLP; §4.2 reports NeuMF without pre-training too). A history of a user
the model never saw has zero user vectors: its score is the MLP branch on the item alone, a
learned popularity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from seqrec.data.batches import NextItemConfig
from seqrec.errors import ConfigError
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    SequenceModel,
    linear,
    whole_row_batches,
    whole_rows_only,
)
from seqrec.models.bprmf import user_rows

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.prepared import PreparedDataset

__all__ = ["ENTRY", "NCF", "NCFConfig"]

# `score` scores as many items at a time as keep its B x items x d_mlp tensor below this
_SCORE_FLOATS = 1 << 24


@dataclass(frozen=True)
class NCFConfig:
    """NCF §4.1: predictive factors in {8, 16, 32, 64}, a three-layer tower halving each layer."""

    factors: int = 32  # predictive factors: GMF's size and the tower's last layer
    n_layers: int = 3  # MLP tower: 4f -> 2f -> f on embeddings of 2f per side (4f in)
    max_len: int = 200  # items per training window (the score reads no history)
    init_std: float = 0.01  # NCF §4.1: N(0, 0.01)


class NCF(SequenceModel):
    uses_users = True
    dot_product_output = False

    def __init__(self, n_items: int, n_users: int, cfg: NCFConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or NCFConfig()
        if cfg.n_layers < 1:
            raise ConfigError(f"ncf.n_layers must be >= 1, got {cfg.n_layers}")
        self.n_items, self.n_users = n_items, n_users
        f = cfg.factors
        d_mlp = f * 2 ** (cfg.n_layers - 1)  # each side's MLP embedding
        self.user_gmf = nn.Embedding(n_users + 1, f, padding_idx=0)  # row 0: unknown user
        self.item_gmf = nn.Embedding(n_items + 1, f, padding_idx=0)
        self.user_mlp = nn.Embedding(n_users + 1, d_mlp, padding_idx=0)
        self.item_mlp = nn.Embedding(n_items + 1, d_mlp, padding_idx=0)
        layers: list[nn.Module] = []
        width = 2 * d_mlp
        for _ in range(cfg.n_layers):
            layers += [nn.Linear(width, width // 2), nn.ReLU()]
            width //= 2
        self.tower = nn.Sequential(*layers)  # ends at f units
        self.predict = nn.Linear(2 * f, 1)  # h over [GMF; MLP]
        for emb in (self.user_gmf, self.item_gmf, self.user_mlp, self.item_mlp):
            nn.init.normal_(emb.weight, std=cfg.init_std)
            with torch.no_grad():
                emb.weight[0].zero_()
        nn.init.uniform_(self.predict.weight, -math.sqrt(3 / (2 * f)), math.sqrt(3 / (2 * f)))

    @property
    def max_len(self) -> int:
        return 1  # the score reads no history

    def forward(
        self, input_ids: torch.Tensor, users: torch.Tensor | None = None, **layout: torch.Tensor
    ) -> torch.Tensor:
        """(B, L) -> (B, L, f + d_mlp): the user's [GMF; MLP] vectors at every position."""
        whole_rows_only("NCF", layout)
        u = self.user_vector(input_ids, users)
        return u[:, None, :].expand(-1, input_ids.shape[1], -1)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise ConfigError("ncf scores (user, item) pairs with an MLP; it has no output layer")

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = user_rows(users, self.n_users, histories)
        return torch.cat([self.user_gmf(rows), self.user_mlp(rows)], dim=-1)

    def pair_logits(self, features: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(M, f + d_mlp) user vectors, (M, k) items -> (M, k) NeuMF scores (logits)."""
        f = self.cfg.factors
        gmf = features[:, None, :f] * self.item_gmf(items)  # (M, k, f)
        w_user, w_item, bias = self._first_layer()
        user_part = nn.functional.linear(features[:, f:], w_user, bias)  # once per row
        return self._head(gmf, user_part[:, None, :] + self.item_mlp(items) @ w_item.T)

    def _first_layer(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tower's first layer on [u; i] split as W_u u + b + W_i i, so that each user's and
        each item's part is computed once, not once per (user, item) pair: the same numbers, and
        the first layer is three quarters of the tower's work."""
        first = self.tower[0]
        assert isinstance(first, nn.Linear)
        d = first.in_features // 2
        return first.weight[:, :d], first.weight[:, d:], first.bias

    def _head(self, gmf: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The tower after its first layer's pre-activation `first`, then h over [GMF; MLP]."""
        mlp = self.tower[1:](first)  # (..., f)
        return self.predict(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)

    @torch.no_grad()
    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories -> (B, n_items + 1); column 0 is -inf. Items in chunks (`times`:
        not read)."""
        u = self.user_vector(histories, users)
        f = self.cfg.factors
        w_user, w_item, bias = self._first_layer()
        u_gmf, u_first = u[:, None, :f], nn.functional.linear(u[:, f:], w_user, bias)[:, None, :]
        B = u.shape[0]
        chunk = max(1, _SCORE_FLOATS // (B * w_item.shape[0]))
        out = [torch.full((B, 1), -math.inf, device=u.device)]
        for lo in range(1, self.n_items + 1, chunk):
            ids = torch.arange(lo, min(lo + chunk, self.n_items + 1), device=u.device)
            gmf = u_gmf * self.item_gmf(ids)  # (B, n, f)
            out.append(self._head(gmf, u_first + self.item_mlp(ids) @ w_item.T).float())
        return torch.cat(out, dim=1)


def _validate(cfg: RunConfig, ds: PreparedDataset | None) -> None:
    t = cfg.train
    if t.loss == "ce" or t.negatives_per != "position" or t.n_negatives < 1:
        raise ConfigError(
            "ncf: train.loss must be a sampled loss (bce, bpr, ...) with negatives per position "
            "(its MLP scores (user, item) pairs; a softmax over every item is not built)"
        )


# NCF §4.1: Adam, the log loss with 4 negatives per positive, lr from {0.0001 .. 0.01}
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """NCF's parameters by formula: GMF and MLP embeddings, the halving tower, the predictor."""
    f, layers = cfg.ncf.factors, cfg.ncf.n_layers
    d_mlp = f * 2 ** (layers - 1)
    tower = sum(linear(2 * d_mlp >> i, 2 * d_mlp >> (i + 1)) for i in range(layers))
    return (n_users + 1 + n_items + 1) * (f + d_mlp) + tower + linear(2 * f, 1)


ENTRY = ModelEntry(
    name="ncf",
    sections={"ncf": NCFConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: NCF(n_items, n_users, cfg.ncf),
    parameters=_parameters,
    batches=whole_row_batches("ncf", "ncf"),
    whole_rows=True,
    validate=_validate,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "bce",
        "n_negatives": 4,
    },
)
