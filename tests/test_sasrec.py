"""The SASRec architecture (§III): causality, padding, the shared item embedding, both block
variants; and SASRec trained end to end on tiny synthetic data with each loss."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from seqrec.config import default_config, load_config
from seqrec.data.batches import NextItemConfig, NextItemSampler
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.preprocess import Sequences
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split
from seqrec.models.baselines import Popularity
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit
from seqrec.training.losses import LossSpec, model_loss

CFG = SASRecConfig(max_len=10, d_model=16, n_layers=2, n_heads=2, dropout=0.0, attn_dropout=0.0)
BLOCKS = ["original", "paper", "ligr"]


def _model(block: str = "original", n_items: int = 30, seed: int = 0) -> SASRec:
    torch.manual_seed(seed)
    return SASRec(n_items, dataclasses.replace(CFG, block=block)).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize("block", BLOCKS)
def test_causality_the_future_never_changes_the_past(block: str) -> None:
    m = _model(block)
    a = torch.tensor([[0, 0, 3, 4, 5, 6, 7]])
    for t in range(2, 7):  # change the item at position t: positions < t must not move
        b = a.clone()
        b[0, t] = 20
        ha, hb = m(a), m(b)
        assert torch.allclose(ha[0, :t], hb[0, :t], atol=1e-6), t
        assert not torch.allclose(ha[0, t:], hb[0, t:], atol=1e-4), t


@pytest.mark.parametrize("block", BLOCKS)
def test_padding_is_never_attended(block: str) -> None:
    m = _model(block)
    x = torch.tensor([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 6]])
    h = m(x)
    # the same rows cropped to fewer padding columns, and alone, give the same hidden states
    assert torch.allclose(m(x[:, 1:])[0, 2:], h[0, 3:], atol=1e-5)
    assert torch.allclose(m(x[:1, 3:])[0], h[0, 3:], atol=1e-5)
    # even if the padding row of M were not zero, nothing would change
    with torch.no_grad():
        m.item_emb.weight[0] = 3.0
    assert torch.allclose(m(x)[0, 3:], h[0, 3:], atol=1e-5)


def test_padding_embedding_is_zero_and_stays_zero_in_training() -> None:
    m = _model().train()
    assert float(m.item_emb.weight[0].detach().abs().sum()) == 0.0
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    spec = LossSpec("bce", n_items=30, n_negatives=2)
    for _ in range(3):
        loss = model_loss(m, spec, x, x != 0, x[x != 0], torch.full((8, 2), 9))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(m.item_emb.weight[0].detach().abs().sum()) == 0.0


def test_shapes_and_the_shared_item_embedding() -> None:
    m = _model()
    x = torch.randint(1, 31, (4, 7))
    assert m(x).shape == (4, 7, 16)  # (B, L, D)
    w, bias = m.output_weights()
    assert bias is None and w.data_ptr() == m.item_emb.weight[1:].data_ptr()
    s = m.score(x)
    assert s.shape == (4, 31) and torch.isinf(s[:, 0]).all()
    # r_{i,t} = F_t · M_i (§III-D) at the last position
    assert torch.allclose(s[:, 1:], m(x)[:, -1] @ m.item_emb.weight[1:].T, atol=1e-5)
    assert m.max_len == 10


def test_original_code_options_change_the_model() -> None:
    x = torch.tensor([[0, 3, 4, 5]])
    torch.manual_seed(0)
    base = SASRec(30, CFG).eval()
    for change in ({"scale_embedding": False}, {"final_norm": False}, {"block": "paper"}):
        torch.manual_seed(0)
        other = SASRec(30, dataclasses.replace(CFG, **change)).eval()  # type: ignore[arg-type]
        other.load_state_dict(base.state_dict(), strict=False)
        assert not torch.allclose(other(x), base(x), atol=1e-4), change


def test_sasrec_defaults_are_the_papers() -> None:
    cfg = default_config("sasrec")
    assert (cfg.sasrec.d_model, cfg.sasrec.n_layers, cfg.sasrec.n_heads) == (50, 2, 1)
    assert (cfg.sasrec.max_len, cfg.sasrec.dropout) == (200, 0.2)
    t = cfg.train
    assert (t.lr, t.beta2, t.batch_size, t.loss, t.n_negatives) == (1e-3, 0.98, 128, "bce", 1)
    # a config file naming the model starts from that model's defaults
    assert load_config(type(cfg), "ml-1m-sasrec").train.decay == "none"
    assert load_config(type(cfg), None, ["model=sasrec"]).train == t


# --------------------------------------------------------------------- trained end to end


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=300, n_items=40, min_len=10, max_len=30, seed=0)
    return prepare_frame(df, tmp_path_factory.mktemp("toy") / "prepared", name="toy")


def _config(loss: str, *more: str, **train: object):  # type: ignore[no-untyped-def]
    sets = [
        "model=sasrec",
        "sasrec.max_len=20",
        "sasrec.d_model=32",
        "sasrec.dropout=0.1",
        "sasrec.attn_dropout=0.0",
        f'train.loss="{loss}"',
        "train.n_negatives=4",
        "train.batch_size=16",
        "train.max_epochs=8",
        "train.eval_every=4",
        "train.patience=0",
        *(f"train.{k}={v}" for k, v in train.items()),
        *more,
    ]
    return load_config(type(default_config()), None, sets)


@pytest.mark.parametrize("loss", ["bce", "ce", "sampled_softmax", "gbce"])
def test_each_loss_learns_the_toy_pattern(loss: str, toy: PreparedDataset, tmp_path: Path) -> None:
    result = fit(toy, _config(loss), tmp_path / "run", progress=False)
    pop = evaluate_split(toy, Popularity.fit(toy.split.train), "valid", protocols=["full"])
    ours = result.metrics["valid"]["full"]["ndcg@10"]
    # measured: bce 0.85, ce 0.83, sampled_softmax 0.86, gbce 0.63 against POP's 0.38
    assert ours > pop.metrics["full"]["ndcg@10"] + 0.2, (loss, ours)
    if loss == "gbce":  # save -> load gives identical scores
        run = load_run(result.run_dir, device=result.model.device)  # where fit left it
        h = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]], device=result.model.device)
        assert torch.equal(run.model.score(h), result.model.score(h))
        assert evaluate_split(toy, run.model, "test").metrics == result.metrics["test"]  # type: ignore[arg-type]


def test_packed_training_learns_the_toy_pattern(toy: PreparedDataset, tmp_path: Path) -> None:
    result = fit(toy, _config("bce", "next_item.pack=true"), tmp_path / "run", progress=False)
    pop = evaluate_split(toy, Popularity.fit(toy.split.train), "valid", protocols=["full"])
    assert result.metrics["valid"]["full"]["ndcg@10"] > pop.metrics["full"]["ndcg@10"] + 0.2
    bad = _config("gbce", "next_item.pack=true", negatives_per='"sequence"')
    with pytest.raises(ConfigError, match="next_item.pack"):
        fit(toy, bad, tmp_path / "bad", progress=False)


def test_initialisation_options() -> None:
    torch.manual_seed(0)
    xavier = SASRec(3000, dataclasses.replace(CFG, d_model=64))
    bound = (6 / (3001 + 64)) ** 0.5  # Glorot-uniform bound of the (n + 1) x d embedding
    w = xavier.item_emb.weight[1:].detach()
    assert float(w.abs().max()) <= bound + 1e-6 and float(w.abs().max()) > 0.9 * bound
    normal = SASRec(3000, dataclasses.replace(CFG, d_model=64, init="normal"))
    assert 0.019 < float(normal.item_emb.weight[1:].detach().std()) < 0.021
    assert 0.015 < float(normal.layers[0].attn.q.weight.detach().std()) < 0.025
    for m in (xavier, normal):
        assert float(m.item_emb.weight[0].detach().abs().sum()) == 0.0


def test_unshared_prediction_embedding() -> None:
    torch.manual_seed(0)
    m = SASRec(30, dataclasses.replace(CFG, shared_embedding=False)).eval()
    w, _ = m.output_weights()
    assert m.out_emb is not None and w.data_ptr() == m.out_emb.weight[1:].data_ptr()
    assert w.data_ptr() != m.item_emb.weight[1:].data_ptr()
    x = torch.tensor([[0, 3, 4, 5]])
    assert torch.allclose(m.score(x)[:, 1:], m(x)[:, -1] @ m.out_emb.weight[1:].T, atol=1e-5)


@pytest.mark.parametrize("block", BLOCKS)
def test_last_only_equals_the_full_forward_at_the_last_position(block: str) -> None:
    torch.manual_seed(0)
    cfg = SASRecConfig(max_len=10, d_model=16, n_layers=3, n_heads=2, block=block)  # type: ignore[arg-type]
    model = SASRec(40, cfg).eval()
    ids = torch.randint(1, 41, (6, 10))
    ids[0, :7] = 0  # left padding of different widths
    ids[1, :2] = 0
    full = model(ids)[:, -1]
    last = model(ids, last_only=True)
    assert last.shape == (6, 1, 16)
    assert torch.allclose(last[:, 0], full, atol=1e-5)
    assert torch.allclose(model.user_vector(ids), full, atol=1e-5)


@pytest.mark.parametrize("block", BLOCKS)
def test_packed_rows_compute_what_each_sequence_computes_alone(block: str) -> None:
    m = _model(block)
    # one row: [3 4 5 | 7 8 | pad], positions as in left-padded rows of width max_len 10
    packed = torch.tensor([[3, 4, 5, 7, 8, 0]])
    segments = torch.tensor([[1, 1, 1, 2, 2, 0]])
    position_ids = torch.tensor([[7, 8, 9, 8, 9, 0]])
    h = m(packed, segments=segments, position_ids=position_ids)
    assert torch.allclose(h[0, :3], m(torch.tensor([[3, 4, 5]]))[0], atol=1e-5)
    assert torch.allclose(h[0, 3:5], m(torch.tensor([[7, 8]]))[0], atol=1e-5)
    # nothing crosses a segment: the first sequence's items never move the second's outputs
    other = packed.clone()
    other[0, :3] = torch.tensor([20, 21, 22])
    h2 = m(other, segments=segments, position_ids=position_ids)
    assert torch.allclose(h[0, 3:5], h2[0, 3:5], atol=1e-6)


def test_packed_batches_give_the_unpacked_loss() -> None:
    torch.manual_seed(0)
    lists = [list(torch.randint(1, 31, (int(n),)).tolist()) for n in torch.randint(2, 25, (40,))]
    seqs = Sequences.from_lists(lists, n_items=30)
    m = _model("original")
    spec = LossSpec(name="ce", n_items=30)
    losses = []
    for pack in (False, True):
        sampler = NextItemSampler(
            seqs, max_len=10, cfg=NextItemConfig(pack=pack), batch_size=16, seed=0, n_negatives=0
        )
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
