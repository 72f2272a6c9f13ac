"""Loss formulas: pure tensor functions. Which positions are targets is decided in
`seqrec.data.batches`; here only the formula."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

__all__ = ["cloze_loss", "full_cross_entropy"]

# Rows of the (M, V) logit matrix handled at once. A chunk of 512 x 3,416 floats (7 MB) stays in
# cache; the whole matrix (~120 MB for a BERT4Rec batch on ML-1M) does not, and every pass over it
# (bias, log-softmax, its backward, the zeroed gradient) then runs at page-fault speed.
CE_CHUNK_ROWS = 512


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy of `z @ W^T + b` without keeping the (M, V) logits: the forward
    pass keeps only each row's log-sum-exp, the backward pass recomputes the logits chunk by chunk
    (one extra matmul) and forms softmax - one_hot in place."""

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,  # (M, D)
        weight: torch.Tensor,  # (V, D)
        bias: torch.Tensor,  # (V,)
        targets: torch.Tensor,  # (M,) in 0..V-1
        bf16: bool,
    ) -> torch.Tensor:
        with torch.autocast(z.device.type, enabled=False):
            return _ChunkedCrossEntropy._forward(ctx, z, weight, bias, targets, bf16)

    @staticmethod
    def _forward(
        ctx: Any,
        z: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        targets: torch.Tensor,
        bf16: bool,
    ) -> torch.Tensor:
        M = z.shape[0]
        lse = torch.empty(M, dtype=torch.float32, device=z.device)
        total = torch.zeros((), dtype=torch.float32, device=z.device)
        for lo in range(0, M, CE_CHUNK_ROWS):
            hi = min(lo + CE_CHUNK_ROWS, M)
            logits = _logits(z[lo:hi], weight, bias, bf16)  # (C, V)
            lse[lo:hi] = torch.logsumexp(logits, dim=1)
            total += (lse[lo:hi] - logits.gather(1, targets[lo:hi, None])[:, 0]).sum()
        ctx.save_for_backward(z, weight, bias, targets, lse)
        ctx.bf16 = bf16
        return total / max(M, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        with torch.autocast(grad.device.type, enabled=False):
            return _ChunkedCrossEntropy._backward(ctx, grad)

    @staticmethod
    def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        z, weight, bias, targets, lse = ctx.saved_tensors
        M = z.shape[0]
        scale = grad / max(M, 1)
        dz = torch.empty(z.shape, dtype=torch.float32, device=z.device)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=z.device)
        db = torch.zeros(bias.shape, dtype=torch.float32, device=z.device)
        for lo in range(0, M, CE_CHUNK_ROWS):
            hi = min(lo + CE_CHUNK_ROWS, M)
            p = _logits(z[lo:hi], weight, bias, ctx.bf16)  # (C, V)
            p.sub_(lse[lo:hi, None]).exp_()  # softmax
            rows = torch.arange(hi - lo, device=z.device)
            p[rows, targets[lo:hi]] -= 1.0  # softmax - one_hot
            p.mul_(scale)
            db += p.sum(0)
            mm_dtype = torch.bfloat16 if ctx.bf16 else torch.float32
            p_mm = p.to(mm_dtype)
            dz[lo:hi] = (p_mm @ weight.to(mm_dtype)).float()
            dw += (p_mm.T @ z[lo:hi].to(mm_dtype)).float()
        return dz.to(z.dtype), dw.to(weight.dtype), db.to(bias.dtype), None, None


def _logits(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, bf16: bool) -> torch.Tensor:
    if bf16:
        return (z.bfloat16() @ weight.bfloat16().T).float() + bias.float()
    return torch.addmm(bias.float(), z.float(), weight.float().T)


def full_cross_entropy(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """Mean negative log-likelihood of each target under a softmax over the whole catalogue,
    with logits z @ weight^T + bias.

    z (M, D); weight (V, D) and bias (V,) over items 1..V; targets (M,) item ids in 1..V.
    `bf16`: the two big matmuls in bfloat16 (the softmax stays in float32).
    """
    if z.shape[0] == 0:
        return z.sum() * 0.0
    out: torch.Tensor = _ChunkedCrossEntropy.apply(z, weight, bias, targets - 1, bf16)
    return out


def reference_cross_entropy(
    z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The textbook formula, F.cross_entropy on materialised logits (tests compare against it)."""
    return F.cross_entropy(z.float() @ weight.float().T + bias.float(), targets - 1)


class MaskedItemModel(Protocol):
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor: ...  # (B, L) -> (B, L, D)

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor: ...  # (M, D) -> (M, D)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]: ...  # (V, D), (V,)


def cloze_loss(
    model: MaskedItemModel,
    inputs: torch.Tensor,
    masked: torch.Tensor,
    targets: torch.Tensor,
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """BERT4Rec's Eq. 8: the mean NLL of the masked items. The hidden states of the masked
    positions are gathered *before* the output layer, so logits are computed for the M masked
    positions only, not for every position."""
    hidden = model(inputs)  # (B, L, D)
    z = model.output_features(hidden[masked])  # (M, D)
    weight, bias = model.output_weights()
    return full_cross_entropy(z, weight, bias, targets, bf16=bf16)
