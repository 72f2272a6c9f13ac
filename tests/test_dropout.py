"""FastDropout: the same inverted dropout as nn.Dropout, with a cheaper mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig
from seqrec.models.dropout import FastDropout, dropout
from seqrec.models.sasrec import SASRec, SASRecConfig


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_drop_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1_000_000)
    y = FastDropout(p).train()(x)
    kept = y != 0
    # 1e6 Bernoulli draws: the kept share is within 5 standard deviations of 1 - p
    sd = (p * (1 - p) / x.numel()) ** 0.5
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * sd
    # the kept elements are scaled by exactly 1 / (1 - p) (p rounded to 1/65536)
    assert torch.allclose(y[kept], torch.full_like(y[kept], 65536 / (65536 - round(p * 65536))))


def test_identity_in_eval_mode_and_at_zero() -> None:
    x = torch.randn(4, 7, 3)
    assert torch.equal(FastDropout(0.3).eval()(x), x)
    assert torch.equal(FastDropout(0.0).train()(x), x)


def test_gradient_is_the_mask_and_the_stream_is_seeded() -> None:
    x = torch.randn(3, 50, 8, requires_grad=True)
    layer = FastDropout(0.25).train()
    torch.manual_seed(7)
    y = layer(x)
    y.sum().backward()
    assert x.grad is not None
    # d y / d x = mask * scale: zero where dropped, the scale where kept
    assert torch.equal(x.grad == 0, y == 0)
    assert torch.allclose(x.grad[y != 0], torch.tensor(1 / 0.75))
    torch.manual_seed(7)
    assert torch.equal(layer(x), y)


def test_kinds_and_bad_values() -> None:
    assert isinstance(dropout(0.2, "torch"), nn.Dropout)
    assert isinstance(dropout(0.2, "fast"), FastDropout)
    with pytest.raises(ValueError, match="torch or fast"):
        dropout(0.2, "cheap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        FastDropout(1.0)


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_models_compute_the_same_function_in_eval_mode(model: str) -> None:
    # the option changes only how training draws masks: same weights, same eval outputs
    def build(kind: str) -> nn.Module:
        torch.manual_seed(0)
        if model == "sasrec":
            return SASRec(30, SASRecConfig(max_len=12, d_model=16, dropout_impl=kind))  # type: ignore[arg-type]
        return BERT4Rec(30, BERT4RecConfig(max_len=12, d_model=16, dropout_impl=kind))  # type: ignore[arg-type]

    a, b = build("torch").eval(), build("fast").eval()
    assert any(isinstance(m, FastDropout) for m in b.modules())
    assert not any(isinstance(m, FastDropout) for m in a.modules())
    ids = torch.randint(1, 31, (5, 12))
    ids[0, :4] = 0
    assert torch.equal(a(ids), b(ids))
