"""Loss formulas: pure tensor functions, selectable by name (`train.loss`). Which positions are
targets and which negatives are drawn is decided in `seqrec.data.batches`; here only the formula.

Every loss sees M target positions: z (M, D) output features, the output layer's weights
(V, D) and bias (V,) or None, targets (M,) in 1..V and, for the sampled losses, negatives
(M, k) in 1..V, none equal to the target or to an item of the sequence.

- `ce`: softmax cross-entropy over the whole catalogue (BERT4Rec Eq. 8; SASRec+, Klenitskiy &
  Vasilev 2023), exact, computed in chunks of rows so the (M, V) logits are never kept;
- `bce`: binary cross-entropy, the target against each of its k negatives (SASRec §III-E, k = 1);
- `sampled_softmax`: softmax over the target and its k negatives, optionally with the logQ
  correction;
- `gbce`: generalised BCE (Petrov & Macdonald, RecSys 2023, "gSASRec"), which undoes the
  overconfidence that negative sampling teaches;
- `bpr` and `top1`: GRU4Rec's pairwise losses (Hidasi et al. 2016, §3.1.2), averaged over the
  k negatives;
- `bpr_max` and `top1_max`: GRU4Rec+'s (Hidasi & Karatzoglou 2018, §3.2), the pairwise terms
  weighted by the softmax of the negatives' scores, so the hardest negatives count most.

The sampled losses sum over the target and its negatives and average over positions, so with
k = 1 `bce` is SASRec's objective divided by the number of target positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from seqrec.data.negatives import SHARED_NEGATIVE_LOSSES

__all__ = [
    "LOSSES",
    "LossSpec",
    "SAMPLED_LOSSES",
    "bce_loss",
    "bpr_loss",
    "bpr_max_loss",
    "full_cross_entropy",
    "gbce_beta",
    "gbce_loss",
    "item_loss",
    "model_loss",
    "sampled_logits",
    "sampled_softmax_loss",
    "sequence_negative_logits",
    "target_logits",
    "top1_loss",
    "top1_max_loss",
]

# Rows of the (M, V) logit matrix handled at once: as many as fit in CE_CHUNK_ELEMENTS floats
# (16 MB), at most CE_CHUNK_ROWS. A chunk of 512 x 3,416 floats (7 MB, ML-1M) stays in cache; the
# whole matrix (~120 MB for a BERT4Rec batch on ML-1M) does not, and every pass over it (bias,
# log-softmax, its backward, the zeroed gradient) then runs at page-fault speed. On Beauty
# (54,542 items) 512 rows are 112 MB a chunk; the 76 rows picked here made the CE's forward and
# backward 1.85x faster (benchmarks/results/performance/ce_chunks.md).
CE_CHUNK_ROWS = 512
CE_CHUNK_ELEMENTS = 1 << 22


# On a GPU the cache argument does not hold and every chunk costs a dozen kernel launches, which
# at ML-1M's size take longer than the arithmetic: chunks of up to CE_CHUNK_ELEMENTS_CUDA floats
# (512 MiB), so a BERT4Rec batch of 1,024 on ML-1M is one chunk, and memory stays bounded for
# any catalogue.
CE_CHUNK_ELEMENTS_CUDA = 1 << 27


def ce_chunk_rows(n_items: int, device: torch.device | str = "cpu") -> int:
    """Rows per chunk of the chunked CE for a catalogue of `n_items` on `device`."""
    if torch.device(device).type == "cuda":
        return max(16, CE_CHUNK_ELEMENTS_CUDA // max(n_items, 1))
    return max(16, min(CE_CHUNK_ROWS, CE_CHUNK_ELEMENTS // max(n_items, 1)))


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy of `z @ W^T (+ b)` without keeping the (M, V) logits: the
    forward pass keeps only each row's log-sum-exp, the backward pass recomputes the logits chunk
    by chunk (one extra matmul) and forms softmax - one_hot in place. `bias` may be None (no
    bias: nothing is added, no gradient formed)."""

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,  # (M, D)
        weight: torch.Tensor,  # (V, D)
        bias: torch.Tensor | None,  # (V,)
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
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        bf16: bool,
    ) -> torch.Tensor:
        M = z.shape[0]
        lse = torch.empty(M, dtype=torch.float32, device=z.device)
        total = torch.zeros((), dtype=torch.float32, device=z.device)
        w = _mm_operand(weight, bf16)  # converted once, not per chunk
        rows = ce_chunk_rows(weight.shape[0], z.device)
        for lo in range(0, M, rows):
            hi = min(lo + rows, M)
            logits = _logits(z[lo:hi], w, bias, bf16)  # (C, V)
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
        db = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=z.device)
        w = _mm_operand(weight, ctx.bf16)
        chunk = ce_chunk_rows(weight.shape[0], z.device)
        for lo in range(0, M, chunk):
            hi = min(lo + chunk, M)
            p = _logits(z[lo:hi], w, bias, ctx.bf16)  # (C, V)
            p.sub_(lse[lo:hi, None]).exp_()  # softmax
            rows = torch.arange(hi - lo, device=z.device)
            p[rows, targets[lo:hi]] -= 1.0  # softmax - one_hot
            p.mul_(scale)
            if db is not None:
                db += p.sum(0)
            p_mm = _mm_operand(p, ctx.bf16)
            dz[lo:hi] = (p_mm @ w).float()
            dw += (p_mm.T @ _mm_operand(z[lo:hi], ctx.bf16)).float()
        db_out = None if db is None or bias is None else db.to(bias.dtype)
        return dz.to(z.dtype), dw.to(weight.dtype), db_out, None, None


