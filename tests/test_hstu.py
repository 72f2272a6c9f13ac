"""HSTU (models/hstu.py) against its equations written out by hand on tiny inputs: the pointwise
SiLU attention (no softmax) gated by U, the relative position bias, the left-padding and packing
invariances, and cosine scores over the temperature."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from seqrec.models.hstu import HSTU, HSTUConfig, _relative_bias

CFG = HSTUConfig(d_model=8, n_layers=1, n_heads=2, d_qk=3, d_v=4, max_len=6, dropout=0.0)


def _model(cfg: HSTUConfig = CFG, seed: int = 0) -> HSTU:
    torch.manual_seed(seed)
    model = HSTU(12, cfg).eval()
    with torch.no_grad():  # a bias that is not near zero, so that it shows
        for layer in model.layers:
            assert layer.rab is not None
            layer.rab.normal_(0.0, 1.0)
    return model


def test_a_layer_is_the_papers_equations_written_out() -> None:
    model = _model()
    ids = torch.tensor([[0, 3, 7, 2]])  # one padding slot, then three items
    layer = model.layers[0]
    assert layer.rab is not None
    # the input: item embedding x sqrt(d) plus the position from the oldest item, padding zero
    e = model.item_emb.weight[ids[0]] * math.sqrt(8)
    e[1:] += model.pos_emb.weight[:3]
    e[0] = 0
    ln = F.layer_norm(e, (8,), eps=1e-6)
    mixed = F.silu(ln @ layer.uvqk)
    u, v, q, k = mixed[:, :8], mixed[:, 8:16], mixed[:, 16:22], mixed[:, 22:28]
    out = torch.zeros(4, 8)
    for head in range(2):
        qh, kh = q[:, 3 * head : 3 * head + 3], k[:, 3 * head : 3 * head + 3]
        vh = v[:, 4 * head : 4 * head + 4]
        for i in range(4):
            for j in range(1, i + 1):  # causal, and the padding key left out
                a = F.silu(qh[i] @ kh[j] + layer.rab[5 + j - i]) / 6
                out[i, 4 * head : 4 * head + 4] += a * vh[j]
    gated = u * F.layer_norm(out, (8,), eps=1e-6)
    want = e + layer.out(gated)
    got = model(ids)[0]
    assert torch.allclose(got[1:], want[1:], atol=1e-5)


def test_the_relative_bias_reads_the_offset_of_key_from_query() -> None:
    w = torch.arange(11.0)  # offsets -5..5, offset 0 at 5
    bias = _relative_bias(w, 4, 4)
    assert bias[3, 3] == 5 and bias[3, 0] == 2 and bias[1, 0] == 4 and bias[0, 3] == 8
    assert torch.equal(_relative_bias(w, 4, 1), bias[3:])  # the last query alone


def test_left_padding_and_the_last_position_alone_change_nothing() -> None:
    model = _model(HSTUConfig(d_model=8, n_layers=2, d_qk=4, d_v=4, max_len=8, dropout=0.0))
    short = model(torch.tensor([[4, 9, 2]]))
    padded = model(torch.tensor([[0, 0, 0, 4, 9, 2]]))
    assert torch.allclose(padded[:, 3:], short, atol=1e-5)
    last = model(torch.tensor([[0, 0, 0, 4, 9, 2]]), last_only=True)
    assert torch.allclose(last[:, -1], short[:, -1], atol=1e-5)


def test_a_packed_row_computes_what_its_sequences_do_alone() -> None:
    model = _model(HSTUConfig(d_model=8, n_layers=2, d_qk=4, d_v=4, max_len=8, dropout=0.0))
    # two sequences in one row; positions as the packer writes them (a left-padded row's)
    row = torch.tensor([[5, 1, 3, 8, 2]])
    segments = torch.tensor([[1, 1, 1, 2, 2]])
    positions = torch.tensor([[5, 6, 7, 6, 7]])
    packed = model(row, segments=segments, position_ids=positions)[0]
    assert torch.allclose(packed[:3], model(torch.tensor([[5, 1, 3]]))[0], atol=1e-5)
    assert torch.allclose(packed[3:], model(torch.tensor([[8, 2]]))[0], atol=1e-5)


def test_scores_are_cosines_over_the_temperature() -> None:
    model = _model()
    scores = model.score(torch.tensor([[3, 7, 2], [0, 1, 4]]))
    assert torch.isinf(scores[:, 0]).all()
    cosines = scores[:, 1:] * CFG.temperature
    assert cosines.abs().max() <= 1 + 1e-5
    # the best possible score is an item whose embedding points along the output
    h = model.user_vector(torch.tensor([[3, 7, 2]]))
    with torch.no_grad():
        model.item_emb.weight[5] = 3 * h[0]
    assert math.isclose(float(model.score(torch.tensor([[3, 7, 2]]))[0, 5]), 1 / 0.05, rel_tol=1e-4)


def test_its_sizes_and_temperature_are_checked_before_anything_is_built() -> None:
    from seqrec.config import RunConfig, load_config
    from seqrec.config.ranges import check_ranges
    from seqrec.errors import ConfigError

    for key, value, message in [
        ("hstu.temperature", "0.0", r"hstu\.temperature must be > 0"),
        ("hstu.d_qk", "0", r"hstu\.d_qk must be in \[1, 65536\]"),
        ("hstu.d_v", "100000", r"hstu\.d_v must be in \[1, 65536\]"),
    ]:
        cfg = load_config(RunConfig, None, ['model="hstu"', f"{key}={value}"])
        with pytest.raises(ConfigError, match=message):
            check_ranges(cfg)
