"""Loss formulas against the textbook computation and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from seqrec import losses
from seqrec.losses import cloze_loss, full_cross_entropy, reference_cross_entropy


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


def test_cloze_loss_sees_only_masked_positions() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    masked = torch.tensor([[0, 1, 0, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.bool)
    inputs = torch.ones(2, 5, dtype=torch.long)
    loss = cloze_loss(_Probe(hidden, 7), inputs, masked, torch.tensor([3, 4, 7]))
    (grad,) = torch.autograd.grad(loss, hidden)
    touched = grad.abs().sum(-1) > 0
    assert torch.equal(touched, masked)
