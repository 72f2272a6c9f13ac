"""The Mixture of Logits head (models/mol.py, `hstu.head = "mol"`) against its formula written out
by hand, its three scoring paths (pairs, per-sequence negatives, the whole catalogue) against
each other, and a run trained, saved, loaded, served and refused where a dot product is needed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare_frame
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.models.hstu import HSTU, HSTUConfig
from seqrec.models.mol import MixtureOfLogits, MoLConfig, mol_parameters
from seqrec.serving.export import export_run
from seqrec.serving.indexing import build_index
from seqrec.serving.recommender import Recommender
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit
from seqrec.training.losses import LossSpec, model_loss
from seqrec.training.sizes import check_memory, memory

SMALL = MoLConfig(query_groups=3, item_groups=2, dim=5, query_hidden=7, gate_hidden=6)


def _head(cfg: MoLConfig = SMALL, d: int = 4, seed: int = 0) -> MixtureOfLogits:
    torch.manual_seed(seed)
    head = MixtureOfLogits(d, cfg).eval()
    with torch.no_grad():  # gates far from uniform, so that the mixing shows
        for p in head.parameters():
            p.normal_(0.0, 1.0)
    return head


def test_one_component_a_side_is_a_cosine_over_the_temperature() -> None:
    cfg = MoLConfig(query_groups=1, item_groups=1, dim=3, query_hidden=5, gate_hidden=4)
    head = _head(cfg)
    u, e = torch.randn(2, 4), torch.randn(6, 4)
    q = F.normalize(head.query_proj(u), dim=-1)  # (2, 3): the one component of each user
    x = F.normalize(head.item_proj(e), dim=-1)
    want = q @ x.T / cfg.temperature  # one logit: its gate is 1 whatever the gating MLPs say
    assert torch.allclose(head.score(u, e), want, atol=1e-5)


def test_a_score_is_the_softmax_of_the_gates_times_the_logits() -> None:
    head = _head()
    u, e = torch.randn(1, 4), torch.randn(1, 4)
    with torch.no_grad():
        q = F.normalize(head.query_proj(u)[0].view(3, 5), dim=-1)
        x = F.normalize(head.item_proj(e)[0].view(2, 5), dim=-1)
        logits = torch.stack([q[p] @ x[j] for p in range(3) for j in range(2)]) / 0.05
        gates = F.silu(head.gate_query(u)[0] * head.gate_item(e)[0] + head.gate_logits(logits))
        want = float((torch.softmax(gates, 0) * logits).sum())
        got = float(head.score(u, e)[0, 0])
    assert math.isclose(got, want, rel_tol=1e-5)
    assert float(logits.min()) < got < float(logits.max())  # a convex mixture, not one logit


def test_its_parameter_formula_counts_the_module() -> None:
    for cfg, d in [(SMALL, 4), (MoLConfig(), 50)]:
        built = sum(p.numel() for p in MixtureOfLogits(d, cfg).parameters())
        assert mol_parameters(d, cfg) == built


def _hstu(seed: int = 0) -> HSTU:
    torch.manual_seed(seed)
    cfg = HSTUConfig(d_model=8, n_layers=1, d_qk=4, d_v=4, max_len=6, dropout=0.0, head="mol")
    return HSTU(20, cfg, SMALL).eval()


def test_pairs_sequences_and_the_catalogue_score_alike() -> None:
    model = _hstu()
    histories = torch.tensor([[0, 3, 7, 2], [5, 1, 9, 4]])
    with torch.no_grad():
        features = model.output_features(model(histories))  # (2, 4, 8)
        whole = model.score(histories)  # (2, 21)
        items = torch.tensor([[6, 11, 20], [1, 2, 3]])
        pairs = model.pair_logits(features[:, -1], items)
        every = torch.ones(2, 4, dtype=torch.bool)
        rows = model.sequence_logits(features, items, every).view(2, 4, 3)
        some = torch.tensor([[False, True, False, True], [True, False, False, False]])
        picked = model.sequence_logits(features, items, some)
    assert torch.isneginf(whole[:, 0]).all()
    assert torch.allclose(pairs, whole.gather(1, items), atol=1e-5)
    assert torch.allclose(rows[:, -1], pairs, atol=1e-5)
    assert torch.allclose(picked, rows[some], atol=1e-5)


def test_the_catalogue_is_scored_in_blocks_of_users_and_items_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head whose pairs are heavy scores a few users and items at a time (a 512 x 512 head
    once asked 12.6 GB at its first validation), with the same scores as one block."""
    import seqrec.models.mol as mol

    head = _head()
    torch.manual_seed(3)
    features, vectors = torch.randn(5, 4), torch.randn(11, 4)
    with torch.no_grad():
        whole = head.score(features, vectors)
        pair = 4 * mol.mol_activation_floats(SMALL, 1)  # bytes one (user, item) pair keeps
        monkeypatch.setattr(mol, "SCORE_BLOCK_BYTES", 6 * pair)  # 5 users: 5 x 1 a block
        shapes: list[tuple[int, int]] = []
        real = head.combine

        def recording(user, item, equation):  # type: ignore[no-untyped-def]
            shapes.append((user[0].shape[0], item[0].shape[0]))
            return real(user, item, equation)

        monkeypatch.setattr(head, "combine", recording)
        blocked = head.score(features, vectors)
    assert shapes == [(5, 1)] * 11
    assert torch.allclose(blocked, whole, atol=1e-6)
    shapes.clear()
    monkeypatch.setattr(mol, "SCORE_BLOCK_BYTES", 2 * pair)  # 2 users, 1 item a block
    with torch.no_grad():
        assert torch.allclose(head.score(features, vectors), whole, atol=1e-6)
    assert shapes == [(2, 1)] * 11 + [(2, 1)] * 11 + [(1, 1)] * 11


