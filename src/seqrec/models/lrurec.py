"""LRURec (Yue et al., "Linear Recurrent Units for Sequential Recommendation", WSDM 2024), as the
authors' code (yueqirex/LRURec, `model/lru.py`) builds and trains it.

The item embedding (no position embedding: the recurrence orders the items) goes through dropout
and a LayerNorm, then `n_layers` blocks, each an LRU layer and a position-wise feed-forward
network. An LRU layer is a linear recurrence with a diagonal complex transition,

    h_t = λ ⊙ h_{t-1} + γ ⊙ (B x_t),    y_t = LayerNorm(Dropout(Re(C h_t)) + x_t),

where λ = exp(-exp(ν) + i·exp(θ)) (|λ| < 1: stable), γ = sqrt(1 - |λ|²) normalises the input,
B (d → 2d) and C (2d → d) are complex linear maps with biases (held as the equivalent real maps:
one real matmul each), and ν, θ, γ are learnt in log space, λ's modulus initialised uniformly in
the ring [r_min, r_max]. Training computes every h_t at once, where a padding item contributes
nothing: by the parallel scan the authors use (recursive doubling over a length padded to a
power of two: log2(L) steps, each combining the halves of blocks of twice the size), or by
chunks (`scan = "chunked"`, the default: the same states, every chunk's own by C element-wise
steps taken for all chunks at once, the chunks' last states carried by one batched matmul with
λ's powers); scoring reads the last position. The scores are the last
hidden state times the item embedding plus an item bias. Trained with the next-item task on
every position and cross-entropy over the whole catalogue (the authors' trainer), AdamW.
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

__all__ = ["ENTRY", "LRURec", "LRURecConfig"]


@dataclass(frozen=True)
class LRURecConfig:
    """The authors' defaults (config.py, ML-1M)."""

    max_len: int = 200  # bert_max_len (ML-1M; 50 for Beauty)
    d_model: int = 64  # bert_hidden_units; the recurrence's state is 2 * d_model complex
    n_layers: int = 2  # bert_num_blocks
    dropout: float = 0.2  # bert_dropout: the embedding's and the feed-forward network's
    lru_dropout: float = 0.2  # bert_attn_dropout: on the LRU layer's output
    r_min: float = 0.8  # the ring λ's modulus is drawn from at initialisation
    r_max: float = 0.99
    # "torch": nn.Dropout (the authors'). "fast": the same inverted dropout with a cheaper mask
    # (models/dropout.py); a speed option, as for SASRec (docs/results/performance.md)
    dropout_impl: DropoutKind = "torch"
    # How the recurrence is computed in training, the same states either way (to float
    # rounding; tests/test_lrurec.py): "doubling", the authors' recursive doubling (log2(L)
    # passes of element-wise work and copies); "chunked", every chunk of SCAN_CHUNK positions
    # from its own inputs by SCAN_CHUNK element-wise steps (all chunks at once), then the
    # chunks' last states carried across the chunks by one small batched matmul (a speed option:
    # docs/results/baselines.md, "LRURec on ML-1M")
    scan: Literal["chunked", "doubling"] = "chunked"


def _trunc_normal_(p: torch.Tensor, std: float = 0.02, bound: float = 0.04) -> None:
    """The authors' truncated normal (mean 0, std 0.02, cut at ±0.04); on B's and C's real
    and imaginary parts alike, as they draw them."""
    with torch.no_grad():
        nn.init.trunc_normal_(p, mean=0.0, std=std, a=-bound, b=bound)


