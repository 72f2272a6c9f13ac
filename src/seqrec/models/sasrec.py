"""SASRec (Kang & McAuley, ICDM 2018), read top to bottom: config, blocks, model.

Ids: 0 = padding (its embedding is the zero vector, §III-A), 1..n_items = items. Inputs are
left-padded (most recent item last) and positions are counted from the end, as the original code
does with its fixed-width left-padded windows: a batch cropped to its longest row computes
exactly what the full N-wide batch would.

Where the original TensorFlow code differs from the paper's text, the default follows the code
(it produced the published numbers) and an option gives the text; each difference is marked
"original code" beside its line.

The model is architecture only: no loss, no device logic. Targets and negatives are decided in
`seqrec.data.batches`, the loss formula in `seqrec.training.losses`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batches import NextItemConfig
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    Sampler,
    SequenceModel,
    last_positions,
    linear,
    next_item_batches,
)
from seqrec.models.dropout import DropoutKind, dropout

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.prepared import PreparedDataset

__all__ = ["ENTRY", "SASRec", "SASRecConfig"]


@dataclass(frozen=True)
class SASRecConfig:
    """Architecture (§III, §IV-C). Defaults: the paper's ML-1M setting, the original code where
    the paper is silent or differs."""

    max_len: int = 200  # n (§IV-C: 200 for ML-1M, 50 for the sparser datasets)
    d_model: int = 50  # d
    n_layers: int = 2  # b, self-attention blocks
    n_heads: int = 1  # the paper uses one head; the original code supports several
    dropout: float = 0.2  # §IV-C: 0.2 for ML-1M, 0.5 for the sparse datasets
    # Dropout on the attention weights. The original code applies `dropout` there; any value
    # > 0 forces PyTorch's unfused (slower) attention path; benchmarks/speed.py throughput --variant
    # measures the cost on a machine.
    attn_dropout: float = 0.2
    # original code: item embeddings are multiplied by sqrt(d) before the positional embedding
    # is added; the paper's Eq. 1 adds them unscaled.
    scale_embedding: bool = True
    # original code: a LayerNorm on the output of the last block; the paper has none.
    final_norm: bool = True
    # "original": Q = LN(x), K = V = x (keys and values from the un-normalised input), and the
    #   residual adds the normalised input: x = LN(x) + SA(LN(x), x); x = LN(x) + FFN(LN(x)),
    #   with dropout inside the FFN (after the ReLU and after the second layer).
    # "paper": g(x) = x + Dropout(g(LayerNorm(x))) for both sub-layers (§III-C).
    # "ligr": the LiGR layer (Borisyuk et al. 2025) that eSASRec (Tikhonovich et al., RecSys 2025)
    #   puts in SASRec, as RecTools builds it: x = x + σ(W_g1 x) ⊙ Dropout(MHA(LN(x))), then
    #   x = x + σ(W_g2 x) ⊙ Dropout(SwiGLU(LN(x))) (hidden 4d, no biases, dropout inside), the
    #   attention with an output projection, LayerNorm's ε 1e-5; no final LayerNorm in RecTools
    #   (`final_norm = false` in its recipe, configs/ml-1m-esasrec.toml).
    block: Literal["original", "paper", "ligr"] = "original"
    # Initialisation. "xavier": Glorot-uniform weights, zero biases (TensorFlow's defaults, which
    # the original code's layers use); "normal": N(0, init_std) for embeddings and weights, as
    # the PyTorch SASRec+ code (Klenitskiy & Vasilev 2023) and RecBole.
    init: Literal["xavier", "normal"] = "xavier"
    init_std: float = 0.02
    # The prediction layer shares the input item embedding M (§III-D, the default). False gives
    # it its own embedding: the paper's "Unshared IE" ablation (Table IV) and gSASRec's default.
    shared_embedding: bool = True
    # "torch": nn.Dropout. "fast": the same inverted dropout with its mask drawn from 16 random
    # bits per element (models/dropout.py), cheaper to draw on a CPU; a speed option, its
    # effect on quality is measured in docs/results/performance.md.
    dropout_impl: DropoutKind = "torch"


class CausalSelfAttention(nn.Module):
    """Eq. 2 with the causality mask of §III-B: position t attends to positions <= t that hold
    an item. The original code has no output projection after the heads; neither has this."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.n_heads = cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model)  # W^Q
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)  # W^K, W^V
        self.attn_dropout = cfg.attn_dropout

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        """queries (B, Lq, D) attend to keys (B, L, D) where keep (B, 1, Lq, L) -> (B, Lq, D)."""
        B, Lq, D = queries.shape
        L, h = keys.shape[1], self.n_heads
        q = self.q(queries).view(B, Lq, h, D // h).transpose(1, 2)  # (B, h, Lq, D/h)
        k, v = self.kv(keys).view(B, L, 2, h, D // h).permute(2, 0, 3, 1, 4)  # (B, h, L, D/h)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=self.attn_dropout if self.training else 0.0
        )  # (B, h, Lq, D/h)
        return y.transpose(1, 2).reshape(B, Lq, D)


class FeedForward(nn.Module):
    """Eq. 4: ReLU(S W1 + b1) W2 + b2, d -> d -> d."""

    def __init__(self, cfg: SASRecConfig, inner_dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.fc2 = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = dropout(inner_dropout, cfg.dropout_impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class Block(nn.Module):
    """A self-attention block (§III-B/C): pre-LN attention, then pre-LN feed-forward."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        self.original = cfg.block == "original"
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=1e-8)  # the original code's epsilon
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=1e-8)
        self.ffn = FeedForward(cfg, cfg.dropout if self.original else 0.0)
        self.dropout = dropout(cfg.dropout, cfg.dropout_impl)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """x (B, L, D) -> (B, L, D); with `last_only` the last position's output only (B, 1, D),
        every position still a key: what scoring needs from the last block, at 1/L the cost."""

        def rows(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
            return last_positions(t, 1, dim) if last_only else t

        keep = rows(keep, 2)
        if self.original:
            q = rows(self.ln1(x))
            y = q + self.attn(q, x, keep)  # original code: keys from x, residual from LN(x)
            f = self.ln2(y)
            return f + self.dropout(self.ffn(f))  # original code: residual from LN(x)
        a = self.ln1(x)
        y = rows(x) + self.dropout(self.attn(rows(a), a, keep))
        return y + self.dropout(self.ffn(self.ln2(y)))


class SwiGLU(nn.Module):
    """The LiGR feed-forward: W2 Dropout(SiLU(W1 x) ⊙ W3 x), d -> 4d -> d, no biases."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        hidden = 4 * cfg.d_model
        self.fc1 = nn.Linear(cfg.d_model, hidden, bias=False)
        self.fc3 = nn.Linear(cfg.d_model, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, cfg.d_model, bias=False)
        self.dropout = dropout(cfg.dropout, cfg.dropout_impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.silu(self.fc1(x)) * self.fc3(x)))


class LiGRBlock(nn.Module):
    """A LiGR layer (`block = "ligr"`): pre-LN sub-layers whose residual branches are gated by
    a sigmoid of the un-normalised input."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)  # the attention's output projection
        self.gate1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn = SwiGLU(cfg)
        self.gate2 = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout1 = dropout(cfg.dropout, cfg.dropout_impl)
        self.dropout2 = dropout(cfg.dropout, cfg.dropout_impl)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """As `Block.forward`: x (B, L, D) -> (B, L, D), or the last position only."""
        if last_only:
            keep = last_positions(keep, 1, 2)
        a = self.ln1(x)
        rows = last_positions(x, 1, 1) if last_only else x
        queries = last_positions(a, 1, 1) if last_only else a
        y = rows + torch.sigmoid(self.gate1(rows)) * self.dropout1(
            self.proj(self.attn(queries, a, keep))
        )
        return y + torch.sigmoid(self.gate2(y)) * self.dropout2(self.ffn(self.ln2(y)))


class SASRec(SequenceModel):
    item_tables = ("item_emb", "out_emb")

    def __init__(self, n_items: int, cfg: SASRecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or SASRecConfig()
        self.n_items = n_items
        # M: rows 0 (padding, kept at zero) and 1..n; shared with the prediction layer (§III-D)
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)  # P (n x d), learnable
        self.dropout = dropout(
            cfg.dropout, cfg.dropout_impl
        )  # on the input embedding (§III-C "Dropout")
        layer = LiGRBlock if cfg.block == "ligr" else Block
        self.layers = nn.ModuleList(layer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=1e-8) if cfg.final_norm else None
        # N: the prediction layer's item embedding when it is not M (§III-D, Eq. 7)
        self.out_emb = (
            None if cfg.shared_embedding else nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)
        )
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            if self.cfg.init == "xavier":
                nn.init.xavier_uniform_(module.weight)
            else:
                nn.init.normal_(module.weight, std=self.cfg.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()

    @property
    def max_len(self) -> int:
        """Histories the scorer reads: the last n items."""
        return self.cfg.max_len

    def forward(
        self,
        input_ids: torch.Tensor,
        last_only: bool = False,
        segments: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, L) left-padded, L <= n -> hidden states F (B, L, D); F_t depends on
        s_1..s_t only. `last_only`: F at the last position only, (B, 1, D).

        Packed rows (training, `NextItemConfig.pack`): `segments` (B, L) numbers the sequences
        sharing a row (0 = padding) and `position_ids` (B, L) gives each item its position;
        a position attends only to earlier ones of its own segment."""
        B, L = input_ids.shape
        dev = input_ids.device
        if position_ids is None:
            if self.cfg.max_len < L:
                raise ValueError(f"input length {L} exceeds max_len {self.cfg.max_len}")
            position_ids = torch.arange(self.cfg.max_len - L, self.cfg.max_len, device=dev)
        e = self.item_emb(input_ids)  # (B, L, D)
        if self.cfg.scale_embedding:
            e = e * math.sqrt(self.cfg.d_model)  # original code
        real = input_ids != 0  # (B, L)
        x = self.dropout(e + self.pos_emb(position_ids)) * real[..., None]  # padding stays zero
        # Position t may attend to s <= t holding an item (of its own segment); a padding slot
        # attends to itself at least (it needs one key; its output is never read).
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
        if segments is None:
            diagonal = torch.eye(L, dtype=torch.bool, device=dev)
            keep = (causal & (real[:, None, :] | diagonal))[:, None]  # (B, 1, L, L)
        else:
            keep = (causal & (segments[:, :, None] == segments[:, None, :]))[:, None]
        for i, layer in enumerate(self.layers):
            x = layer(x, keep, last_only=last_only and i == len(self.layers) - 1)
        if self.final_norm is not None:
            x = self.final_norm(x)  # original code
        return x

    def item_embeddings(self) -> torch.Tensor:
        """(n_items, D): the rows of M for items 1..n."""
        return self.item_emb.weight[1:]

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The prediction layer reads F_t as it is: r_{i,t} = F_t M_i^T (§III-D)."""
        return hidden

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prediction layer's (n_items, D) weights (M, shared with the input, unless
        `shared_embedding` is off); no bias."""
        if self.out_emb is not None:
            return self.out_emb.weight[1:], None
        return self.item_embeddings(), None

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """histories (B, L) left-padded -> (B, D): F at the last position (§III-D)."""
        return self.forward(last_positions(histories, self.max_len), last_only=True)[:, -1]


def _next_item_batches(cfg: RunConfig, ds: PreparedDataset) -> Sampler:
    return next_item_batches(cfg, ds, cfg.sasrec.max_len)


# the registry entry (seqrec.models.registry): the architecture, its shifted next-item task (§III-E)
# and its recipe where it differs from TrainConfig's (BERT4Rec's) defaults: §IV-C and the
# original code: Adam, lr 1e-3, β2 0.98 (eps 1e-8, TensorFlow's), no weight decay, a constant
# learning rate, no clipping, batch 128, BCE with 1 negative
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """SASRec's parameters by formula: embeddings, blocks of LN, W^Q, W^K|V, LN, FFN (LiGR's:
    and the attention's projection, two gates, a bias-free SwiGLU of 4d)."""
    c, d = cfg.sasrec, cfg.sasrec.d_model
    block = 2 * d + linear(d, d) + linear(d, 2 * d) + 2 * d + 2 * linear(d, d)
    if c.block == "ligr":
        block = 2 * d + linear(d, d) + linear(d, 2 * d) + 3 * linear(d, d) + 2 * d + 3 * 4 * d * d
    out = 0 if c.shared_embedding else (n_items + 1) * d
    return (n_items + 1) * d + c.max_len * d + c.n_layers * block + 2 * d * c.final_norm + out


ENTRY = ModelEntry(
    name="sasrec",
    sections={"sasrec": SASRecConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: SASRec(n_items, cfg.sasrec),
    parameters=_parameters,
    batches=_next_item_batches,
    train_defaults={
        **BASELINE_TRAIN,  # Adam at 1e-3, batch 128, no schedule (§IV-C)
        "beta2": 0.98,
        "loss": "bce",
        "n_negatives": 1,
    },
)
