"""BERT4Rec (Sun et al., CIKM 2019), read top to bottom: config, blocks, model.

Ids: 0 = padding, 1..n_items = items, n_items + 1 = [MASK]. Inputs are left-padded (most recent
item last) and positions are counted from the end, so the appended [MASK] always sits in the
last positional slot whatever the batch width; a batch cropped to its longest row computes
exactly what the full N-wide batch would (padding is masked out of attention).

The model is architecture only: no loss, no device logic. Which positions are masked is decided
in `seqrec.data.batches`, the loss formula in `seqrec.training.losses`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batches import ClozeConfig, ClozeSampler
from seqrec.models.base import ModelEntry, Sampler, SequenceModel, last_positions, linear
from seqrec.models.dropout import DropoutKind, dropout

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.prepared import PreparedDataset

__all__ = ["BERT4Rec", "BERT4RecConfig", "ENTRY"]


@dataclass(frozen=True)
class BERT4RecConfig:
    """Architecture (§3.2-3.5, §4.3). Defaults: the paper, else the original ML-1M script."""

    max_len: int = 200  # N (§4.3: 200 for ML-1M/ML-20M, 50 for Beauty/Steam)
    d_model: int = 64  # d
    n_layers: int = 2  # L
    n_heads: int = 2  # h (§4.3: head size 32)
    dropout: float = 0.2  # hidden dropout; the paper tunes it, the original ML-1M script uses 0.2
    # Dropout on the attention weights (original code: 0.2). Any value > 0 forces PyTorch's
    # unfused (slower) attention path; the ML-1M recipe sets 0 (docs/results/bert4rec.md, and
    # benchmarks/speed.py throughput --variant to measure the cost on a machine).
    attn_dropout: float = 0.2
    # Initialisation. "trunc_normal": std 0.02 cut at ±2 std, as the original code's
    # truncated_normal_initializer(0.02); "trunc_normal_range": cut at ±0.02, the paper's text
    # ("truncated normal distribution in the range [-0.02, 0.02]"). The code produced the
    # published numbers, so it is the default.
    init: Literal["trunc_normal", "trunc_normal_range"] = "trunc_normal"
    init_std: float = 0.02
    # LayerNorm + dropout on the summed item + position embedding: the original code (BERT's
    # embedding post-processor) does this; Eq. 4 writes only the sum.
    embedding_norm: bool = True
    # LayerNorm after the output transform, LN(GELU(h W^P + b^P)), before the shared item
    # embedding: the original code (BERT's masked-LM head, `cls/predictions/transform`) does
    # this; Eq. 7 writes GELU(h W^P + b^P) only. Without it the transform's output is small at
    # initialisation (its weights have std 0.02), and so is every gradient that reaches the item
    # embeddings through the output layer: training sits on the popularity plateau for longer
    # (docs/results/bert4rec.md).
    head_norm: bool = True
    # The output transform of Eq. 7, GELU(h W^P + b^P) (and head_norm's LayerNorm). False scores
    # the hidden state against the item embeddings directly, h E^T + b^O, as the PyTorch
    # BERT4Rec of Klenitskiy & Vasilev (2023) does; a named deviation (docs/results/bert4rec.md).
    head_transform: bool = True
    # The output bias b^O at initialisation: "zeros" (the original code), or "log_popularity",
    # the log of each item's share of the training interactions, so the model starts where a
    # popularity ranking is and spends no updates learning it (a named deviation).
    out_bias_init: Literal["zeros", "log_popularity"] = "zeros"
    # "torch": nn.Dropout. "fast": the same inverted dropout with its mask drawn from 16 random
    # bits per element (models/dropout.py), cheaper to draw on a CPU; a speed option, its
    # effect on quality is measured in docs/results/performance.md.
    dropout_impl: DropoutKind = "torch"
    # Table 5's ablations (§4.8), each a component removed: "pe" the positional embedding, "pffn"
    # the position-wise feed-forward sublayer, "ln" the LayerNorms of the Transformer layers,
    # "rc" their residual connections. Empty: the paper's model.
    ablate: tuple[Literal["pe", "pffn", "ln", "rc"], ...] = ()


class SelfAttention(nn.Module):
    """Multi-head self-attention (Eq. 1-2), fully bidirectional; padding keys are masked out."""

    def __init__(self, cfg: BERT4RecConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = cfg.attn_dropout

    def forward(self, x: torch.Tensor, keep: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """x (B, L, D) -> (B, L, D), or the last position's output only (B, 1, D)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        if last_only:
            q, keep = last_positions(q, 1), last_positions(keep, 1, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, h, L or 1, D/h)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=self.attn_dropout if self.training else 0.0
        )  # (B, h, L or 1, D/h)
        return self.out(y.transpose(1, 2).reshape(B, q.shape[2], D))