def test_a_mol_head_trains_on_per_sequence_negatives_as_on_their_copies_per_position() -> None:
    """The per-sequence path (a row's negatives scored once at all its positions) gives the loss
    of the per-position path handed each position its row's negatives."""
    model = _hstu()
    inputs = torch.tensor([[0, 3, 7, 2], [5, 1, 9, 4]])
    positions = inputs != 0
    targets = torch.tensor([7, 2, 8, 1, 9, 4, 6])
    negatives = torch.tensor([[11, 12], [13, 14]])
    per_row = negatives[positions.nonzero()[:, 0]]  # (M, 2)
    seq = LossSpec("sampled_softmax", n_items=20, n_negatives=2, negatives_per="sequence")
    pos = LossSpec("sampled_softmax", n_items=20, n_negatives=2, negatives_per="position")
    a = model_loss(model, seq, inputs, positions, targets, negatives)
    flat = positions.flatten().nonzero()[:, 0]  # the same positions as flat indices
    b = model_loss(model, seq, inputs, flat, targets, negatives)
    c = model_loss(model, pos, inputs, positions, targets, per_row)
    assert torch.allclose(a, c, atol=1e-5) and torch.allclose(b, c, atol=1e-5)
    a.backward()
    assert model.mol is not None and model.mol.gate_logits[0].weight.grad is not None


def test_the_size_check_weighs_the_heads_pairs_and_refuses_a_batch_over_the_bound() -> None:
    """Each (position, item) pair keeps the gating MLP's two hidden layers (128 each) and six
    P * Q = 32 tensors for its backward pass: at the authors' ML-1M batch (128 windows of 200,
    128 negatives) about 6 GiB, under the 8 GiB bound; twice the batch is refused in one line."""
    dot = load_config(RunConfig, "ml-1m-hstu", [])
    mol = load_config(RunConfig, "ml-1m-hstu", ['hstu.head="mol"'])
    pairs = 128 * 200 * (128 + 1)
    extra = memory(mol, 3416).activations - memory(dot, 3416).activations
    assert extra == pairs * (2 * 128 + 6 * 32) * 4
    check_memory(mol, 3416, training=True)
    big = load_config(RunConfig, "ml-1m-hstu", ['hstu.head="mol"', "train.batch_size=256"])
    with pytest.raises(ConfigError, match=r"activations of a batch 11\.\d GiB"):
        check_memory(big, 3416, training=True)


