"""Mixture of Logits (MoL): a learned similarity of a user and an item that is not one dot product
(Zhai et al., KDD 2023, "Revisiting Neural Retrieval on Accelerators"; Ding & Zhai 2024,
"Retrieval with Learned Similarities"), the output head of the best published ML-1M HSTU row. Read
from the authors' code (bailuding/rails, `modeling/similarity/mol*.py`, and its ML-1M
configuration `hstu-mol-sampled-softmax-n128-8x4x64-rails-final.gin`).

For a user's features u (D) and an item's embedding e (D):

    q_1..q_P  = L2-normalised rows of Linear(SwiGLU(u))      P query components of width d
    x_1..x_Q  = L2-normalised rows of Linear(Dropout(e))     Q item components of width d
    l_pq      = <q_p, x_q> / temperature                     P * Q logits
    g         = SiLU(G_u(u) * G_e(e) + G_l(l))               gates, each G an MLP with one SiLU
    score     = sum_pq softmax(g)_pq * l_pq                  (dropout on softmax(g) in training,
                                                             the kept gates renormalised to 1)

Serving cost: a dot product per (user, item) is D multiply-adds; MoL is P * Q * d for the logits
plus about 2 * P * Q * h for the gating MLP of the logits (h its width), so at the defaults about
10,000 multiply-adds a pair, some 200 times a 50-wide dot product. The item side (components and
the item part of the gate) is computed once per item and reused; no inner-product index (HNSW)
applies, since the score is not an inner product.

Named deviations from the authors' ML-1M configuration:
- No user-id component: the authors' query side has P - 1 components from the sequence and one
  hashed user-id embedding (dropout 0.5, an L2 penalty 0.1). seqrec's HSTU reads histories only,
  so that it scores users it never saw (serving, the held-out users of a split); all P components
  come from the sequence here.
- Item-side dropout on each distinct item of a batch, not on each (position, item) pair: the item
  side is computed once per distinct item, which is what makes 128 negatives per position
  affordable on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MixtureOfLogits", "MoLConfig", "mol_activation_floats", "mol_parameters"]

_EPS = 1e-6  # the authors' L2-norm epsilon
# Items scored at once by `MixtureOfLogits.score`: the gating MLP's (B, items, h) activations
# stay near 64 MiB in float32 for B = 256
SCORE_ITEMS = 512
# the activations one block of (users, items) scored at once may hold: a head of 512 x 512
# components keeps 1.5 million floats a pair, so its blocks are a few pairs, not 128 x 512
SCORE_BLOCK_BYTES = 256 << 20


@dataclass(frozen=True)
class MoLConfig:
    """The head (used with `hstu.head = "mol"`). Defaults: the authors' ML-1M configuration
    (8 x 4 components of width 64). Ranges: seqrec.config.ranges."""

    query_groups: int = 8  # P, components of the user
    item_groups: int = 4  # Q, components of the item
    dim: int = 64  # d, each component's width
    query_hidden: int = 512  # the SwiGLU width of the query projection
    item_dropout: float = 0.1  # on the item embedding before its projection
    gate_hidden: int = 128  # h, the gating MLPs' width
    gate_dropout: float = 0.2  # on the gates' softmax in training
    temperature: float = 0.05  # the logits are cosines over it


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.xavier_uniform_(layer.weight)  # the authors' init: Xavier weights, zero biases
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def _gate_mlp(n_in: int, hidden: int, n_out: int, out_bias: bool) -> nn.Sequential:
    return nn.Sequential(_linear(n_in, hidden), nn.SiLU(), _linear(hidden, n_out, out_bias))


class SwiGLU(nn.Module):
    """SiLU(x W_a + b_a) * (x W_b + b_b) (Shazeer 2020), W ~ N(0, 0.02), b = 0."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(n_in, 2 * n_out).normal_(0.0, 0.02))
        self.b = nn.Parameter(torch.zeros(2 * n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = (x @ self.w + self.b).chunk(2, dim=-1)
        return F.silu(a) * b


class MixtureOfLogits(nn.Module):
    """The MoL score of (user features, item embeddings) pairs (the formula above)."""

    def __init__(self, d_model: int, cfg: MoLConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n = cfg.query_groups * cfg.item_groups
        self.query_proj = nn.Sequential(
            SwiGLU(d_model, cfg.query_hidden), _linear(cfg.query_hidden, cfg.query_groups * cfg.dim)
        )
        self.item_proj = nn.Sequential(
            nn.Dropout(cfg.item_dropout), _linear(d_model, cfg.item_groups * cfg.dim)
        )
        self.gate_query = _gate_mlp(d_model, cfg.gate_hidden, n, out_bias=False)
        self.gate_item = _gate_mlp(d_model, cfg.gate_hidden, n, out_bias=False)
        self.gate_logits = _gate_mlp(n, cfg.gate_hidden, n, out_bias=True)

    def users(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(M, D) -> the user side: (M, P, d) unit components and (M, P * Q) gate part."""
        c = self.cfg
        comps = self.query_proj(features).unflatten(-1, (c.query_groups, c.dim))
        return F.normalize(comps, dim=-1, eps=_EPS), self.gate_query(features)

    def items(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V, D) item embeddings -> the item side: (V, Q, d) unit components and (V, P * Q)
        gate part."""
        c = self.cfg
        comps = self.item_proj(vectors).unflatten(-1, (c.item_groups, c.dim))
        return F.normalize(comps, dim=-1, eps=_EPS), self.gate_item(vectors)

    def combine(
        self,
        user: tuple[torch.Tensor, torch.Tensor],
        item: tuple[torch.Tensor, torch.Tensor],
        equation: str,
    ) -> torch.Tensor:
        """The scores of users (M, P, d), (M, G) against items (..., Q, d), (..., G): `equation`
        the einsum of the logits, "mpd,kqd->mkpq" (every user against the same k items) or
        "mpd,mkqd->mkpq" (each user its own k) -> (M, k)."""
        (uc, ug), (ic, ig) = user, item
        logits = torch.einsum(equation, uc, ic).flatten(-2) / self.cfg.temperature  # (M, k, G)
        ig = ig[None] if ig.dim() == 2 else ig
        return self._mix(logits, ug[:, None, :] * ig)

    def _mix(self, logits: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """(..., G) logits and the user-item part of their gates -> (...) the gated sum."""
        weights = F.softmax(F.silu(gates + self.gate_logits(logits)), dim=-1)
        if self.training and self.cfg.gate_dropout > 0:
            weights = F.dropout(weights, self.cfg.gate_dropout)
            weights = weights / weights.sum(-1, keepdim=True).clamp(min=_EPS)
        return (weights * logits).sum(-1)

    def pair_scores(
        self, features: torch.Tensor, table: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """(M, D) user features, the (V + 1, D) item table (row i: item i) and (M, k) item ids
        -> (M, k) scores; the item side is computed once per distinct item."""
        distinct, where = torch.unique(items, return_inverse=True)
        comps, gate = self.items(table[distinct])
        return self.combine(self.users(features), (comps[where], gate[where]), "mpd,mkqd->mkpq")

    def sequence_scores(
        self,
        features: torch.Tensor,
        table: torch.Tensor,
        items: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """(B, L, D) user features, the item table, (B, k) item ids of each row and the (B, L)
        bool `positions` to score -> (M, k): each position's row's items. The item side once per
        distinct item, the logits by one batched product per row (no (M, k, Q, d) copy of the
        items' components), the gating MLP at the M positions only."""
        B, L, _ = features.shape
        distinct, where = torch.unique(items, return_inverse=True)
        comps, gate = self.items(table[distinct])
        ic, ig = comps[where], gate[where]  # (B, k, Q, d), (B, k, G)
        uc, ug = self.users(features[positions])  # (M, P, d), (M, G)
        rows = positions.nonzero()[:, 0]  # (M,) each position's row
        dense = torch.zeros(B, L, *uc.shape[1:], dtype=uc.dtype, device=uc.device)
        dense[positions] = uc
        logits = torch.einsum("blpd,bkqd->blkpq", dense, ic)[positions]  # (M, k, P, Q)
        logits = logits.flatten(-2) / self.cfg.temperature  # (M, k, G)
        return self._mix(logits, ug[:, None, :] * ig[rows])

    def score(self, features: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """(B, D) user features against every item of (V, D) -> (B, V), a block of users and
        items at a time (the gating activations of a whole catalogue would not fit): at most
        SCORE_ITEMS items, and as many users and items as keep a block's activations
        (`mol_activation_floats` a pair) within SCORE_BLOCK_BYTES."""
        uc, ug = self.users(features)
        comps, gate = self.items(vectors)
        pair = 4 * mol_activation_floats(self.cfg, 1)
        rows = max(1, min(features.shape[0], SCORE_BLOCK_BYTES // pair))
        n = max(1, min(SCORE_ITEMS, SCORE_BLOCK_BYTES // (pair * rows)))
        shared = "mpd,kqd->mkpq"  # every user against the same block of items
        return torch.cat(
            [
                torch.cat(
                    [
                        self.combine(
                            (uc[r : r + rows], ug[r : r + rows]),
                            (comps[lo : lo + n], gate[lo : lo + n]),
                            shared,
                        )
                        for lo in range(0, vectors.shape[0], n)
                    ],
                    dim=1,
                )
                for r in range(0, features.shape[0], rows)
            ],
            dim=0,
        )


def mol_parameters(d_model: int, cfg: MoLConfig) -> int:
    """How many parameters `MixtureOfLogits(d_model, cfg)` holds, by formula."""
    n = cfg.query_groups * cfg.item_groups
    h = cfg.gate_hidden
    query = d_model * 2 * cfg.query_hidden + 2 * cfg.query_hidden
    query += cfg.query_hidden * cfg.query_groups * cfg.dim + cfg.query_groups * cfg.dim
    item = d_model * cfg.item_groups * cfg.dim + cfg.item_groups * cfg.dim
    gates = 2 * (d_model * h + h + h * n) + (n * h + h + h * n + n)
    return query + item + gates


def mol_activation_floats(cfg: MoLConfig, pairs: int) -> int:
    """Floats the head keeps for the backward pass of `pairs` (position, item) scores: the
    gating MLP's two hidden layers (h each) and about six P * Q tensors (the logits, the gates
    before and after their SiLU, the softmax, its dropout mask, the weights); what
    seqrec.training.sizes adds for it (at ML-1M's batch of 128 windows of 200 and 128 negatives,
    about 6 GiB)."""
    return pairs * (2 * cfg.gate_hidden + 6 * cfg.query_groups * cfg.item_groups)
