"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"), read top to bottom: config,
attention bias, layer, model. Read from the authors' research code (generative-recommenders,
`research/modeling/sequential/hstu.py`, the configuration its ML-1M results were trained with).

A layer (the paper's Eq. 1-3) on its input x:

    U, V, Q, K = split(SiLU(LayerNorm(x) W))              one projection, no bias
    A = SiLU(Q K^T + rab) / N  (causal, keys holding an item)  pointwise, no softmax
    x = x + W_o Dropout(U * LayerNorm(A V))                gated by U

with rab a learned bias of the relative position j - i of key and query (one per layer), N the
window length, and no affine parameters in either LayerNorm (epsilon 1e-6). The input is the
item embedding times sqrt(d) plus a learned embedding of the absolute position from the
window's oldest item, with dropout; the output is L2-normalised, as the item embeddings it is
scored against are, and divided by a temperature (scores are cosines / 0.05).

With `time_bias` (for a log with timestamps; the papers' ML-1M file has none) rab also adds,
as the authors' bias does, a learned value per bucket of the time between query and key:
bucket floor(ln(max(|t_q - t_j|, 1)) / 0.301), at most `time_buckets`, where t_j is when key j
happened and t_q, for query i, when the item after i happened (in training, its target; for
the last position, the time the recommendation is asked for: in evaluation the held-out
item's, in serving the request's).

With `head = "mol"` the score is the Mixture of Logits of seqrec.models.mol (the authors' best
ML-1M row, "HSTU + MoL") instead of the cosine: as in the authors' MoL configuration, the output
is layer-normalised (no affine parameters) rather than L2-normalised, and the item embeddings
enter the head as they are. It trains with a sampled loss only (each score is computed per
(position, item) pair), and is scored over the whole catalogue, not in blocks or through an index.

Named deviations from the authors' code:
- N: the window (`max_len`) rather than the authors' padded length (max_len + 11 output
  slots). The factor 1/N is followed by LayerNorm(A V), which undoes any constant scale but
  for its epsilon.
- Negatives (`train.n_negatives` 128, sampled softmax): drawn uniformly among the items the
  user has not seen (seqrec's next-item sampler), where the authors draw over the whole
  catalogue.

Ids: 0 = padding, 1..n_items = items; inputs are left-padded (most recent item last).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batches import NextItemConfig
from seqrec.errors import ConfigError
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    Sampler,
    SequenceModel,
    last_positions,
    linear,
    next_item_batches,
)
from seqrec.models.mol import MixtureOfLogits, MoLConfig, mol_parameters

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.prepared import PreparedDataset

__all__ = ["ENTRY", "HSTU", "HSTUConfig"]

_EPS = 1e-6  # the authors' LayerNorm and L2-norm epsilon


@dataclass(frozen=True)
class HSTUConfig:
    """Architecture. Defaults: the authors' ML-1M "HSTU" configuration (the paper's base row);
    their "HSTU-large" is n_layers 8, n_heads 2, d_qk 25, d_v 25."""

    max_len: int = 200  # N, the window
    d_model: int = 50  # d, item embeddings and the layers' width
    n_layers: int = 2
    n_heads: int = 1
    d_qk: int = 50  # per head: queries and keys
    d_v: int = 50  # per head: values and the gate U
    dropout: float = 0.2  # on the input embedding and before W_o
    # the scores are cos(user, item) / temperature (the output and the item embeddings are
    # L2-normalised)
    temperature: float = 0.05
    # the learned relative-position attention bias (the authors' default); false: none
    position_bias: bool = True
    # the learned bias of the time between query and key (the authors' ML-1M configuration has
    # it): needs a log with timestamps, and `times` wherever the model is scored
    time_bias: bool = False
    time_buckets: int = 128  # the authors' num_buckets: buckets 0..128 of the log time gap
    # the score: "dot", the cosine over the temperature; "mol", the Mixture of Logits of the
    # [mol] section (seqrec.models.mol)
    head: Literal["dot", "mol"] = "dot"


_TIME_BUCKET = 0.301  # the authors' bucket width in ln(seconds)


def time_buckets(times: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """(B, L, L) bucket of the time between query i and key j, from `times` (B, L + 1): the L
    keys' times, then the time of the last query's next item (query i's next item is key
    i + 1)."""
    L = times.shape[1] - 1
    gap = times[:, 1:, None] - times[:, None, :L]
    ln = torch.log(gap.abs().clamp(min=1).float())  # the gap in int64, its log in float32
    return torch.div(ln, _TIME_BUCKET, rounding_mode="floor").long().clamp(0, n_buckets)


def _relative_bias(weights: torch.Tensor, n: int, queries: int) -> torch.Tensor:
    """(queries, n) bias of the last `queries` of n positions against all n: weights[c + j - i]
    for query i and key j, with c = len(weights) // 2 the weight of the same position. The
    bias reads only the offset, so left padding and packing do not move it."""
    c = weights.shape[0] // 2
    i = torch.arange(n - queries, n, device=weights.device)
    j = torch.arange(n, device=weights.device)
    return weights[(c + j[None, :] - i[:, None]).clamp(0, weights.shape[0] - 1)]


class HSTULayer(nn.Module):
    """One sequential transduction unit (Eq. 1-3 above)."""

    def __init__(self, cfg: HSTUConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.n_heads
        width = 2 * h * cfg.d_v + 2 * h * cfg.d_qk
        self.uvqk = nn.Parameter(torch.empty(cfg.d_model, width).normal_(0.0, 0.02))
        self.out = nn.Linear(h * cfg.d_v, cfg.d_model)  # W_o
        nn.init.xavier_uniform_(self.out.weight)
        self.rab = (
            nn.Parameter(torch.empty(2 * cfg.max_len - 1).normal_(0.0, 0.02))
            if cfg.position_bias
            else None
        )
        self.time_w = (
            nn.Parameter(torch.empty(cfg.time_buckets + 1).normal_(0.0, 0.02))
            if cfg.time_bias
            else None
        )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        keep: torch.Tensor,
        last_only: bool = False,
        buckets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, L, D), keep (B, 1, L, L) -> (B, L, D); with `last_only` the last position's
        output only (B, 1, D), every position still a key. `buckets` (B, L or 1, L): the time
        buckets of `time_buckets` (with `time_bias`)."""
        c = self.cfg
        B, L, _ = x.shape
        h = c.n_heads
        mixed = F.silu(F.layer_norm(x, (c.d_model,), eps=_EPS) @ self.uvqk)
        u, v, q, k = mixed.split([h * c.d_v, h * c.d_v, h * c.d_qk, h * c.d_qk], dim=-1)
        if last_only:
            u, q, x = (last_positions(t, 1, 1) for t in (u, q, x))
            keep = last_positions(keep, 1, 2)
        Lq = q.shape[1]
        q = q.reshape(B, Lq, h, c.d_qk).transpose(1, 2)  # (B, h, Lq, d_qk)
        k = k.reshape(B, L, h, c.d_qk).transpose(1, 2)
        v = v.reshape(B, L, h, c.d_v).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)  # (B, h, Lq, L)
        if self.rab is not None:
            scores = scores + _relative_bias(self.rab, L, Lq)
        if self.time_w is not None:
            if buckets is None:
                raise ValueError("hstu.time_bias: the layer needs the time buckets")
            scores = scores + self.time_w[last_positions(buckets, Lq, 1)][:, None]
        attn = F.silu(scores) * (keep / c.max_len)  # pointwise; 0 where a key is not kept
        a = (attn @ v).transpose(1, 2).reshape(B, Lq, h * c.d_v)
        gated = u * F.layer_norm(a, (h * c.d_v,), eps=_EPS)
        return x + self.out(self.dropout(gated))


class HSTU(SequenceModel):
    item_tables = ("item_emb",)

    def __init__(
        self, n_items: int, cfg: HSTUConfig | None = None, mol: MoLConfig | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg = cfg or HSTUConfig()
        # the Mixture of Logits head, or None (the cosine)
        self.mol = MixtureOfLogits(cfg.d_model, mol or MoLConfig()) if cfg.head == "mol" else None
        self.dot_product_output = self.mol is None
        self.n_items = n_items
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)
        nn.init.trunc_normal_(self.item_emb.weight, std=0.02, a=-0.04, b=0.04)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)  # from the window's oldest item
        nn.init.xavier_normal_(self.pos_emb.weight)  # what the authors' reset_params leaves
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(HSTULayer(cfg) for _ in range(cfg.n_layers))

    @property
    def max_len(self) -> int:
        return self.cfg.max_len

    def forward(
        self,
        input_ids: torch.Tensor,
        last_only: bool = False,
        segments: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, L) left-padded, L <= max_len -> hidden states (B, L, D); position t
        reads items 1..t of its sequence only. `last_only`: the last position only, (B, 1, D).
        Packed rows (`NextItemConfig.pack`): `segments` (B, L) numbers the sequences sharing a
        row (0 = padding), `position_ids` (B, L) each item's column in a left-padded row of
        max_len (the packer's); either way an item's position is counted from its sequence's
        oldest item. `times` (B, L + 1) int64, with `time_bias` (and then needed): the items'
        times in seconds, then the time of the last position's next item."""
        B, L = input_ids.shape
        if self.cfg.max_len < L:
            raise ValueError(f"input length {L} exceeds max_len {self.cfg.max_len}")
        buckets = None
        if self.cfg.time_bias:
            if times is None or times.shape != (B, L + 1):
                raise ValueError(
                    f"hstu.time_bias reads `times` (B, L + 1) = ({B}, {L + 1}) seconds: the "
                    "items' times and the time of the next item"
                    + ("" if times is None else f", got {tuple(times.shape)}")
                )
            buckets = time_buckets(times, self.cfg.time_buckets)
        real = input_ids != 0
        causal = torch.ones(L, L, dtype=torch.bool, device=input_ids.device).tril()
        keep = causal & real[:, None, :]
        if position_ids is None:  # from the oldest item of each row's window
            first = L - real.sum(1, keepdim=True)
            position_ids = torch.arange(L, device=input_ids.device)[None, :] - first
        else:  # packed positions count as a left-padded row's; here from each sequence's start
            same = segments[:, :, None] == segments[:, None, :] if segments is not None else keep
            keep = keep & same
            start = torch.where(same, position_ids[:, None, :], self.cfg.max_len).min(2).values
            position_ids = position_ids - start
        position_ids = position_ids.clamp(0, self.cfg.max_len - 1)
        e = self.item_emb(input_ids) * math.sqrt(self.cfg.d_model) + self.pos_emb(position_ids)
        x = self.dropout(e) * real[..., None]
        keep_f = keep[:, None].to(x.dtype)  # (B, 1, L, L)
        for i, layer in enumerate(self.layers):
            x = layer(x, keep_f, last_only and i == len(self.layers) - 1, buckets)
        return x

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The L2-normalised output over the temperature (with the MoL head: layer-normalised)."""
        if self.mol is not None:
            return F.layer_norm(hidden, (self.cfg.d_model,), eps=_EPS)
        return F.normalize(hidden, dim=-1, eps=_EPS) / self.cfg.temperature

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The L2-normalised item embeddings of items 1..n; no bias. With the MoL head: the
        item embeddings themselves, what the head reads (and item-to-item similarity), not a
        layer whose product with the features is the score."""
        if self.mol is not None:
            return self.item_emb.weight[1:], None
        return F.normalize(self.item_emb.weight[1:], dim=-1, eps=_EPS), None

    def pair_logits(self, features: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(M, D) output features, (M, k) item ids -> (M, k) scores (the cosine, or MoL)."""
        if self.mol is None:
            return super().pair_logits(features, items)
        return self.mol.pair_scores(features, self.item_emb.weight, items)

    def sequence_logits(
        self, features: torch.Tensor, items: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """(B, L, D) output features, (B, k) each row's items, (B, L) bool positions -> (M, k)
        (the cosine, or MoL)."""
        if self.mol is None:
            return super().sequence_logits(features, items, positions)
        return self.mol.sequence_scores(features, self.item_emb.weight, items, positions)

    @torch.no_grad()
    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories -> (B, n_items + 1), column 0 -inf (with MoL, blocks of items)."""
        if self.mol is None:
            return super().score(histories, users, times)
        features = self.user_features(histories, users, times)
        scores = self.mol.score(features, self.item_emb.weight[1:])
        return torch.cat([torch.full_like(scores[:, :1], -math.inf), scores], dim=1)

    @property
    def uses_times(self) -> bool:
        return self.cfg.time_bias

    def user_vector(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """histories (B, L) left-padded -> (B, D): the last position's output; `times` (B, L + 1)
        with `time_bias`."""
        if times is not None:  # the window's items' times and the query's
            times = last_positions(times, self.max_len + 1)
        histories = last_positions(histories, self.max_len)
        return self.forward(histories, last_only=True, times=times)[:, -1]


def _batches(cfg: RunConfig, ds: PreparedDataset) -> Sampler:
    return next_item_batches(cfg, ds, cfg.hstu.max_len, times=cfg.hstu.time_bias)


def _validate(cfg: RunConfig, ds: PreparedDataset | None) -> None:
    """`time_bias` reads the log's timestamps, row by row: a dataset with them, no packing. The
    MoL head scores (position, item) pairs: a sampled loss, negatives per position or sequence."""
    pairs = cfg.train.loss != "ce" and cfg.train.negatives_per != "batch"
    if cfg.hstu.head == "mol" and not pairs:
        raise ConfigError(
            'hstu.head = "mol" scores (position, item) pairs: it trains with a sampled loss and '
            'train.negatives_per "position" or "sequence", got '
            f"{cfg.train.loss!r} / {cfg.train.negatives_per!r}"
        )
    if not cfg.hstu.time_bias:
        return
    if cfg.next_item.pack:
        raise ConfigError("hstu.time_bias reads each row's times: next_item.pack must be false")
    if ds is not None and ds.sequences.times is None:
        raise ConfigError(
            f"hstu.time_bias: {ds.name} has no timestamps (the papers' user-item files and logs "
            "read without a time column have none); set hstu.time_bias = false"
        )


def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """HSTU's parameters by formula: item and position embeddings, then per layer the UVQK
    projection (no bias), W_o and the position bias."""
    c = cfg.hstu
    h = c.n_heads
    layer = c.d_model * (2 * h * c.d_v + 2 * h * c.d_qk) + linear(h * c.d_v, c.d_model)
    layer += (2 * c.max_len - 1) * c.position_bias
    layer += (c.time_buckets + 1) * c.time_bias
    head = mol_parameters(c.d_model, cfg.mol) if c.head == "mol" else 0
    return (n_items + 1) * c.d_model + c.max_len * c.d_model + c.n_layers * layer + head


# the registry entry: the shifted next-item task, and the authors' ML-1M recipe: Adam at 1e-3,
# no weight decay, batch 128, sampled softmax with 128 negatives
ENTRY = ModelEntry(
    name="hstu",
    sections={"hstu": HSTUConfig, "mol": MoLConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: HSTU(n_items, cfg.hstu, cfg.mol),
    parameters=_parameters,
    batches=_batches,
    validate=_validate,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "sampled_softmax",
        "n_negatives": 128,
    },
)
