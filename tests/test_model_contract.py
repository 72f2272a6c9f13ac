"""The contract every registered model keeps (seqrec.models.registry.MODELS), checked on tiny data
in seconds a model: a new model gets all of it by its registry line. Build and score shapes, the
padding column, left-padding invariance, a few epochs lowering the loss, save -> load equality,
an interrupted run resumed to the uninterrupted one's weights, train.init_from, refit,
recommend, and export (or its one-line refusal)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.models.registry import MODELS
from seqrec.serving.export import export_run
from seqrec.serving.recommender import Recommender
from seqrec.training.checkpoint import build_model, load_run
from seqrec.training.fit import fit
from seqrec.training.policy import refit_config
from seqrec.training.rundir import RunDir

# Sizes that keep each model tiny; a model not named here is tried with its defaults.
SIZES: dict[str, list[str]] = {
    "bert4rec": ["bert4rec.d_model=16", "bert4rec.max_len=10", "bert4rec.attn_dropout=0.0"],
    "sasrec": ["sasrec.d_model=16", "sasrec.max_len=10", "sasrec.attn_dropout=0.0"],
    "gru4rec": ["gru4rec.d_model=16", "gru4rec.hidden=16", "gru4rec.max_len=10"],
    "bpr-mf": ["bpr_mf.d_model=16", "train.n_negatives=4"],
    "ncf": ["ncf.factors=8"],
    "fpmc": ["fpmc.d_model=16", "train.n_negatives=4"],
    "caser": ["caser.d_model=16", "caser.dropout=0.1"],
    "transrec": ["transrec.d_model=16", "train.n_negatives=4"],
    "lrurec": ["lrurec.d_model=16", "lrurec.max_len=10"],
    "hstu": ["hstu.d_model=16", "hstu.d_qk=8", "hstu.d_v=8", "hstu.max_len=10"],
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=80, n_items=30, min_len=6, max_len=16, seed=5)
    return prepare_frame(df, tmp_path_factory.mktemp("contract") / "prepared", name="toy")


def _config(model: str, *more: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            f"model={json.dumps(model)}",
            *SIZES.get(model, []),
            "train.lr=1e-2",
            "train.batch_size=16",
            "train.max_epochs=4",
            "train.eval_every=1",
            "train.patience=0",
            "train.threads=1",
            'train.device="cpu"',
            *more,
        ],
    )


@pytest.fixture(scope="module", params=list(MODELS))
def trained(
    request: pytest.FixtureRequest, toy: PreparedDataset, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Any]:
    model = request.param
    out = tmp_path_factory.mktemp(f"run-{model}") / "run"
    return model, fit(toy, _config(model), out, progress=False)


# Each model's options that change which layers it builds (a model not named: its defaults)
VARIANTS: dict[str, list[list[str]]] = {
    "sasrec": [
        ["sasrec.shared_embedding=false", "sasrec.final_norm=false", "sasrec.n_layers=3"],
        ["sasrec.n_heads=2", "sasrec.d_model=24", 'sasrec.block="paper"'],
        ['sasrec.block="ligr"', "sasrec.final_norm=false", "sasrec.n_heads=2"],
    ],
    "bert4rec": [
        ["bert4rec.head_transform=false", "bert4rec.n_layers=1"],
        ["bert4rec.embedding_norm=false", "bert4rec.head_norm=false", "bert4rec.n_heads=4"],
    ],
    "lrurec": [["lrurec.n_layers=3", "lrurec.d_model=8"]],
    "gru4rec": [["gru4rec.n_layers=3", "gru4rec.hidden=7"]],
    "ncf": [["ncf.n_layers=1"], ["ncf.n_layers=4", "ncf.factors=6"]],
    "fpmc": [["fpmc.user_term=false"]],
    "caser": [["caser.window=3", "caser.n_h=5", "caser.n_v=2"]],
    "hstu": [
        ["hstu.time_bias=true", "hstu.time_buckets=20"],
        ["hstu.position_bias=false"],
        ['hstu.head="mol"', "mol.query_groups=3", "mol.dim=8", "mol.gate_hidden=16"],
    ],
}


@pytest.mark.parametrize("model", list(MODELS))
def test_the_parameter_formula_counts_what_the_model_builds(model: str) -> None:
    """seqrec.training.sizes weighs a config by its entry's formula before anything is built: the
    formula must count every parameter and buffer the built model holds."""
    for sets in [[], *VARIANTS.get(model, [])]:
        cfg = _config(model, *sets)
        for n_items, n_users in [(30, 11), (1, 0), (1000, 500)]:
            with torch.device("meta"):
                net = build_model(cfg, n_items, n_users)
            built = sum(t.numel() for t in (*net.parameters(), *net.buffers()))
            assert MODELS[model].parameters(n_items, n_users, cfg) == built, (sets, n_items)


def test_scores_have_the_catalogue_shape_and_a_padding_column(toy: PreparedDataset) -> None:
    for model in MODELS:
        torch.manual_seed(0)
        net = build_model(_config(model), toy.n_items, toy.n_users).eval()
        histories = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
        with torch.no_grad():
            scores = net.score(histories)
        assert scores.shape == (2, toy.n_items + 1), model
        assert torch.isneginf(scores[:, 0]).all() and torch.isfinite(scores[:, 1:]).all(), model
        # left padding is not an item: more of it changes nothing
        with torch.no_grad():
            short = net.score(torch.tensor([[3, 4, 5]]))
            padded = net.score(torch.tensor([[0, 0, 0, 3, 4, 5]]))
        assert torch.allclose(short[:, 1:], padded[:, 1:], atol=1e-5), model


def test_training_lowers_the_loss_and_save_load_is_exact(trained: tuple[str, Any]) -> None:
    model, result = trained
    log = [json.loads(x) for x in (result.run_dir / "log.jsonl").read_text().splitlines()]
    assert len(log) == 4 and log[-1]["loss"] < log[0]["loss"], (model, log)
    run = load_run(result.run_dir)
    histories = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(run.model.score(histories), result.model.cpu().score(histories))


def test_an_interrupted_run_resumes_to_the_uninterrupted_one(
    trained: tuple[str, Any],
    toy: PreparedDataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, full = trained
    real, saved = RunDir.save_checkpoint, []

    def stop_after_two(self: RunDir, state: dict[str, Any]) -> None:
        real(self, state)
        saved.append(state["epoch"])
        if len(saved) == 2:
            raise KeyboardInterrupt  # as a user's Ctrl-C after the second epoch's checkpoint

    monkeypatch.setattr(RunDir, "save_checkpoint", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        fit(toy, _config(model), tmp_path / "cut", progress=False)
    monkeypatch.undo()
    resumed = fit(toy, _config(model), tmp_path / "cut", resume=True, progress=False)
    assert resumed.metrics["test"] == full.metrics["test"], model
    want = load_run(full.run_dir).model.state_dict()
    got = load_run(resumed.run_dir).model.state_dict()
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), (model, name)


def test_init_from_starts_from_the_runs_weights(
    trained: tuple[str, Any], toy: PreparedDataset, tmp_path: Path
) -> None:
    model, first = trained
    cfg = _config(model, "train.lr=0.0", "train.max_epochs=1", f'train.init_from="{first.run_dir}"')
    second = fit(toy, cfg, tmp_path / "second", progress=False)
    want = load_run(first.run_dir).model.state_dict()
    for name, tensor in second.model.cpu().state_dict().items():
        assert torch.equal(tensor, want[name]), (model, name)
    # another size is one line, not a traceback
    arch = {"ncf": "ncf.factors=4"}.get(model, f"{_config(model).sections[0][0]}.d_model=8")
    with pytest.raises(ConfigError, match="another model shape"):
        fit(
            toy,
            _config(model, arch, f'train.init_from="{first.run_dir}"'),
            tmp_path / "x",
            progress=False,
        )
    assert not (tmp_path / "x").exists()


def test_refit_recommend_and_export(
    trained: tuple[str, Any], toy: PreparedDataset, tmp_path: Path
) -> None:
    model, result = trained
    cfg = refit_config(RunDir(result.run_dir).config(), int(result.metrics["best_epoch"]))
    refit = fit(toy, cfg, tmp_path / "refit", progress=False)
    assert refit.metrics["epochs"] == result.metrics["best_epoch"] + 1
    rec = Recommender.from_run(result.run_dir)
    history = list(toy.item_ids[:3])
    top = rec.recommend(history, k=5)
    assert len(top) == 5 and not {item for item, _ in top} & set(history)
    if load_run(result.run_dir).model.onnx_export:
        assert export_run(result.run_dir, "onnx").stat().st_size > 0
    else:
        with pytest.raises(ConfigError, match="cannot convert"):
            export_run(result.run_dir, "onnx")
    assert export_run(result.run_dir, "torchscript").stat().st_size > 0