class LRULayer(nn.Module):
    def __init__(self, cfg: LRURecConfig) -> None:
        super().__init__()
        d, n = cfg.d_model, 2 * cfg.d_model
        # λ = exp(-ν + iθ): |λ| uniform in [r_min, r_max] (by area), θ uniform in [0, 2π)
        u1, u2 = torch.rand(n), torch.rand(n)
        nu_log = torch.log(-0.5 * torch.log(u1 * (cfg.r_max**2 - cfg.r_min**2) + cfg.r_min**2))
        theta_log = torch.log(u2 * 2 * math.pi)
        modulus = torch.exp(-torch.exp(nu_log))
        gamma_log = torch.log(torch.sqrt(1 - modulus**2))
        self.params_log = nn.Parameter(torch.stack((nu_log, theta_log, gamma_log)))
        # B and C are complex maps with biases, held as real ones (the same functions, a real
        # matmul each instead of complex arithmetic): x is real, so B x + b is
        # (B_re x + b_re) + i (B_im x + b_im), one real map d -> 2n; and Re(C h + c) is
        # [C_re, -C_im] [h_re; h_im] + c_re, one real map 2n -> d (c_im never reaches the output)
        self.in_proj = nn.Linear(d, 2 * n)  # [B_re; B_im]
        self.out_proj = nn.Linear(2 * n, d)  # [C_re, -C_im]
        self.dropout = dropout(cfg.lru_dropout, cfg.dropout_impl)
        self.layer_norm = nn.LayerNorm(d)
        self.scan = _scan_chunked if cfg.scan == "chunked" else _scan

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """x (B, L, D) with L the model's `width`, real (B, L) bool: False at padding."""
        nu, theta, gamma = torch.exp(self.params_log).unbind(0)
        lamb = torch.exp(torch.complex(-nu, theta))  # (2D,)
        re, im = self.in_proj(x).float().chunk(2, dim=-1)
        h = self.scan(torch.complex(re * gamma, im * gamma), lamb, real)  # γ ⊙ (B x_t), scanned
        y = self.out_proj(torch.cat([h.real, h.imag], dim=-1).to(x.dtype))
        return self.layer_norm(self.dropout(y) + x)


