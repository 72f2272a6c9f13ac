"""LRURec (seqrec.models.lrurec): the parallel scan is the recurrence h_t = λ h_{t-1} + u_t, with
padding contributing nothing; λ starts in the ring [r_min, r_max] with γ = sqrt(1 - |λ|²); the
model is causal."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from seqrec.models.lrurec import LRULayer, LRURec, LRURecConfig, _scan, _scan_chunked


@pytest.mark.parametrize(("scan", "L"), [(_scan, 16), (_scan_chunked, 16), (_scan_chunked, 64)])
def test_the_parallel_scan_is_the_recurrence_and_padding_adds_nothing(
    scan: Callable[..., torch.Tensor], L: int
) -> None:
    g = torch.Generator().manual_seed(0)
    B, D = 3, 4
    u = torch.complex(torch.randn(B, L, D, generator=g), torch.randn(B, L, D, generator=g))
    lamb = 0.9 * torch.exp(1j * torch.rand(D, generator=g) * 6.28)
    real = torch.ones(B, L, dtype=torch.bool)
    real[1, :5] = False  # left padding: 5 and L - 4 positions
    real[2, : L - 4] = False  # across chunks where L > 16
    got = scan(u, lamb, real)
    for b in range(B):
        h = torch.zeros(D, dtype=torch.cfloat)
        for t in range(L):
            if not real[b, t]:
                continue  # a padding position: its own state is never read
            h = lamb * h + u[b, t]  # the first real item starts from h = 0
            torch.testing.assert_close(got[b, t], h, rtol=1e-5, atol=1e-5)


def test_the_chunked_and_doubling_scans_train_the_same_model() -> None:
    # the same weights, a left-padded batch over several chunks: the same states at the real
    # positions and the same gradients (padding states differ and are never read), though the
    # doubling scan runs over 64 positions (a power of two) and the chunked one over 40
    cfg = LRURecConfig(max_len=40, d_model=8, dropout=0.0, lru_dropout=0.0)
    nets = []
    for scan in ("doubling", "chunked"):
        torch.manual_seed(0)
        nets.append(LRURec(30, LRURecConfig(**{**cfg.__dict__, "scan": scan})))
    assert [net.width for net in nets] == [64, 40]
    ids = torch.randint(1, 31, (4, 40), generator=torch.Generator().manual_seed(1))
    ids[0, :23] = 0
    ids[1, :3] = 0
    real = ids != 0
    weights = torch.randn(int(real.sum()), 8, generator=torch.Generator().manual_seed(2))
    outs = []
    for net in nets:
        h = net(ids)
        (h[real] * weights).sum().backward()  # (a sum of squares of LayerNorm outputs: ~0)
        outs.append((h[real].detach(), {n: p.grad for n, p in net.named_parameters()}))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    for name, grad in outs[0][1].items():  # float rounding, relative to the largest entry
        other = outs[1][1][name]
        if grad is None:  # the output bias: not in the hidden states
            assert other is None, name
            continue
        assert (grad - other).abs().max() <= 1e-3 * grad.abs().max(), name


def test_lambda_starts_in_its_ring_and_gamma_normalises() -> None:
    torch.manual_seed(0)
    cfg = LRURecConfig(d_model=8, r_min=0.8, r_max=0.99)
    layer = LRULayer(cfg)
    nu, theta, gamma = torch.exp(layer.params_log)
    modulus = torch.exp(-nu)
    assert ((modulus >= 0.8) & (modulus <= 0.99)).all()
    assert ((theta >= 0) & (theta <= 2 * torch.pi)).all()
    torch.testing.assert_close(gamma, torch.sqrt(1 - modulus**2))
    assert layer.params_log.shape == (3, 16)  # a state of 2 * d_model


def test_the_model_is_causal_and_reads_the_last_position() -> None:
    torch.manual_seed(0)
    net = LRURec(30, LRURecConfig(max_len=12, d_model=8, dropout=0.0, lru_dropout=0.0)).eval()
    a = torch.tensor([[0, 0, 3, 4, 5, 6]])
    b = torch.tensor([[0, 0, 3, 4, 5, 9]])  # only the last item differs
    with torch.no_grad():
        ha, hb = net(a), net(b)
        assert ha.shape == (1, 6, 8)
        torch.testing.assert_close(ha[:, :-1], hb[:, :-1])  # earlier states: unchanged
        assert not torch.allclose(ha[:, -1], hb[:, -1])
        torch.testing.assert_close(net.user_vector(a), ha[:, -1])
