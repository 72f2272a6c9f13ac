"""GRU4Rec (Hidasi et al., ICLR 2016) and GRU4Rec+ (Hidasi & Karatzoglou, CIKM 2018): a GRU over
the item sequence, the hidden state after each item scoring the next one.

Ids: 0 = padding, 1..n_items = items. Inputs are left-padded (most recent item last), as for
every seqrec model; the GRU reads each row's items only (packed sequences), so padding never
enters its state and the output at position t depends on the items up to t only.

The model is architecture only. Its training task is SASRec's shifted next-item task
(`NextItemSampler`): every position of a user's sequence predicts the next item, with the
losses of `seqrec.training.losses` (GRU4Rec: "bpr" / "top1" with sampled negatives; GRU4Rec+:
"bpr_max" / "top1_max" with many). DEVIATION: the papers train on session-parallel mini-batches
(one step of many sessions at a time, the hidden state carried between batches, negatives the
other sessions' targets); here each batch holds whole sequences, back-propagated through, and the
negatives are drawn uniformly from the items not in the sequence. The objective per position is
the same loss; what differs is the gradient's truncation and the negative distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqrec.data.batches import NextItemConfig
from seqrec.models.base import (
    BASELINE_TRAIN,
    ModelEntry,
    SequenceModel,
    last_positions,
    whole_row_batches,
    whole_rows_only,
)

__all__ = ["ENTRY", "GRU4Rec", "GRU4RecConfig"]

if TYPE_CHECKING:
    from seqrec.config import RunConfig


@dataclass(frozen=True)
class GRU4RecConfig:
    """Sizes (GRU4Rec §4; the BERT4Rec paper's grid for its baselines: d in 16..256)."""

    max_len: int = 200  # history items read, in training windows and when scoring
    d_model: int = 64  # item embedding size (GRU4Rec+'s embedding input; 2016: one-hot)
    hidden: int = 100  # GRU units (GRU4Rec §4: 100)
    n_layers: int = 1
    dropout: float = 0.0  # on the GRU's output (GRU4Rec+'s dropout_p_hidden)
    init_std: float = 0.02


class GRU4Rec(SequenceModel):
    onnx_export = False  # torch 2.13's exporter fails to decompose nn.GRU; TorchScript works
    # the input and output tables are of different widths: a tower each, over the same features
    item_tables = ("item_emb", "out_emb")
    item_biases = (("out_bias", 0),)

    def __init__(self, n_items: int, cfg: GRU4RecConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GRU4RecConfig()
        self.n_items = n_items
        self.item_emb = nn.Embedding(n_items + 1, cfg.d_model, padding_idx=0)
        self.gru = nn.GRU(cfg.d_model, cfg.hidden, cfg.n_layers, batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        # the output layer: one vector and one bias per item, in the GRU's space
        self.out_emb = nn.Embedding(n_items + 1, cfg.hidden, padding_idx=0)
        self.out_bias = nn.Parameter(torch.zeros(n_items))
        for emb in (self.item_emb, self.out_emb):
            nn.init.normal_(emb.weight, std=cfg.init_std)
            with torch.no_grad():
                emb.weight[0].zero_()

    @property
    def max_len(self) -> int:
        return self.cfg.max_len

    def forward(self, input_ids: torch.Tensor, **layout: torch.Tensor) -> torch.Tensor:
        """input_ids (B, L) left-padded -> hidden states (B, L, H); padding positions get 0."""
        whole_rows_only("GRU4Rec", layout)
        B, L = input_ids.shape
        lengths = (input_ids != 0).sum(1)
        # left-aligned copy: row b's items first (a rotation by L - length), then padding
        shift = (L - lengths)[:, None]
        cols = torch.arange(L, device=input_ids.device)[None, :]
        left = input_ids.gather(1, (cols + shift) % L)
        if self.training:  # packed: the GRU skips each row's padding (less work, same outputs)
            packed = pack_padded_sequence(
                self.item_emb(left),
                lengths.clamp(min=1).cpu(),
                batch_first=True,
                enforce_sorted=False,
            )
            out, _ = self.gru(packed)
            h, _ = pad_packed_sequence(out, batch_first=True, total_length=L)  # (B, L, H)
        else:  # the padding comes after each row's items, so it cannot reach their states;
            h, _ = self.gru(self.item_emb(left))  # plain tensors also export to ONNX
        h = h.gather(1, ((cols - shift) % L)[..., None].expand(B, L, h.shape[-1]))  # back right
        return self.dropout(h * (input_ids != 0)[..., None])

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out_emb.weight[1:], self.out_bias

    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The GRU's state after the last item of each history, (B, H)."""
        return self.forward(last_positions(histories, self.max_len))[:, -1]


# the registry entry: GRU4Rec+'s recipe where it differs from TrainConfig's (BERT4Rec's): Adagrad
# in the papers, Adam here (seqrec's one optimiser), lr 1e-3, no weight decay, BPR-max with 64
# sampled negatives (GRU4Rec+ §4: BPR-max with additional negative samples)
def _parameters(n_items: int, n_users: int, cfg: RunConfig) -> int:
    """GRU4Rec's parameters by formula: embedding, the GRU's layers, output vectors and bias."""
    c = cfg.gru4rec
    h = c.hidden
    gru = sum(3 * h * ((c.d_model if i == 0 else h) + h) + 6 * h for i in range(c.n_layers))
    return (n_items + 1) * c.d_model + gru + (n_items + 1) * h + n_items


ENTRY = ModelEntry(
    name="gru4rec",
    sections={"gru4rec": GRU4RecConfig, "next_item": NextItemConfig},
    build=lambda n_items, n_users, cfg: GRU4Rec(n_items, cfg.gru4rec),
    parameters=_parameters,
    batches=whole_row_batches("gru4rec", "gru4rec"),
    whole_rows=True,
    train_defaults={
        **BASELINE_TRAIN,
        "loss": "bpr_max",
        "n_negatives": 64,
    },
)