def _scan(h: torch.Tensor, lamb: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """h_t = λ h_{t-1} + u_t for every t at once (u = `h`), by recursive doubling: at step i
    the second half of every block of 2^i positions adds the first half's last state times
    λ^1..λ^(2^(i-1)); a first half ending in padding (all padding, the rows being left-padded)
    passes nothing on."""
    B, L, D = h.shape
    powers = lamb[None]  # λ^1..λ^(size / 2), (size / 2, 2D)
    size = 2
    while size <= L:
        blocks = h.reshape(B * L // size, size, D)
        keep = real.reshape(B * L // size, size)[:, size // 2 - 1 : size // 2, None]
        first, second = blocks[:, : size // 2], blocks[:, size // 2 :]
        second = second + powers * first[:, -1:] * keep
        h = torch.cat([first, second], dim=1).reshape(B, L, D)
        powers = torch.cat([powers, powers * powers[-1]], dim=0)
        size *= 2
    return h


# positions per chunk of the chunked scan (timed with the element-wise steps: the scan alone
# within a quarter of each other at 8, 10 and 20, slower at 4 and 40; a training step alike at
# 8 and 10)
SCAN_CHUNK = 8


def _powers(log_lamb: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """λ^k for every k of `exponents` (K,) and every channel: (K, 2D), from log λ."""
    return torch.exp(exponents.to(log_lamb.real.dtype)[:, None] * log_lamb[None])


def _lower(powers: torch.Tensor) -> torch.Tensor:
    """(K, 2D) powers λ^0..λ^(K-1) -> (K, K, 2D): entry (t, s) is λ^(t-s) for s <= t, else 0."""
    k = torch.arange(powers.shape[0], device=powers.device)
    diff = k[:, None] - k[None, :]
    return powers[diff.clamp(min=0)] * (diff >= 0)[..., None]


def _scan_chunked(h: torch.Tensor, lamb: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The states of `_scan` at the real positions, by chunks: with padding inputs zeroed (a
    padding item contributes nothing, as in `_scan`), a chunk's states from its own inputs are
    s_t = λ s_(t-1) + u_t within it, and a chunk's incoming state is the chunks before it,
    each chunk's last local state carried by λ^C per chunk (the same triangle, over chunks)."""
    B, L, D = h.shape
    C = min(SCAN_CHUNK, L)
    if L % C:
        raise ValueError(f"the chunked scan needs a length divisible by {C}, got {L}")
    N = L // C
    u = (h * real[..., None].to(h.real.dtype)).reshape(B, N, C, D)
    log_lamb = torch.log(lamb)
    powers = _powers(log_lamb, torch.arange(C + 1, device=h.device))  # λ^0..λ^C
    # within each chunk, every chunk at once: C steps of s_t = λ s_(t-1) + u_t (the same
    # T u as one batched matmul over the channels, which copies u into the channels-first
    # layout and back: measured twice the time forward and backward)
    inputs = u.unbind(2)  # one backward copy (a slice each would zero-fill u's size each)
    states = [inputs[0]]
    for t in range(1, C):
        states.append(lamb * states[-1] + inputs[t])
    local = torch.stack(states, dim=2)  # (B, N, C, D)
    if N == 1:
        return local.reshape(B, L, D)
    across = _lower(_powers(log_lamb, C * torch.arange(N, device=h.device)))  # λ^(C (n - m))
    ends = torch.einsum("nmd,bmd->bnd", across, local[:, :, -1])  # each chunk's last state
    incoming = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], dim=1)
    return (local + powers[1:] * incoming[:, :, None]).reshape(B, L, D)


class FeedForward(nn.Module):
    """The authors' PositionwiseFeedForward: LayerNorm(x + Dropout(W2 Dropout(GELU(W1 x)))),
    d -> 4d -> d."""

    def __init__(self, cfg: LRURecConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.w_2 = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.dropout = dropout(cfg.dropout, cfg.dropout_impl)
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(F.gelu(self.w_1(x)))
        return self.layer_norm(self.dropout(self.w_2(y)) + x)


class Block(nn.Module):
    def __init__(self, cfg: LRURecConfig) -> None:
        super().__init__()
        self.lru_layer = LRULayer(cfg)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return self.feed_forward(self.lru_layer(x, real))


class LRURec(SequenceModel):
    # the scan is complex arithmetic, which torch's ONNX exporter does not convert; TorchScript
    # export works
    onnx_export = False
    item_tables = ("item_emb",)
    item_biases = (("bias", 1),)

    def __init__(self, n_items: int, cfg: LRURecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LRURecConfig()
        self.n_items = n_items
        # the authors' embedding has no padding row: padding positions never reach a state
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model)
        self.emb_dropout = dropout(cfg.dropout, cfg.dropout_impl)
        self.emb_norm = nn.LayerNorm(cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.bias = nn.Parameter(torch.zeros(n_items + 1))
        # the authors' init: every parameter but the LayerNorms' and the recurrence's ν, θ, γ
        for name, p in self.named_parameters():
            if "norm" not in name and "params_log" not in name:
                _trunc_normal_(p)

    @property
    def max_len(self) -> int:
        return self.cfg.max_len

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, L) left-padded, L <= max_len -> hidden states (B, L, D); h_t reads
        s_1..s_t only. The scan runs over `width` positions: one width for every input, a traced
        export's too."""
        L = input_ids.shape[1]
        pad = self.width - L
        ids = F.pad(input_ids, (pad, 0))
        x = self.emb_norm(self.emb_dropout(self.item_emb(ids)))
        for block in self.blocks:
            x = block(x, ids != 0)
        return x[:, pad:]

    @property
    def width(self) -> int:
        """The scan's length: for the doubling scan the power of two at or above max_len, as the
        authors' batches (always max_len wide) run it; for the chunked scan the multiple of
        SCAN_CHUNK at or above max_len (200 for ML-1M, not 256: the left padding only adds
        positions whose inputs are zeroed, so the real positions' states are the same)."""
        if self.cfg.scan == "chunked":
            return -(-self.cfg.max_len // SCAN_CHUNK) * SCAN_CHUNK
        return 1 << max(0, (self.cfg.max_len - 1).bit_length())

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The item embedding (shared with the input) and the item bias."""
        return self.item_emb.weight[1:], self.bias[1:]

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward(last_positions(histories, self.max_len))[:, -1]


def _batches(cfg: RunConfig, ds: PreparedDataset) -> Sampler:
    return next_item_batches(cfg, ds, cfg.lrurec.max_len)


def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """LRURec's parameters by formula: embedding, blocks (LRU of 2d states, FFN), bias."""
    d = cfg.lrurec.d_model
    lru = 3 * 2 * d + linear(d, 4 * d) + linear(4 * d, d) + 2 * d
    ffn = linear(d, 4 * d) + linear(4 * d, d) + 2 * d
    return (n_items + 1) * d + 2 * d + cfg.lrurec.n_layers * (lru + ffn) + n_items + 1


ENTRY = ModelEntry(
    name="lrurec",
    sections={"lrurec": LRURecConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: LRURec(n_items, cfg.lrurec),
    parameters=_parameters,
    batches=_batches,
    # the authors' trainer: AdamW at 1e-3, weight decay 0.01 (not on biases and LayerNorms),
    # eps 1e-9, gradients clipped at norm 5, batch 128, no schedule, full cross-entropy
    train_defaults={
        "lr": 1e-3,
        "eps": 1e-9,
        "weight_decay": 0.01,
        "decay": "none",
        "warmup_steps": 0,
        "clip_norm": 5.0,
        "batch_size": 128,
        "loss": "ce",
    },
    # a recurrence over a row: one user's sequence per row, no packing
    whole_rows=True,
)
