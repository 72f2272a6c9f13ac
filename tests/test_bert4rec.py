"""The BERT4Rec architecture (§3.2-3.5): shapes, padding, bidirectionality, initialisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig

CFG = BERT4RecConfig(max_len=12, d_model=16, n_layers=2, n_heads=2, dropout=0.0, attn_dropout=0.0)


def _model(n_items: int = 30, cfg: BERT4RecConfig = CFG, seed: int = 0) -> BERT4Rec:
    torch.manual_seed(seed)
    return BERT4Rec(n_items, cfg).eval()


def test_shapes_and_ids() -> None:
    m = _model(n_items=30)
    assert m.mask_id == 31 and m.item_emb.num_embeddings == 32  # 0 pad, 1..30, 31 = [MASK]
    x = torch.randint(1, 31, (4, 7))
    assert m(x).shape == (4, 7, 16)  # (B, L, D)
    assert m.logits(m(x)).shape == (4, 7, 30)  # items 1..n
    s = m.score(x)
    assert s.shape == (4, 31) and torch.isinf(s[:, 0]).all() and (s[:, 0] < 0).all()
    assert m.max_len == 11  # N - 1 history items + the appended [MASK]


def test_score_is_the_output_layer_beside_a_padding_column() -> None:
    # written in place into one tensor (fp32) or assembled (bf16 autocast): the same numbers
    m = _model(n_items=30)
    with torch.no_grad():
        m.out_bias.normal_()  # a bias that is not zero
    x = torch.randint(1, 31, (5, 7))
    weight, bias = m.output_weights()
    with torch.no_grad():
        want = m.output_features(m.user_vector(x)) @ weight.T + bias
        s = m.score(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = m.score(x)
    assert s.shape == (5, 31) and torch.equal(s[:, 1:], want)
    assert (s[:, 0] == -torch.inf).all() and (low[:, 0] == -torch.inf).all()
    assert torch.allclose(low[:, 1:].float(), want, atol=0.05, rtol=0.05)
    assert torch.equal(m.score(x).detach(), s)  # with autograd on: the assembled path


def test_padding_is_never_attended() -> None:
    m = _model()
    x = torch.tensor([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 6]])
    h = m(x)
    # the same rows without the extra padding column, and each row alone, cropped to its items
    assert torch.allclose(m(x[:, 1:])[0, 2:], h[0, 3:], atol=1e-5)
    assert torch.allclose(m(x[:1, 3:])[0], h[0, 3:], atol=1e-5)
    # scores of a history do not depend on how long the other histories of its batch are
    short = torch.tensor([[5, 6, 7]])
    batch = torch.tensor([[0, 0, 0, 5, 6, 7], [9, 8, 1, 2, 3, 4]])
    assert torch.allclose(m.score(short)[0, 1:], m.score(batch)[0, 1:], atol=1e-5)


def test_attention_is_bidirectional() -> None:
    m = _model()
    a = torch.tensor([[3, 4, 5, 6]])
    b = torch.tensor([[3, 4, 5, 9]])  # only the last item differs
    # the first position sees the future item: its hidden state changes (a causal model's would not)
    assert not torch.allclose(m(a)[0, 0], m(b)[0, 0], atol=1e-4)


def test_output_layer_shares_the_item_embedding() -> None:
    m = _model()
    w, b = m.output_weights()
    assert w.data_ptr() == m.item_emb.weight[1:].data_ptr() and w.shape == (30, 16)
    h = torch.randn(5, 16)
    z = torch.nn.functional.gelu(h @ m.head.weight.T + m.head.bias)  # Eq. 7
    assert m.head_norm is not None
    z = m.head_norm(z)  # the original code's LayerNorm (head_norm)
    assert torch.allclose(m.logits(h), z @ m.item_emb.weight[1:31].T + m.out_bias, atol=1e-5)


def test_initialisation_is_truncated() -> None:
    code = _model(n_items=2000, cfg=CFG)
    paper = _model(
        n_items=2000, cfg=BERT4RecConfig(**{**CFG.__dict__, "init": "trunc_normal_range"})
    )
    w_code, w_paper = code.item_emb.weight[1:], paper.item_emb.weight[1:]
    assert w_code.abs().max() <= 0.04 + 1e-6 and w_code.abs().max() > 0.03
    assert w_paper.abs().max() <= 0.02 + 1e-6
    assert 0.015 < float(w_code.detach().std()) < 0.02  # std 0.02 cut at 2 std -> ~0.0176
    assert float(code.item_emb.weight[0].detach().abs().sum()) == 0.0  # padding row


def test_last_only_equals_the_full_forward_at_the_last_position() -> None:
    torch.manual_seed(0)
    model = BERT4Rec(40, BERT4RecConfig(max_len=10, d_model=16, n_layers=3, n_heads=2)).eval()
    ids = torch.randint(1, 42, (6, 10))  # items and [MASK] (41)
    ids[0, :7] = 0
    ids[1, :2] = 0
    full = model(ids)[:, -1]
    last = model(ids, last_only=True)
    assert last.shape == (6, 1, 16)
    assert torch.allclose(last[:, 0], full, atol=1e-5)


def test_packed_rows_compute_what_each_sample_computes_alone() -> None:
    m = _model()
    # one row: [3 31 5 | 7 8 | pad] (31 = [MASK]), positions counted from each sample's end (N 12)
    packed = torch.tensor([[3, 31, 5, 7, 8, 0]])
    segments = torch.tensor([[1, 1, 1, 2, 2, 0]])
    position_ids = torch.tensor([[9, 10, 11, 10, 11, 0]])
    h = m(packed, segments=segments, position_ids=position_ids)
    assert torch.allclose(h[0, :3], m(torch.tensor([[3, 31, 5]]))[0], atol=1e-5)
    assert torch.allclose(h[0, 3:5], m(torch.tensor([[7, 8]]))[0], atol=1e-5)
    # nothing crosses a segment, in either direction (attention is bidirectional)
    other = packed.clone()
    other[0, 3:5] = torch.tensor([20, 21])
    h2 = m(other, segments=segments, position_ids=position_ids)
    assert torch.allclose(h[0, :3], h2[0, :3], atol=1e-6)
    assert not torch.allclose(h[0, 3:5], h2[0, 3:5], atol=1e-4)


def test_packed_cloze_batches_give_the_unpacked_loss() -> None:
    from seqrec.data.batches import ClozeConfig, ClozeSampler
    from seqrec.data.preprocess import Sequences
    from seqrec.training.losses import LossSpec, model_loss

    torch.manual_seed(0)
    lists = [list(torch.randint(1, 31, (int(n),)).tolist()) for n in torch.randint(1, 25, (40,))]
    seqs = Sequences.from_lists(lists, n_items=30)
    m, spec = _model(), LossSpec(name="ce", n_items=30)
    losses = []
    for pack in (False, True):
        cfg = ClozeConfig(bucket_batches=1, pack=pack)
        sampler = ClozeSampler(seqs, max_len=12, cfg=cfg, batch_size=16, seed=0)
        with torch.no_grad():
            losses.append(
                [
                    float(
                        model_loss(
                            m, spec, b.inputs, b.positions, b.targets, None, b.model_inputs()
                        )
                    )
                    for b in sampler.epoch(0)
                ]
            )
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_head_norm_is_the_original_codes_layernorm_after_the_transform() -> None:
    m = _model()
    assert m.head_norm is not None
    h = torch.randn(5, 16)
    z = torch.nn.functional.gelu(h @ m.head.weight.T + m.head.bias)
    z = torch.nn.functional.layer_norm(z, (16,), m.head_norm.weight, m.head_norm.bias, 1e-12)
    assert torch.allclose(m.output_features(h), z, atol=1e-5)
    paper = _model(cfg=BERT4RecConfig(**{**CFG.__dict__, "head_norm": False}))  # Eq. 7 as written
    assert paper.head_norm is None
    assert torch.allclose(paper.output_features(h), torch.nn.functional.gelu(paper.head(h)))


def test_a_run_from_before_head_norm_loads_without_it(tmp_path: Path) -> None:
    from seqrec.training.rundir import RunDir

    (tmp_path / "config.json").write_text(json.dumps({"model": "bert4rec", "bert4rec": {}}))
    assert RunDir(tmp_path, trust=True).config().bert4rec.head_norm is False  # an older run


def test_without_the_head_transform_scores_are_h_times_e_plus_bias() -> None:
    m = _model(cfg=BERT4RecConfig(**{**CFG.__dict__, "head_transform": False}))
    assert m.head is None and m.head_norm is None
    h = torch.randn(5, 16)
    assert torch.allclose(m.logits(h), h @ m.item_emb.weight[1:31].T + m.out_bias, atol=1e-6)


def test_out_bias_init_log_popularity() -> None:
    m = _model(n_items=4, cfg=BERT4RecConfig(**{**CFG.__dict__, "out_bias_init": "log_popularity"}))
    m.init_output_bias(torch.tensor([7, 0, 1, 0]))  # counts of items 1..4, smoothed by one
    assert torch.allclose(m.out_bias, torch.log(torch.tensor([8.0, 1.0, 2.0, 1.0]) / 12.0))
    zeros = _model(n_items=4)
    zeros.init_output_bias(torch.tensor([7, 0, 1, 0]))  # the default leaves the bias at zero
    assert torch.equal(zeros.out_bias, torch.zeros(4))


def _ablated(*ablate: str) -> BERT4Rec:
    torch.manual_seed(0)
    cfg = BERT4RecConfig(
        max_len=10,
        d_model=16,
        n_layers=2,
        n_heads=2,
        dropout=0.0,
        attn_dropout=0.0,
        ablate=ablate,  # type: ignore[arg-type]
    )
    return BERT4Rec(30, cfg).eval()


def test_table5_ablations_remove_exactly_their_component() -> None:
    h = torch.tensor([[3, 7, 1, 9, 4, 12, 5, 8]])
    for ablate, used in (("pe", False), ("ln", True)):  # w/o PE: the positions are never read
        model = _ablated(ablate)
        before = model.score(h)
        with torch.no_grad():
            model.pos_emb.weight.normal_()
        assert torch.allclose(model.score(h), before) is not used, ablate
    x = torch.randn(2, 6, 16)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    for ablate, part in (("pffn", "ffn"), ("ln", "ln1"), ("ln", "ln2")):
        layer = _ablated(ablate).layers[0]
        before = layer(x, keep)
        with torch.no_grad():
            for prm in getattr(layer, part).parameters():
                prm.add_(1.0)
        assert torch.allclose(layer(x, keep), before), (ablate, part)  # the part is unused
        full = _ablated().layers[0]
        before = full(x, keep)
        with torch.no_grad():
            for prm in getattr(full, part).parameters():
                prm.add_(1.0)
        assert not torch.allclose(full(x, keep), before), part  # and used without the ablation
    # w/o RC: LN(PFFN(LN(MH(x)))), no x added back
    layer = _ablated("rc").layers[0]
    with torch.no_grad():
        want = layer.ln2(layer.ffn(layer.ln1(layer.attn(x, keep))))
        assert torch.allclose(layer(x, keep), want, atol=1e-6)
