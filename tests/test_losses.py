"""Loss formulas against the textbook computation and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from seqrec.training import losses
from seqrec.training.losses import (
    LossSpec,
    bce_loss,
    full_cross_entropy,
    gbce_beta,
    gbce_loss,
    item_loss,
    model_loss,
    reference_cross_entropy,
    sampled_softmax_loss,
)


def test_cross_entropy_hand_computed() -> None:
    # two items, logits (0, ln 3): p(item 2) = 3/4, p(item 1) = 1/4
    z = torch.tensor([[1.0]])
    w = torch.tensor([[0.0], [math.log(3.0)]])
    b = torch.zeros(2)
    assert float(full_cross_entropy(z, w, b, torch.tensor([2]))) == pytest.approx(-math.log(0.75))
    assert float(full_cross_entropy(z, w, b, torch.tensor([1]))) == pytest.approx(-math.log(0.25))


@pytest.mark.parametrize("rows", [1, 511, 512, 1300])  # around and across the chunk size
def test_chunked_cross_entropy_matches_the_reference(rows: int) -> None:
    assert losses.CE_CHUNK_ROWS == 512
    g = torch.Generator().manual_seed(rows)
    z = torch.randn(rows, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True)
    t = torch.randint(1, 51, (rows,), generator=g)
    ours = full_cross_entropy(z, w, b, t)
    ref = reference_cross_entropy(z, w, b, t)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    for a, r in zip(
        torch.autograd.grad(ours, (z, w, b)), torch.autograd.grad(ref, (z, w, b)), strict=True
    ):
        assert torch.allclose(a, r, atol=1e-6)
    bf16 = full_cross_entropy(z, w, b, t, bf16=True)
    assert float(bf16.detach()) == pytest.approx(float(ref.detach()), rel=2e-2)


def test_chunk_rows_shrink_with_the_catalogue() -> None:
    # ML-1M: the full 512 rows (7 MB); Beauty: 4,194,304 // 54,542 = 76 rows (16 MB, not 112 MB)
    assert losses.ce_chunk_rows(3416) == 512
    assert losses.ce_chunk_rows(54542) == 76
    assert losses.ce_chunk_rows(10_000_000) == 16  # a floor: never a one-row matmul
    # on a GPU up to 2**27 floats a chunk: 39,290 rows of ML-1M's items, one chunk a batch
    assert losses.ce_chunk_rows(3416, "cuda") == 2**27 // 3416 == 39290
    assert losses.ce_chunk_rows(1_000_000, torch.device("cuda", 0)) == 134
    assert losses.ce_chunk_rows(10**9, "cuda") == 16


def test_chunked_cross_entropy_with_small_chunks_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 4,096 elements / 200 items = 20 rows a chunk: 45 rows cross two chunk boundaries
    monkeypatch.setattr(losses, "CE_CHUNK_ELEMENTS", 4096)
    assert losses.ce_chunk_rows(200) == 20
    g = torch.Generator().manual_seed(5)
    z = torch.randn(45, 8, generator=g, requires_grad=True)
    w = torch.randn(200, 8, generator=g, requires_grad=True)
    b = torch.randn(200, generator=g, requires_grad=True)
    t = torch.randint(1, 201, (45,), generator=g)
    ours, ref = full_cross_entropy(z, w, b, t), reference_cross_entropy(z, w, b, t)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    for a, r in zip(
        torch.autograd.grad(ours, (z, w, b)), torch.autograd.grad(ref, (z, w, b)), strict=True
    ):
        assert torch.allclose(a, r, atol=1e-6)


def test_chunked_cross_entropy_without_bias_matches_the_reference() -> None:
    # SASRec's output layer has no bias: nothing is added and no bias gradient is formed
    g = torch.Generator().manual_seed(3)
    z = torch.randn(700, 8, generator=g, requires_grad=True)
    w = torch.randn(40, 8, generator=g, requires_grad=True)
    t = torch.randint(1, 41, (700,), generator=g)
    ref = reference_cross_entropy(z, w, None, t)
    ref_grads = torch.autograd.grad(ref, (z, w))
    for bf16, tol in ((False, 1e-6), (True, 2e-2)):
        ours = full_cross_entropy(z, w, None, t, bf16=bf16)
        assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=tol)
        for a, r in zip(torch.autograd.grad(ours, (z, w)), ref_grads, strict=True):
            # bf16 operands: errors within a few percent of the gradient's scale
            assert float((a - r).abs().max()) <= (0.05 if bf16 else 1e-5) * float(r.abs().max())


class _Probe(torch.nn.Module):
    """A stand-in model whose hidden states are a leaf tensor, to see which positions the loss
    reaches."""

    def __init__(self, hidden: torch.Tensor, n_items: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w = torch.nn.Parameter(torch.randn(n_items, hidden.shape[-1]))
        self.b = torch.nn.Parameter(torch.zeros(n_items))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hidden

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w, self.b


@pytest.mark.parametrize("name", ["ce", "bce", "gbce"])
def test_the_loss_sees_only_its_positions(name: str) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    masked = torch.tensor([[0, 1, 0, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.bool)
    inputs = torch.ones(2, 5, dtype=torch.long)
    spec = LossSpec(name=name, n_items=7, n_negatives=2)
    negatives = torch.tensor([[1, 2], [5, 6], [1, 1]])
    probe = _Probe(hidden, 7)
    loss = model_loss(probe, spec, inputs, masked, torch.tensor([3, 4, 7]), negatives)
    (grad,) = torch.autograd.grad(loss, hidden)
    touched = grad.abs().sum(-1) > 0
    assert torch.equal(touched, masked)
    # the same positions as flat indices (what a training step gives, Batch.index): 1, 4 and
    # 5 + 3 = 8 of the 2 x 5 positions; the same loss and gradient
    index = torch.tensor([1, 4, 8])
    again = model_loss(probe, spec, inputs, index, torch.tensor([3, 4, 7]), negatives)
    assert float(again.detach()) == float(loss.detach())
    assert torch.equal(torch.autograd.grad(again, hidden)[0], grad)


# ------------------------------------------------------------- the sampled losses, naively


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_bce_hand_computed() -> None:
    # SASRec §III-E at two positions: -log σ(r+) - Σ log(1 - σ(r-)), averaged over positions
    pos = torch.tensor([2.0, -1.0])
    neg = torch.tensor([[0.5, -3.0], [1.0, 0.0]])
    naive = [
        -math.log(_sigmoid(2.0)) - math.log(1 - _sigmoid(0.5)) - math.log(1 - _sigmoid(-3.0)),
        -math.log(_sigmoid(-1.0)) - math.log(1 - _sigmoid(1.0)) - math.log(1 - _sigmoid(0.0)),
    ]
    assert float(bce_loss(pos, neg)) == pytest.approx(sum(naive) / 2, rel=1e-6)
    # stable far in the tails, where log(sigmoid) in floating point would give inf
    assert math.isfinite(float(bce_loss(torch.tensor([-200.0]), torch.tensor([[200.0]]))))


def test_sampled_softmax_hand_computed_and_logq() -> None:
    pos = torch.tensor([1.0])
    neg = torch.tensor([[0.0, 2.0]])
    naive = -math.log(math.e / (math.e + 1 + math.e**2))
    assert float(sampled_softmax_loss(pos, neg)) == pytest.approx(naive, rel=1e-6)
    # logQ: k = 2 uniform negatives of V = 20 items, log(k q) = log(0.1): each negative counts
    # as V / k = 10 items of the full softmax
    corrected = -math.log(math.e / (math.e + 10 * (1 + math.e**2)))
    got = sampled_softmax_loss(pos, neg, math.log(2 / 20))
    assert float(got) == pytest.approx(corrected, rel=1e-6)


def test_gbce_hand_computed() -> None:
    # α = k / (|I| - 1) = 4 / 100; β = α (t (1 - 1/α) + 1/α); t = 0 is BCE, t = 1 gives β = α
    assert gbce_beta(4, 101, 0.0) == pytest.approx(1.0)
    assert gbce_beta(4, 101, 1.0) == pytest.approx(0.04)
    beta = gbce_beta(4, 101, 0.75)
    assert beta == pytest.approx(0.04 * (0.75 * (1 - 25) + 25))  # 0.28
    pos, neg = torch.tensor([0.3]), torch.tensor([[-1.0, 0.5, 0.0, 2.0]])
    naive = -math.log(_sigmoid(0.3) ** beta) - sum(
        math.log(1 - _sigmoid(x)) for x in (-1.0, 0.5, 0.0, 2.0)
    )
    assert float(gbce_loss(pos, neg, beta)) == pytest.approx(naive, rel=1e-6)
    assert float(gbce_loss(pos, neg, 1.0)) == pytest.approx(float(bce_loss(pos, neg)))


def test_prior_offset_shifts_every_score_by_log_beta_over_k() -> None:
    # bce with k = 1 (the paper): log(1 / 1) = 0, the option changes nothing
    assert losses.prior_logit(LossSpec("bce", n_items=101, n_negatives=1)) == 0.0
    assert losses.prior_logit(LossSpec("bce", n_items=101, n_negatives=4)) == pytest.approx(
        math.log(1 / 4)
    )
    gbce = LossSpec("gbce", n_items=101, n_negatives=4, gbce_t=0.75, prior_offset=True)
    c = losses.prior_logit(gbce)
    assert c == pytest.approx(math.log(0.28 / 4))  # β = 0.28 (above)
    pos, neg = torch.tensor([0.3, -0.2]), torch.tensor([[-1.0, 0.5, 0.0, 2.0], [1, 1, 0, -2.0]])
    want = gbce_loss(pos + c, neg + c, 0.28)
    assert float(losses.SAMPLED_LOSSES["gbce"](gbce, pos, neg)) == pytest.approx(float(want))
    # at the balance point the mean gradient of a common shift vanishes: β (1 - σ(c)) = k σ(c)
    shift = torch.zeros((), requires_grad=True)
    losses.SAMPLED_LOSSES["gbce"](
        gbce, torch.zeros(1) + shift, torch.zeros(1, 4) + shift
    ).backward()
    assert shift.grad is not None and abs(float(shift.grad)) < 1e-6
    bce = LossSpec("bce", n_items=101, n_negatives=4, prior_offset=True)
    got = losses.SAMPLED_LOSSES["bce"](bce, pos, neg)
    assert float(got) == pytest.approx(float(bce_loss(pos + math.log(0.25), neg + math.log(0.25))))


def test_item_loss_scores_against_the_embedding_naively() -> None:
    g = torch.Generator().manual_seed(0)
    z, w = torch.randn(3, 4, generator=g), torch.randn(6, 4, generator=g)
    targets, negatives = torch.tensor([1, 4, 6]), torch.tensor([[2, 3], [5, 1], [2, 2]])
    spec = LossSpec(name="bce", n_items=6, n_negatives=2)
    pos = torch.stack([z[m] @ w[targets[m] - 1] for m in range(3)])
    neg = torch.stack([torch.stack([z[m] @ w[j - 1] for j in negatives[m]]) for m in range(3)])
    want = bce_loss(pos, neg)
    assert float(item_loss(spec, z, w, None, targets, negatives)) == pytest.approx(float(want))
    assert float(item_loss(LossSpec("ce", 6), z, w, None, targets)) == pytest.approx(
        float(reference_cross_entropy(z, w, None, targets)), rel=1e-6
    )
    with pytest.raises(ValueError, match="needs negatives"):
        item_loss(spec, z, w, None, targets, None)


@pytest.mark.parametrize("name", ["bce", "sampled_softmax", "gbce"])
def test_per_sequence_negatives_equal_the_same_negatives_per_position(name: str) -> None:
    torch.manual_seed(1)
    hidden = torch.randn(2, 4, 3, requires_grad=True)
    positions = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    targets = torch.tensor([1, 2, 3, 4, 5])
    per_seq = torch.tensor([[6, 7], [8, 6]])
    rows = torch.nonzero(positions)[:, 0]
    probe = _Probe(hidden, 9)
    inputs = torch.ones(2, 4, dtype=torch.long)
    seq_spec = LossSpec(name, n_items=9, n_negatives=2, negatives_per="sequence", logq=True)
    pos_spec = LossSpec(name, n_items=9, n_negatives=2, negatives_per="position", logq=True)
    a = model_loss(probe, seq_spec, inputs, positions, targets, per_seq)
    b = model_loss(probe, pos_spec, inputs, positions, targets, per_seq[rows])
    assert float(a.detach()) == pytest.approx(float(b.detach()), rel=1e-6)
    flat = torch.tensor([1, 2, 3, 6, 7])  # the same positions as flat indices into 2 x 4
    c = model_loss(probe, seq_spec, inputs, flat, targets, per_seq)
    assert float(c.detach()) == float(a.detach())


@pytest.mark.parametrize("name", ["bce", "sampled_softmax", "gbce"])
def test_per_batch_negatives_equal_the_same_negatives_per_position(name: str) -> None:
    # no target among the shared negatives: the loss is that of every position drawing them
    torch.manual_seed(2)
    hidden = torch.randn(2, 4, 3, requires_grad=True)
    positions = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    targets = torch.tensor([1, 2, 3, 4, 5])
    shared = torch.tensor([6, 9, 7])
    probe = _Probe(hidden, 9)
    inputs = torch.ones(2, 4, dtype=torch.long)
    batch_spec = LossSpec(name, n_items=9, n_negatives=3, negatives_per="batch", logq=True)
    pos_spec = LossSpec(name, n_items=9, n_negatives=3, negatives_per="position", logq=True)
    a = model_loss(probe, batch_spec, inputs, positions, targets, shared)
    b = model_loss(probe, pos_spec, inputs, positions, targets, shared.expand(5, 3))
    assert float(a.detach()) == pytest.approx(float(b.detach()), rel=1e-6)


def test_a_target_among_the_shared_negatives_is_left_out_of_its_row() -> None:
    # one position, target 2, shared negatives (2, 3): the softmax is over {2, 3} only, not
    # over 2 twice. Scores z·w: item 2 -> ln 3, item 3 -> 0, so the loss is -log(3/4).
    z = torch.tensor([[1.0]])
    w = torch.tensor([[5.0], [math.log(3.0)], [0.0]])
    neg = losses.shared_negative_logits(z, w, None, torch.tensor([2]), torch.tensor([2, 3]))
    assert neg[0, 0] == float("-inf") and float(neg[0, 1]) == 0.0
    pos = losses.target_logits(z, w, None, torch.tensor([2]))
    assert float(sampled_softmax_loss(pos, neg)) == pytest.approx(-math.log(0.75))
    # BCE: the hit adds nothing; the other negative adds softplus(0) = ln 2
    want = math.log1p(math.exp(-math.log(3.0))) + math.log(2.0)
    assert float(bce_loss(pos, neg)) == pytest.approx(want)


def test_per_batch_negatives_refuse_the_pairwise_losses() -> None:
    probe = _Probe(torch.randn(1, 2, 3), 5)
    spec = LossSpec("top1_max", n_items=5, n_negatives=2, negatives_per="batch")
    with pytest.raises(ValueError, match="per-batch negatives"):
        model_loss(
            probe,
            spec,
            torch.ones(1, 2, dtype=torch.long),
            torch.ones(1, 2, dtype=torch.bool),
            torch.tensor([1, 2]),
            torch.tensor([3, 4]),
        )
