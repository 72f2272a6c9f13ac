"""On a CUDA device (skipped without one; benchmarks/gpu_check.sh runs them on a GPU): a run
trains there, keeps its weights there, and its evaluation, blocked scoring and recommendations
agree with the same weights on the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import seqrec.evaluation.protocols as ev
from seqrec.config import RunConfig, from_dict
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.synthetic import synthetic_interactions
from seqrec.evaluation.protocols import evaluate_split
from seqrec.training.fit import fit

# SEQREC_TEST_DEVICE=cpu runs the same checks on the CPU (the tests' own dry run)
DEVICE = os.environ.get("SEQREC_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device"
)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=300, n_items=40, min_len=10, max_len=30, seed=0)
    return prepare_frame(df, tmp_path_factory.mktemp("toy") / "prepared", name="toy")


def _config(model: str) -> RunConfig:
    section = {"max_len": 20, "d_model": 32, "dropout": 0.1, "attn_dropout": 0.0}
    return from_dict(
        RunConfig,
        {
            "model": model,
            model: section,
            "train": {
                "loss": "ce",
                "batch_size": 32,
                "max_epochs": 4,
                "eval_every": 2,
                "device": DEVICE,
                "lr": 5e-3,
            },
        },
    )


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_a_run_trains_on_the_gpu_and_ranks_as_its_weights_do_on_the_cpu(
    toy: PreparedDataset, tmp_path: Path, model: str
) -> None:
    result = fit(toy, _config(model), tmp_path / "run", progress=False)
    assert result.model.device.type == torch.device(DEVICE).type
    assert result.metrics["test"]["full"]["ndcg@10"] > 0
    on_gpu = evaluate_split(toy, result.model.eval(), "test")
    on_cpu = evaluate_split(toy, result.model.to("cpu").eval(), "test")
    for p in on_gpu.metrics:  # TF32 / kernel rounding may move a near-tie: means within 1e-3
        for k, v in on_gpu.metrics[p].items():
            assert v == pytest.approx(on_cpu.metrics[p][k], abs=1e-3), (p, k)


def test_blocked_scoring_on_the_gpu_ranks_as_whole_rows(
    toy: PreparedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqrec.training.checkpoint import build_model

    torch.manual_seed(0)
    cfg = _config("sasrec")
    model = build_model(cfg, toy.n_items).to(DEVICE).eval()
    whole = evaluate_split(toy, model, "test", batch_size=16)
    monkeypatch.setattr(ev, "SCORES_BYTES", 4 * 16 * 7)
    blocked = evaluate_split(toy, model, "test", batch_size=16)
    for p in whole.ranks:
        same = np.mean(whole.ranks[p] == blocked.ranks[p])
        assert same > 0.99, p  # the target's own dot product vs the matmul's: rounding only


def test_an_ensemble_of_runs_on_the_gpu_chooses_and_scores_as_on_the_cpu(
    toy: PreparedDataset, tmp_path: Path
) -> None:
    from seqrec.experiments.ensemble import evaluate_runs

    dirs = []
    for model in ("sasrec", "bert4rec"):
        fit(toy, _config(model), tmp_path / model, progress=False)
        dirs.append(tmp_path / model)
    on_gpu = evaluate_runs(dirs, toy, step=0.5, device=DEVICE)
    on_cpu = evaluate_runs(dirs, toy, step=0.5, device="cpu")
    # the grid's validation scores agree, so the weights chosen score alike (a near-tie may
    # pick the other of two equal points; the test metrics are compared where they agree)
    cpu_valid = {tuple(c["weights"]): c["valid"] for c in on_cpu["grid"]}
    for g in on_gpu["grid"]:
        assert g["valid"] == pytest.approx(cpu_valid[tuple(g["weights"])], abs=1e-3)
    best = max(cpu_valid.values())
    assert cpu_valid[tuple(on_gpu["weights"])] == pytest.approx(best, abs=1e-3)
    if on_gpu["weights"] != on_cpu["weights"]:
        return
    for p, metrics in on_gpu["test"].items():
        for k, v in metrics.items():
            assert v == pytest.approx(on_cpu["test"][p][k], abs=1e-3), (p, k)