def _config(*more: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            'model="hstu"',
            'hstu.head="mol"',
            "hstu.d_model=16",
            "hstu.d_qk=8",
            "hstu.d_v=8",
            "hstu.max_len=10",
            "mol.query_groups=2",
            "mol.item_groups=2",
            "mol.dim=8",
            "mol.query_hidden=16",
            "mol.gate_hidden=8",
            "train.n_negatives=8",
            'train.negatives_per="sequence"',
            "train.lr=1e-2",
            "train.batch_size=16",
            "train.max_epochs=3",
            "train.patience=0",
            "train.threads=1",
            'train.device="cpu"',
            *more,
        ],
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    df = synthetic_interactions(n_users=60, n_items=25, min_len=6, max_len=14, seed=3)
    ds = prepare_frame(df, tmp_path_factory.mktemp("mol") / "prepared", name="toy")
    return fit(ds, _config(), tmp_path_factory.mktemp("mol-run") / "run", progress=False).run_dir


def test_a_mol_run_trains_saves_loads_and_recommends(run: Path) -> None:
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert len(log) == 3 and log[-1]["loss"] < log[0]["loss"]
    loaded = load_run(run)
    assert isinstance(loaded.model, HSTU) and loaded.model.mol is not None
    assert not loaded.model.blockwise  # no blocks, no index: not a dot product
    rec = Recommender.from_run(run)
    history = list(rec.items.decode(i) for i in (1, 2, 3))
    top = rec.recommend(history, k=5)
    assert len(top) == 5 and not {item for item, _ in top} & set(history)
    with torch.no_grad():
        want = loaded.model.score(torch.tensor([[1, 2, 3]]))[0, 1:]
    want[:3] = -math.inf  # the history's items
    best = [rec.items.decode(int(i) + 1) for i in torch.topk(want, 5).indices]
    assert [item for item, _ in top] == best


def test_a_mol_run_exports_its_scores_and_refuses_an_index(run: Path, tmp_path: Path) -> None:
    """Its ONNX graph (traced through the head's blocks of items) scores as PyTorch does; an
    index, which needs scores that are a dot product with item vectors, is one line."""
    ort = pytest.importorskip("onnxruntime")
    out = export_run(run, "onnx", tmp_path / "mol.onnx")
    h = torch.tensor([[1, 2, 3, 4], [0, 0, 5, 6]])
    with torch.no_grad():
        want = load_run(run).model.score(h).numpy()
    got = ort.InferenceSession(str(out)).run(["scores"], {"histories": h.numpy()})[0]
    assert np.isneginf(got[:, 0]).all()
    assert np.abs(got[:, 1:] - want[:, 1:]).max() <= 1e-4 * np.abs(want[:, 1:]).max()
    with pytest.raises(ConfigError, match="not a dot product with its output layer"):
        build_index(Recommender.from_run(run), save=False)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (['train.loss="ce"'], r'hstu\.head = "mol" scores \(position, item\) pairs'),
        (['train.negatives_per="batch"'], r'train\.negatives_per "position" or "sequence"'),
        (["mol.dim=0"], r"mol\.dim must be in \[1, 65536\]"),
        (["mol.gate_dropout=1.0"], r"mol\.gate_dropout must be in \[0, 1\)"),
        (['hstu.head="moe"'], r"hstu\.head"),
    ],
)
def test_a_mol_config_that_cannot_train_is_one_line(
    sets: list[str], message: str, tmp_path: Path
) -> None:
    df = synthetic_interactions(n_users=20, n_items=10, min_len=5, max_len=8, seed=1)
    ds = prepare_frame(df, tmp_path / "prepared", name="toy")
    with pytest.raises(ConfigError, match=message):
        fit(ds, _config(*sets), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
