"""Every number traceable: results files record the resolved config, commits, seeds and machine
of what they report, and a finished run is reused only for the config it was trained with."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from seqrec.config import RunConfig, config_diff, from_dict
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.provenance import ISA_FLAGS, machine
from seqrec.training.manifest import load_tensors
from seqrec.training.policy import as_trained
from seqrec.training.rundir import RunDir


def _cfg(**train: object) -> RunConfig:
    return from_dict(
        RunConfig,
        {
            "bert4rec": {"max_len": 12, "d_model": 16, "attn_dropout": 0.0},
            "train": {"max_epochs": 2, "lr": 5e-3, "batch_size": 32, **train},
        },
    )


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=80, n_items=30, min_len=6, max_len=15, seed=1)
    return prepare_frame(df, tmp_path_factory.mktemp("toy") / "prepared", name="toy")


def test_config_diff_names_every_differing_key() -> None:
    a, b = _cfg(), _cfg(lr=1e-3, seed=3)
    assert config_diff(a, b) == ["train.lr: 0.005 vs 0.001", "train.seed: 0 vs 3"]
    assert config_diff(a, dataclasses.replace(a)) == []


def test_a_short_budget_run_records_what_it_trained_and_is_reused_for_its_config(
    toy: PreparedDataset, tmp_path: Path
) -> None:
    from seqrec.training.fit import train_or_reuse

    short = [{"minutes": 5, "set": ["bert4rec.max_len=8", "bert4rec.d_model=8"]}]

    def cfg(budget: str) -> RunConfig:
        return from_dict(RunConfig, {**_cfg(time_budget=budget).to_dict(), "short_budget": short})

    out = tmp_path / "run"
    metrics = train_or_reuse(out, cfg("1m"), toy, progress=False)
    written = RunDir(out).config()  # config.json: the settings it trained with
    assert (written.bert4rec.max_len, written.bert4rec.d_model) == (8, 8)
    assert [tier.applied for tier in written.short_budget] == [True]
    weights = load_tensors(out / "model.pt")
    assert tuple(weights["pos_emb.weight"].shape) == (8, 8)
    assert train_or_reuse(out, cfg("1m"), toy, progress=False) == metrics  # reused
    with pytest.raises(ConfigError, match=r"another config \(bert4rec\.d_model: 8 vs 16; "):
        train_or_reuse(out, cfg("10m"), toy, progress=False)  # not short: another training


def test_a_run_written_before_short_budget_reads_as_it_trained(tmp_path: Path) -> None:
    # bert4rec.dropout_min_minutes turned the dropout off at model build; config.json held the
    # config as given
    data = _cfg(time_budget="15m").to_dict()
    del data["short_budget"]
    data["bert4rec"].update(dropout=0.1, dropout_min_minutes=30.0)
    (tmp_path / "config.json").write_text(json.dumps(data))
    old = as_trained(RunDir(tmp_path, trust=True).config())  # a run of an older version
    assert (old.bert4rec.dropout, old.bert4rec.max_len) == (0.0, 12)


def test_machine_records_the_cpu_and_its_isa_flags() -> None:
    m = machine()
    assert m["cpu"] and m["cores"] >= 1
    assert set(m["cpu_flags"]) <= set(ISA_FLAGS) and "torch_cpu_capability" in m


def test_reuse_needs_the_same_config_and_results_record_everything(
    toy: PreparedDataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    common = benchmark_script("_common")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    out = tmp_path / "run"
    metrics, log = common.train_or_reuse(toy, _cfg(), out, Path("toy.txt"))
    assert len(log) == 2 and metrics["seed"] == 0
    again, _ = common.train_or_reuse(toy, _cfg(), out, Path("toy.txt"))  # reused, not retrained
    assert again == metrics
    with pytest.raises(SystemExit, match=r"another config \(train\.lr: 0\.005 vs 0\.002\)"):
        common.train_or_reuse(toy, _cfg(lr=2e-3), out, Path("toy.txt"))

    monkeypatch.setattr(sys, "argv", ["bench.py", "--flag"])
    json_path, md_path = common.write_results(
        "probe",
        {"x": 1},
        "# probe",
        seeds={"train": 0, "candidates": 42},
        runs=[out],
        area="performance",
    )
    data = json.loads(json_path.read_text())
    assert data["x"] == 1 and data["seeds"] == {"train": 0, "candidates": 42}
    assert data["command"].endswith("bench.py --flag")
    assert set(data["evaluated_at"]) == {"commit", "clean", "diff"}
    assert data["machine"]["cpu_flags"] == machine()["cpu_flags"]
    (run,) = data["run_records"]
    assert run["config"]["train"]["lr"] == 0.005 and run["config"]["bert4rec"]["d_model"] == 16
    assert run["config"]["train"]["decay_shape"] == "linear"  # resolved: defaults included
    assert run["train_seed"] == 0 and run["candidate_seed"] == 42
    assert run["trained_at"]["commit"] == metrics["git_commit"].removesuffix("-dirty")
    assert run["wall_time_s"] == metrics["wall_time_s"] and run["epochs"] == 2
    md = md_path.read_text()
    assert "seeds: train 0, candidates 42" in md and "run `run`: trained at" in md
    assert ", on " not in md  # trained on this machine: the machine line says it
    # a run trained on another machine (a lent GPU) names it in its line
    m = json.loads((out / "metrics.json").read_text())
    m["machine"] = {**m["machine"], "cpu": "Elsewhere CPU", "gpu": "NVIDIA H200"}
    m["device"] = "cuda"
    RunDir(out).write_metrics(m)  # as that machine's run wrote it
    _, md_path = common.write_results("probe", {}, "# probe", seeds={}, runs=[out], area="x")
    assert "Elsewhere CPU" in md_path.read_text() and "GPU NVIDIA H200" in md_path.read_text()
    assert "(cuda); resolved config" in md_path.read_text()