def _mm_operand(x: torch.Tensor, bf16: bool) -> torch.Tensor:
    """x as a matmul operand: bfloat16 under `bf16`, else float32."""
    return x.bfloat16() if bf16 else x.float()


def _logits(
    z: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, bf16: bool
) -> torch.Tensor:
    """(C, V) float32 logits of the chunk z (C, D) against w (V, D), already a matmul operand."""
    logits = (_mm_operand(z, bf16) @ w.T).float()
    if bias is not None:
        logits += bias.float()
    return logits


def full_cross_entropy(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """Mean negative log-likelihood of each target under a softmax over the whole catalogue,
    with logits z @ weight^T + bias.

    z (M, D); weight (V, D) and bias (V,) or None over items 1..V; targets (M,) in 1..V.
    `bf16`: the two big matmuls in bfloat16 (the softmax stays in float32).
    """
    if z.shape[0] == 0:
        return z.sum() * 0.0
    out: torch.Tensor = _ChunkedCrossEntropy.apply(z, weight, bias, targets - 1, bf16)
    return out


def reference_cross_entropy(
    z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> torch.Tensor:
    """The textbook formula, F.cross_entropy on materialised logits (tests compare against it)."""
    logits = z.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    return F.cross_entropy(logits, targets - 1)


def sampled_logits(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    negatives: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores of each target (M,) and of its k negatives (M, k), without the (M, V) matrix."""
    neg = torch.einsum("md,mkd->mk", z, weight[negatives - 1])  # (M, k)
    if bias is not None:
        neg = neg + bias[negatives - 1]
    return target_logits(z, weight, bias, targets), neg.float()


def shared_negative_logits(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    negatives: torch.Tensor,
) -> torch.Tensor:
    """Scores of k negatives shared by all M target positions of a batch: z (M, D) against
    negatives (k,) -> (M, k), one matmul. Where a row's own target is among the negatives its
    score is -inf, so it counts as neither a negative nor a second positive (the "accidental
    hits" of a shared sample)."""
    neg = z @ weight[negatives - 1].T  # (M, k)
    if bias is not None:
        neg = neg + bias[negatives - 1]
    return neg.float().masked_fill(targets[:, None] == negatives[None, :], float("-inf"))


def target_logits(
    z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> torch.Tensor:
    """The score of each target (M,): z_m · w_{t_m} (+ b_{t_m})."""
    pos = (z * weight[targets - 1]).sum(-1)
    if bias is not None:
        pos = pos + bias[targets - 1]
    return pos.float()


def bce_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """SASRec §III-E: -log σ(r_pos) - Σ_j log(1 - σ(r_j)), averaged over positions.
    (-log σ(x) = softplus(-x) and -log(1 - σ(x)) = softplus(x), stable for any x.)"""
    return (F.softplus(-pos) + F.softplus(neg).sum(-1)).mean()


def sampled_softmax_loss(
    pos: torch.Tensor, neg: torch.Tensor, log_expected: float | None = None
) -> torch.Tensor:
    """-log softmax of the target among itself and its k negatives, averaged over positions.
    `log_expected`: the logQ correction, log(k q(j)), the log of how often a negative is
    expected to be drawn, subtracted from each negative's score; with it the sampled partition
    function estimates the full one (Bengio & Senécal 2008)."""
    if log_expected is not None:
        neg = neg - log_expected
    logits = torch.cat([pos[:, None], neg], dim=1)  # (M, 1 + k), the target in column 0
    return (torch.logsumexp(logits, dim=1) - pos).mean()


def gbce_beta(n_negatives: int, n_items: int, t: float) -> float:
    """gSASRec's β = α (t (1 - 1/α) + 1/α) with the sampling rate α = k / (|I| - 1)."""
    alpha = n_negatives / (n_items - 1)
    return alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)


def gbce_loss(pos: torch.Tensor, neg: torch.Tensor, beta: float) -> torch.Tensor:
    """gBCE: -log σ(r_pos)^β - Σ_j log(1 - σ(r_j)), averaged over positions. β = 1 is BCE."""
    return (beta * F.softplus(-pos) + F.softplus(neg).sum(-1)).mean()


def bpr_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """GRU4Rec's BPR: -1/k Σ_j log σ(r_i - r_j), averaged over positions."""
    return F.softplus(neg - pos[:, None]).mean()


def top1_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """GRU4Rec's TOP1: 1/k Σ_j σ(r_j - r_i) + σ(r_j²), averaged over positions."""
    return (torch.sigmoid(neg - pos[:, None]) + torch.sigmoid(neg**2)).mean()


def bpr_max_loss(pos: torch.Tensor, neg: torch.Tensor, reg: float) -> torch.Tensor:
    """GRU4Rec+'s BPR-max: -log Σ_j s_j σ(r_i - r_j) + λ Σ_j s_j r_j², s = softmax(r_neg),
    averaged over positions (the log of the weighted sum taken stably, in log space)."""
    log_s = torch.log_softmax(neg, dim=1)
    log_term = torch.logsumexp(log_s + F.logsigmoid(pos[:, None] - neg), dim=1)
    return (-log_term + reg * (log_s.exp() * neg**2).sum(1)).mean()


def top1_max_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """GRU4Rec+'s TOP1-max: Σ_j s_j (σ(r_j - r_i) + σ(r_j²)), s = softmax(r_neg), averaged."""
    s = torch.softmax(neg, dim=1)
    return (s * (torch.sigmoid(neg - pos[:, None]) + torch.sigmoid(neg**2))).sum(1).mean()


def sequence_negative_logits(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    negatives: torch.Tensor,
) -> torch.Tensor:
    """Scores of negatives shared by all positions of a sequence: features (B, L, D) against
    negatives (B, k) -> (B, L, k). One batched matmul instead of gathering (M, k, D) embeddings,
    which at k = 256 is most of a training step on a CPU."""
    neg = torch.einsum("bld,bkd->blk", features, weight[negatives - 1])  # (B, L, k)
    if bias is not None:
        neg = neg + bias[negatives - 1][:, None, :]
    return neg.float()


@dataclass(frozen=True)
class LossSpec:
    """A loss by name with its parameters (from TrainConfig)."""

    name: str = "ce"
    n_items: int = 0  # catalogue size V
    n_negatives: int = 0  # k (sampled losses)
    # "position": k negatives per target position (SASRec §III-E); "sequence": k negatives per
    # sequence shared by its positions (the batch holds (B, k) negatives)
    negatives_per: str = "position"
    gbce_t: float = 0.75  # gSASRec's calibration t
    logq: bool = False  # sampled_softmax: logQ correction
    bf16: bool = False  # ce: the big matmuls in bfloat16
    prior_offset: bool = False  # bce/gbce: add `prior_logit(self)` to every score
    bpreg: float = 1.0  # bpr_max: λ of the score regulariser (GRU4Rec+ code's bpreg)

    @property
    def needs_negatives(self) -> bool:
        return self.name != "ce"


Tensor = torch.Tensor


def prior_logit(spec: LossSpec) -> float:
    """log(β / k): the score at which a positive weighted β and k negatives balance (β = 1 for
    `bce`). Sigmoid losses with many negatives start far from it (σ = 0.5 for every score), and
    the first updates then push all scores down by a large constant vector that the model builds
    into its hidden states, which can drown the history's signal (docs/design/sasrec.md). Adding
    this constant to every score starts training at the balance instead; a constant shift leaves the
    ranking of the items unchanged. It is 0 for the paper's BCE with one negative."""
    beta = gbce_beta(spec.n_negatives, spec.n_items, spec.gbce_t) if spec.name == "gbce" else 1.0
    return math.log(beta / spec.n_negatives)


def _offset(spec: LossSpec, pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
    if not spec.prior_offset:
        return pos, neg
    c = prior_logit(spec)
    return pos + c, neg + c


def _bce(spec: LossSpec, pos: Tensor, neg: Tensor) -> Tensor:
    return bce_loss(*_offset(spec, pos, neg))


def _sampled_softmax(spec: LossSpec, pos: Tensor, neg: Tensor) -> Tensor:
    # negatives are drawn uniformly, so k q(j) = k / V for every item
    log_expected = math.log(spec.n_negatives / spec.n_items) if spec.logq else None
    return sampled_softmax_loss(pos, neg, log_expected)


def _gbce(spec: LossSpec, pos: Tensor, neg: Tensor) -> Tensor:
    beta = gbce_beta(spec.n_negatives, spec.n_items, spec.gbce_t)
    return gbce_loss(*_offset(spec, pos, neg), beta)


# sampled loss name -> formula over (target scores (M,), negative scores (M, k))
SAMPLED_LOSSES: dict[str, Callable[[LossSpec, Tensor, Tensor], Tensor]] = {
    "bce": _bce,
    "sampled_softmax": _sampled_softmax,
    "gbce": _gbce,
    "bpr": lambda spec, pos, neg: bpr_loss(pos, neg),
    "top1": lambda spec, pos, neg: top1_loss(pos, neg),
    "bpr_max": lambda spec, pos, neg: bpr_max_loss(pos, neg, spec.bpreg),
    "top1_max": lambda spec, pos, neg: top1_max_loss(pos, neg),
}
LOSSES = ("ce", *SAMPLED_LOSSES)  # every name `train.loss` accepts


def item_loss(
    spec: LossSpec,
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss `spec.name` at M target positions with per-position negatives (M, k)."""
    if spec.name == "ce":
        return full_cross_entropy(z, weight, bias, targets, bf16=spec.bf16)
    if spec.name not in SAMPLED_LOSSES:
        raise ValueError(f"loss {spec.name!r} is unknown; expected one of {', '.join(LOSSES)}")
    if negatives is None or negatives.shape[-1] == 0:
        raise ValueError(f"loss {spec.name!r} needs negatives (train.n_negatives >= 1)")
    if z.shape[0] == 0:
        return z.sum() * 0.0
    return SAMPLED_LOSSES[spec.name](spec, *sampled_logits(z, weight, bias, targets, negatives))


class ItemModel(Protocol):
    # (B, L) -> (B, L, D); keyword inputs: a packed layout (Batch.model_inputs)
    def __call__(self, input_ids: torch.Tensor, **layout: torch.Tensor) -> torch.Tensor: ...

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor: ...  # (..., D) -> (..., D)

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]: ...  # (V, D), (V,)

    def pair_logits(self, features: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...

    def sequence_logits(  # (B, L, D), (B, k), (B, L) bool -> (M, k)
        self, features: torch.Tensor, items: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor: ...


def _at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (B, L, ...) at `positions`: a (B, L) bool mask or (M,) flat indices -> (M, ...)."""
    if positions.dtype == torch.bool:
        return x[positions]
    return x.flatten(0, 1).index_select(0, positions)


def model_loss(
    model: ItemModel,
    spec: LossSpec,
    inputs: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    negatives: torch.Tensor | None = None,
    layout: dict[str, torch.Tensor] | None = None,
    *,
    forward: Any = None,
) -> torch.Tensor:
    """Run the model on `inputs` (B, L) and compute the loss at the `positions` (B, L) bool
    only (BERT4Rec: the masked items, Eq. 8; SASRec: every non-padding position, §III-E), or at
    their (M,) int64 flat indices into the B * L positions in row-major order (`Batch.index`:
    the same positions, gathered without the device synchronisation a boolean mask costs). The
    hidden states there are gathered *before* the output layer, so the output layer runs for
    the M target positions only (except with per-sequence negatives, scored at every position
    by one batched matmul). `layout`: a packed batch's segments and positions, given to the
    model. `forward`: what runs the model forward, if not the model itself (a distributed run's
    DistributedDataParallel wrapper, whose forward synchronises the gradients)."""
    hidden = (forward or model)(inputs, **(layout or {}))  # (B, L, D)
    if not getattr(model, "dot_product_output", True):  # NCF, MoL: scores of (user, item) pairs
        per = spec.negatives_per
        if spec.name not in SAMPLED_LOSSES or per == "batch" or negatives is None:
            raise ValueError(
                f"loss {spec.name!r}: this model scores (user, item) pairs, so it trains with a "
                "sampled loss and negatives per position or per sequence"
            )
        if per == "sequence":  # (B, k), a row's for all its positions: scored once per row
            features = model.output_features(hidden)  # (B, L, D)
            if positions.dtype != torch.bool:  # flat indices -> the (B, L) mask
                mask = torch.zeros(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
                positions = mask.flatten().index_fill(0, positions, True).view_as(mask)
            neg = model.sequence_logits(features, negatives, positions).float()  # (M, k)
            pos = model.pair_logits(_at(features, positions), targets[:, None])[:, 0].float()
            return SAMPLED_LOSSES[spec.name](spec, pos, neg)
        z = model.output_features(_at(hidden, positions))  # (M, D)
        logits = model.pair_logits(z, torch.cat([targets[:, None], negatives], dim=1)).float()
        return SAMPLED_LOSSES[spec.name](spec, logits[:, 0], logits[:, 1:])
    weight, bias = model.output_weights()
    if spec.name != "ce" and spec.negatives_per == "sequence":
        if negatives is None or spec.name not in SAMPLED_LOSSES:
            raise ValueError(f"loss {spec.name!r} with per-sequence negatives needs negatives")
        features = model.output_features(hidden)  # (B, L, D)
        neg = _at(sequence_negative_logits(features, weight, bias, negatives), positions)
        pos = target_logits(_at(features, positions), weight, bias, targets)  # (M,)
        return SAMPLED_LOSSES[spec.name](spec, pos, neg)
    z = model.output_features(_at(hidden, positions))  # (M, D)
    if spec.name != "ce" and spec.negatives_per == "batch":
        if negatives is None or spec.name not in SHARED_NEGATIVE_LOSSES:
            raise ValueError(
                f"loss {spec.name!r} with per-batch negatives: expected one of "
                f"{', '.join(SHARED_NEGATIVE_LOSSES)}, with negatives"
            )
        neg = shared_negative_logits(z, weight, bias, targets, negatives)
        return SAMPLED_LOSSES[spec.name](spec, target_logits(z, weight, bias, targets), neg)
    return item_loss(spec, z, weight, bias, targets, negatives)
