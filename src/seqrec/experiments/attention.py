"""Attention heat-maps (BERT4Rec §4.6, Figure 2): the attention weights among the last positions
of users' inputs, averaged over users, per layer and head, from a BERT4Rec or SASRec run.

The input of a user is what the model sees at test time: the history before the test item, with
an appended [MASK] for BERT4Rec (so its last position is the [MASK]). Only users whose input
fills the last `last` positions are averaged. A cell (i, j) is the weight query position i gives
key position j; a row's remainder goes to earlier positions, outside the map.

The weights are recomputed from each attention layer's own inputs (captured by forward hooks) as
softmax(q kᵀ / √d_h) under the layer's mask, so the fused attention kernel the models use stays
untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from seqrec.errors import ConfigError
from seqrec.models.bert4rec import BERT4Rec, SelfAttention
from seqrec.models.sasrec import CausalSelfAttention, SASRec

__all__ = ["AttentionMaps", "attention_maps", "plot_attention"]


@dataclass(frozen=True)
class AttentionMaps:
    weights: np.ndarray  # (layers, heads, last, last): query position x key position, averaged
    users: int  # how many users' inputs were averaged
    mask_last: bool  # the last position is an appended [MASK] (BERT4Rec)

    def to_json(self) -> dict[str, Any]:
        return {
            "users": self.users,
            "mask_last": self.mask_last,
            "last": int(self.weights.shape[-1]),
            "weights": np.round(self.weights, 6).tolist(),
        }


def _weights(module: nn.Module, args: tuple[Any, ...]) -> torch.Tensor:
    """(B, h, Lq, L) attention weights of one layer call, from its inputs."""
    if isinstance(module, SelfAttention):
        x, keep = args[0], args[1]
        B, L, D = x.shape
        h = module.n_heads
        q, k, _ = module.qkv(x).view(B, L, 3, h, D // h).unbind(2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    elif isinstance(module, CausalSelfAttention):
        queries, keys, keep = args[0], args[1], args[2]
        B, Lq, D = queries.shape
        L, h = keys.shape[1], module.n_heads
        q = module.q(queries).view(B, Lq, h, D // h).transpose(1, 2)
        k = module.kv(keys).view(B, L, 2, h, D // h)[:, :, 0].transpose(1, 2)
    else:  # pragma: no cover - only the two attention modules are hooked
        raise TypeError(type(module).__name__)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked (padding) row: 0


@contextmanager
def _captured(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect every attention layer's weights (in layer order) while the block runs."""
    found: list[torch.Tensor] = []
    handles = [
        m.register_forward_hook(lambda mod, args, _out: found.append(_weights(mod, args)))
        for m in model.modules()
        if isinstance(m, SelfAttention | CausalSelfAttention)
    ]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def attention_maps(
    model: nn.Module, histories: torch.Tensor, last: int = 10, batch_size: int = 256
) -> AttentionMaps:
    """histories (B, L) left-padded item ids (0 = padding), most recent last: the average
    attention among the last `last` positions of each input that fills them."""
    if not isinstance(model, BERT4Rec | SASRec):
        raise ConfigError(
            f"attention maps need a BERT4Rec or SASRec model, not {type(model).__name__} "
            "(it has no attention)"
        )
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    bert = isinstance(model, BERT4Rec)
    model.eval()
    total: torch.Tensor | None = None
    users = 0
    for start in range(0, histories.shape[0], batch_size):
        h = histories[start : start + batch_size]
        if bert:
            mask_id = int(model.mask_id)  # type: ignore[arg-type]  # an int attribute
            mask = torch.full((h.shape[0], 1), mask_id, dtype=h.dtype, device=h.device)
            inputs = torch.cat([h[:, -(model.max_len) :], mask], dim=1)
        else:
            inputs = h[:, -model.max_len :]
        full = (inputs[:, -last:] != 0).all(dim=1) if inputs.shape[1] >= last else None
        if full is None or not bool(full.any()):
            continue
        inputs = inputs[full]
        with _captured(model) as found:
            model(inputs)
        per_layer = torch.stack([w[:, :, -last:, -last:] for w in found], dim=1)  # B,l,h,n,n
        batch_sum = per_layer.sum(dim=0)
        total = batch_sum if total is None else total + batch_sum
        users += int(inputs.shape[0])
    if total is None:
        raise ValueError(f"no input fills the last {last} positions; use a smaller --last")
    return AttentionMaps((total / users).cpu().numpy(), users, mask_last=bert)


def plot_attention(maps: AttentionMaps, path: str, title: str = "") -> None:
    """One heat-map per layer (rows) and head (columns), positions 1..last, the [MASK] marked."""
    from seqrec.experiments.plots import pyplot

    plt = pyplot()
    layers, heads, n, _ = maps.weights.shape
    labels = [str(i + 1) for i in range(n)]
    if maps.mask_last:
        labels[-1] = "[mask]"
    fig, axes = plt.subplots(
        layers, heads, figsize=(3.2 * heads + 0.8, 3.0 * layers), squeeze=False
    )
    vmax = float(maps.weights.max()) or 1.0
    for li in range(layers):
        for hi in range(heads):
            ax = axes[li][hi]
            image = ax.imshow(maps.weights[li, hi], cmap="viridis", vmin=0.0, vmax=vmax)
            ax.set_title(f"layer {li + 1}, head {hi + 1}", fontsize=9)
            ax.set_xticks(range(n), labels, fontsize=7, rotation=90)
            ax.set_yticks(range(n), labels, fontsize=7)
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query position", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.suptitle(title or f"average attention over {maps.users:,} users", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