class FeedForward(nn.Module):
    """PFFN (Eq. 3): d -> 4d -> d with the exact (erf) GELU."""

    def __init__(self, cfg: BERT4RecConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc2 = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    """Post-LN block (Eq. 5-6): A = LN(H + Dropout(MH(H))), Trm = LN(A + Dropout(PFFN(A)))."""

    def __init__(self, cfg: BERT4RecConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=1e-12)  # BERT's epsilon
        self.ffn = FeedForward(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.dropout = dropout(cfg.dropout, cfg.dropout_impl)
        self.use_ffn = "pffn" not in cfg.ablate
        self.use_ln = "ln" not in cfg.ablate
        self.residual = "rc" not in cfg.ablate

    def forward(self, h: torch.Tensor, keep: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """h (B, L, D) -> (B, L, D); with `last_only` the last position's output only (B, 1, D),
        every position still a key: what scoring needs from the last layer, at 1/L the cost."""
        a = self.dropout(self.attn(h, keep, last_only))
        if self.residual:
            a = (last_positions(h, 1) if last_only else h) + a
        if self.use_ln:
            a = self.ln1(a)
        if not self.use_ffn:  # Table 5 "w/o PFFN": the layer ends after its attention sublayer
            return a
        out = self.dropout(self.ffn(a))
        if self.residual:
            out = a + out
        return self.ln2(out) if self.use_ln else out


class BERT4Rec(SequenceModel):
    item_tables = ("item_emb",)
    item_biases = (("out_bias", 0),)

    def __init__(self, n_items: int, cfg: BERT4RecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or BERT4RecConfig()
        self.n_items = n_items
        # E: rows 0 (padding), 1..n (items), n+1 ([MASK]); shared with the output layer (Eq. 7)
        self.item_emb = nn.Embedding(n_items + 2, cfg.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)  # P (N x d), learnable (§3.4)
        self.emb_norm = nn.LayerNorm(cfg.d_model, eps=1e-12) if cfg.embedding_norm else None
        self.dropout = dropout(cfg.dropout, cfg.dropout_impl)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.n_layers))
        # Output (Eq. 7): GELU(h W^P + b^P) E^T + b^O, with a LayerNorm after the GELU (head_norm)
        self.head = nn.Linear(cfg.d_model, cfg.d_model) if cfg.head_transform else None  # W^P
        use_norm = cfg.head_norm and cfg.head_transform
        self.head_norm = nn.LayerNorm(cfg.d_model, eps=1e-12) if use_norm else None
        self.out_bias = nn.Parameter(torch.zeros(n_items))  # b^O over items 1..n
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        std = self.cfg.init_std
        cut = 2 * std if self.cfg.init == "trunc_normal" else std
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.trunc_normal_(module.weight, std=std, a=-cut, b=cut)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()

    @property
    def mask_id(self) -> int:
        """[MASK]'s id: the row after the items' (it moves when items are added)."""
        return self.n_items + 1

    @torch.no_grad()
    def init_output_bias(self, popularity: torch.Tensor) -> None:
        """Set b^O from the training counts of items 1..n (`out_bias_init`); a no-op for
        "zeros". Counts are smoothed by one so that an unseen item gets a finite bias."""
        if self.cfg.out_bias_init == "log_popularity":
            counts = popularity.double() + 1.0
            self.out_bias.copy_(torch.log(counts / counts.sum()).to(self.out_bias.dtype))

    @property
    def max_len(self) -> int:
        """Histories the scorer reads: N - 1 items, the last slot is the appended [MASK]."""
        return self.cfg.max_len - 1

    def forward(
        self,
        input_ids: torch.Tensor,
        last_only: bool = False,
        segments: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, L) left-padded, L <= N -> hidden states (B, L, D); `last_only`: the last
        position's only, (B, 1, D).

        Packed rows (training, `ClozeConfig.pack`): `segments` (B, L) numbers the sequences
        sharing a row (0 = padding) and `position_ids` (B, L) gives each item its position,
        counted from the end of its own sequence; a position attends to every position of its
        own segment and to nothing else."""
        B, L = input_ids.shape
        if position_ids is None:
            if self.cfg.max_len < L:
                raise ValueError(f"input length {L} exceeds max_len {self.cfg.max_len}")
            position_ids = torch.arange(
                self.cfg.max_len - L, self.cfg.max_len, device=input_ids.device
            )
        h = self.item_emb(input_ids)  # (B, L, D)
        if "pe" not in self.cfg.ablate:
            h = h + self.pos_emb(position_ids)
        if self.emb_norm is not None:
            h = self.emb_norm(h)
        h = self.dropout(h)
        if segments is None:
            keep = (input_ids != 0)[:, None, None, :]  # (B, 1, 1, L): attend to real tokens only
        else:
            # (B, 1, L, L): within a segment only; padding (segment 0) attends to padding, which
            # gives it a key (its output is never read)
            keep = (segments[:, :, None] == segments[:, None, :])[:, None]
        for i, layer in enumerate(self.layers):
            h = layer(h, keep, last_only=last_only and i == len(self.layers) - 1)
        return h

    def item_embeddings(self) -> torch.Tensor:
        """(n_items, D): the rows of E for items 1..n."""
        return self.item_emb.weight[1 : self.n_items + 1]

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """GELU(h W^P + b^P) of Eq. 7, LayerNorm-ed as in the original code (`head_norm`):
        (..., D) -> (..., D)."""
        if self.head is None:  # head_transform off: h E^T + b^O
            return hidden
        z = F.gelu(self.head(hidden))
        return z if self.head_norm is None else self.head_norm(z)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(E over items 1..n, b^O): the output layer's (n_items, D) weights and (n_items,) bias,
        shared with the input embedding (Eq. 7)."""
        return self.item_embeddings(), self.out_bias

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., D) -> (..., n_items) scores of items 1..n (Eq. 7 before the softmax)."""
        weight, bias = self.output_weights()
        return self.output_features(hidden) @ weight.T + bias

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """histories (B, L) left-padded -> (B, D): the hidden state of an appended [MASK] (§3.6)."""
        B = histories.shape[0]
        mask = torch.full((B, 1), self.mask_id, dtype=histories.dtype, device=histories.device)
        inputs = torch.cat([last_positions(histories, self.max_len), mask], dim=1)  # (B, L+1)
        return self.forward(inputs, last_only=True)[:, -1]


def _cloze_batches(cfg: RunConfig, ds: PreparedDataset) -> Sampler:
    from seqrec.data.negatives import NegativeSampler

    return ClozeSampler(  # uniform negatives only (popularity needs the next-item task)
        ds.split.training(cfg.train.train_on),
        max_len=cfg.bert4rec.max_len,
        cfg=cfg.cloze,
        batch_size=cfg.train.batch_size,
        seed=cfg.train.seed,
        negatives=NegativeSampler.from_config(cfg.train),
    )


# the registry entry (seqrec.models.registry): the architecture and its Cloze task (§3.6); the
# training recipe is TrainConfig's defaults (§4.3)
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """BERT4Rec's parameters by formula: embeddings, layers (attention, FFN, two LNs), head."""
    c, d = cfg.bert4rec, cfg.bert4rec.d_model
    layer = linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d) + 4 * d
    head = (linear(d, d) + 2 * d * c.head_norm) if c.head_transform else 0
    emb = (n_items + 2) * d + c.max_len * d + 2 * d * c.embedding_norm
    return emb + c.n_layers * layer + head + n_items


ENTRY = ModelEntry(
    name="bert4rec",
    sections={"bert4rec": BERT4RecConfig, "cloze": ClozeConfig},
    build=lambda n_items, n_users, cfg: BERT4Rec(n_items, cfg.bert4rec),
    parameters=_parameters,
    batches=_cloze_batches,
)
