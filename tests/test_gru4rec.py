"""GRU4Rec on the model interface: causality, padding, the GRU4Rec / GRU4Rec+ losses against
hand-computed values, training on tiny synthetic data above POP, save -> load; and the registry:
a model is its file plus one entry, another model's config section is an error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from seqrec.config import RunConfig, default_config, load_config
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split
from seqrec.experiments.attention import attention_maps
from seqrec.models.baselines import Popularity
from seqrec.models.gru4rec import GRU4Rec, GRU4RecConfig
from seqrec.models.registry import MODELS
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit
from seqrec.training.losses import bpr_loss, bpr_max_loss, top1_loss, top1_max_loss
from seqrec.training.setup import loss_spec


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _model() -> GRU4Rec:
    torch.manual_seed(0)
    return GRU4Rec(30, GRU4RecConfig(max_len=10, d_model=8, hidden=12)).eval()


def test_causality_the_future_never_changes_the_past() -> None:
    m = _model()
    a = torch.tensor([[0, 0, 3, 4, 5, 6, 7]])
    for t in range(2, 7):
        b = a.clone()
        b[0, t] = 20
        ha, hb = m(a), m(b)
        assert torch.allclose(ha[0, :t], hb[0, :t], atol=1e-6)
        assert not torch.allclose(ha[0, t], hb[0, t])


def test_padding_never_enters_the_state() -> None:
    m = _model()
    short, long = torch.tensor([[3, 4, 5]]), torch.tensor([[0, 0, 0, 0, 3, 4, 5]])
    assert torch.allclose(m.user_vector(short), m.user_vector(long), atol=1e-6)
    # rows of different lengths in one batch: each as if alone
    batch = torch.tensor([[0, 0, 0, 0, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]])
    alone = m.user_vector(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))
    both = m.user_vector(batch)
    assert torch.allclose(both[0], m.user_vector(short)[0], atol=1e-6)
    assert torch.allclose(both[1], alone[0], atol=1e-6)
    scores = m.score(batch)
    assert scores.shape == (2, 31) and scores[:, 0].eq(-math.inf).all()


def test_attention_maps_refuse_a_model_without_attention() -> None:
    with pytest.raises(ConfigError, match="not GRU4Rec"):
        attention_maps(_model(), torch.tensor([[1, 2, 3]]), last=2)


def test_gru4rec_losses_hand_computed() -> None:
    # one position, target score 1, negatives scored 0 and 2
    pos, neg = torch.tensor([1.0]), torch.tensor([[0.0, 2.0]])
    bpr = -(math.log(_sig(1.0)) + math.log(_sig(-1.0))) / 2
    assert float(bpr_loss(pos, neg)) == pytest.approx(bpr, rel=1e-6)
    top1 = (_sig(-1.0) + _sig(0.0) + _sig(1.0) + _sig(4.0)) / 2
    assert float(top1_loss(pos, neg)) == pytest.approx(top1, rel=1e-6)
    s0, s2 = 1 / (1 + math.exp(2.0)), math.exp(2.0) / (1 + math.exp(2.0))  # softmax(0, 2)
    bpr_max = -math.log(s0 * _sig(1.0) + s2 * _sig(-1.0)) + 0.5 * (s2 * 4.0)
    assert float(bpr_max_loss(pos, neg, reg=0.5)) == pytest.approx(bpr_max, rel=1e-6)
    top1_max = s0 * (_sig(-1.0) + _sig(0.0)) + s2 * (_sig(1.0) + _sig(4.0))
    assert float(top1_max_loss(pos, neg)) == pytest.approx(top1_max, rel=1e-6)
    # BPR-max with very different negatives is finite (computed in log space)
    far = torch.tensor([[-80.0, 90.0]])
    assert math.isfinite(float(bpr_max_loss(torch.tensor([0.0]), far, reg=0.0)))


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=300, n_items=40, min_len=10, max_len=30, seed=0)
    return prepare_frame(df, tmp_path_factory.mktemp("toy") / "prepared", name="toy")


def _config(loss: str, *more: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            'model="gru4rec"',
            "gru4rec.max_len=20",
            "gru4rec.d_model=32",
            "gru4rec.hidden=32",
            f'train.loss="{loss}"',
            "train.n_negatives=8",
            "train.lr=5e-3",
            "train.batch_size=16",
            "train.max_epochs=8",
            "train.eval_every=4",
            "train.patience=0",
            *more,
        ],
    )


@pytest.mark.parametrize("loss", ["bpr_max", "top1"])
def test_learns_the_toy_pattern_above_pop(loss: str, toy: PreparedDataset, tmp_path: Path) -> None:
    # top1 with negatives shared by a sequence's positions (ml-1m-gru4rec's setting)
    more = ['train.negatives_per="sequence"'] if loss == "top1" else []
    result = fit(toy, _config(loss, *more), tmp_path / "run", progress=False)
    pop = evaluate_split(toy, Popularity.fit(toy.split.train), "valid", protocols=["full"])
    ours = result.metrics["valid"]["full"]["ndcg@10"]
    assert ours > pop.metrics["full"]["ndcg@10"] + 0.2, (loss, ours)
    if loss == "bpr_max":  # save -> load gives identical scores
        run = load_run(result.run_dir, device=result.model.device)  # where fit left it
        h = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]], device=result.model.device)
        assert torch.equal(run.model.score(h), result.model.score(h))
        assert evaluate_split(toy, run.model, "test").metrics == result.metrics["test"]


def test_the_registry_and_the_model_sections() -> None:
    assert {"bert4rec", "sasrec", "gru4rec"} <= set(MODELS)
    cfg = default_config("gru4rec")
    assert cfg.train.loss == "bpr_max" and cfg.gru4rec.hidden == 100
    assert [name for name, _ in cfg.sections] == ["gru4rec", "next_item"]
    with pytest.raises(AttributeError, match="a section of model 'bert4rec'"):
        cfg.bert4rec  # noqa: B018
    with pytest.raises(ConfigError, match=r"\[cloze\] is a section of model 'bert4rec'"):
        load_config(RunConfig, None, ['model="gru4rec"', "cloze.mask_prob=0.5"])
    with pytest.raises(ConfigError, match=r"\[sasrec\] is a section of model 'sasrec'"):
        load_config(RunConfig, "ml-1m-bert4rec", ["sasrec.d_model=8"])
    # the TOML layout round-trips, sections at the top level
    again = load_config(RunConfig, None, ['model="gru4rec"', "gru4rec.hidden=7"])
    assert default_config("gru4rec").replace_section("gru4rec", hidden=7) == again
    assert again.to_dict()["gru4rec"]["hidden"] == 7 and "sections" not in again.to_dict()
    with pytest.raises(ConfigError, match="model 'nope' is unknown"):
        RunConfig(model="nope")
    # per-sequence negatives need the next-item task (a section the registry gives the model)
    cloze = load_config(RunConfig, None, ['train.loss="bce"', 'train.negatives_per="sequence"'])
    with pytest.raises(ConfigError, match="needs the next-item task; bert4rec has none"):
        loss_spec(cloze, 10)


def test_training_packs_the_rows_and_gives_the_same_states_as_scoring() -> None:
    m = _model()  # dropout 0: train and eval differ only in packing
    batch = torch.tensor([[0, 0, 0, 0, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 9]])
    scored = m(batch)  # eval: plain GRU over the left-aligned rows
    m.train()
    packed = m(batch)
    assert torch.allclose(scored, packed, atol=1e-6)
    assert packed[0, :4].abs().sum() == 0 and packed[2, :6].abs().sum() == 0  # padding: zeros
