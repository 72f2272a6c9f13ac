"""One check before any file (seqrec.training.validation.validate): an invalid value in any section
of any model's config, or a setting that does not combine with another, is one line (exit 2) and
leaves no run directory, from the CLI and from Python; the negatives are one object
(NegativeSampler) with its rules in one place; a training's torch settings do not outlive it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.config import RunConfig, TrainConfig, load_config
from seqrec.config.ranges import _RANGES
from seqrec.data.batches import ClozeSampler
from seqrec.data.negatives import NegativeSampler
from seqrec.data.preprocess import Sequences
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.models.registry import MODELS
from seqrec.training.setup import torch_settings
from seqrec.training.validation import validate


def _log(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    df = synthetic_interactions(n_users=40, n_items=30, seed=2)
    p = folder / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    p.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    return p


def _out_of_range(section: type) -> str:
    """`key=value` for the first field of `section` with a range, just outside it."""
    for f in dataclasses.fields(section):
        if f.name in _RANGES:
            low, high, low_open, _ = _RANGES[f.name]
            value = (low if low_open else low - 1) if low is not None else high + 1
            return f"{f.name}={value}"
    raise AssertionError(f"{section.__name__} has no ranged field")


CASES = [
    (model, f"{name}.{_out_of_range(section)}")
    for model, e in MODELS.items()
    for name, section in e.sections.items()
] + [("sasrec", "data.min_item_interactions=0"), ("sasrec", "eval.batch_size=0")]


@pytest.mark.parametrize(("model", "bad"), CASES, ids=[f"{m}-{b}" for m, b in CASES])
def test_an_invalid_value_in_any_section_is_one_line_and_leaves_no_directory(
    model: str, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    out = tmp_path / "run"
    argv = ["train", model, "--data", str(src), "--out", str(out), "--quiet", "--set", bad]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and bad.split("=")[0] in err, err
    assert not out.exists()


def test_an_invalid_config_from_python_leaves_no_prepared_data_and_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqrec

    home = tmp_path / "home"
    monkeypatch.setenv("SEQREC_HOME", str(home))
    df = synthetic_interactions(n_users=40, n_items=30, seed=2)
    # a rule between settings (not a range): the full check runs before anything is prepared
    model = seqrec.SASRec(set=['train.decay="budget"'])
    with pytest.raises(ConfigError, match="needs train.time_budget"):
        model.fit(df, out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    assert not home.exists() or not any(home.rglob("*"))  # no prepared cache
    # and an out-of-range value, named after the estimator
    with pytest.raises(ConfigError, match=r"^SASRec: sasrec.d_model"):
        seqrec.SASRec(d_model=0).fit(df, out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists() and (not home.exists() or not any(home.rglob("*")))


def test_there_is_one_validate() -> None:
    """The config core checks ranges only (`check_ranges`); `validate` is the training's whole
    check, the one function every entry point calls."""
    import ast

    import seqrec.config

    assert not hasattr(seqrec.config, "validate")
    src = Path(__file__).resolve().parents[1] / "src" / "seqrec"
    defined = [
        str(p.relative_to(src))
        for p in sorted(src.rglob("*.py"))
        for node in ast.parse(p.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "validate"
    ]
    assert defined == ["training/validation.py"]


def _cfg(model: str, *sets: str) -> RunConfig:
    return load_config(RunConfig, None, [f"model={model!r}", *sets])


@pytest.mark.parametrize(
    ("model", "sets", "words"),
    [
        ("sasrec", ['train.loss="bce"', "train.n_negatives=0"], "needs train.n_negatives >= 1"),
        ("sasrec", ['train.loss="bpr"', 'train.negatives_per="batch"'], "works with train.loss"),
        ("bert4rec", ['train.loss="bce"', 'train.negatives_per="sequence"'], "next-item task"),
        ("bert4rec", ['train.loss="bce"', 'train.negative_sampling="popularity"'], "next-item"),
        (
            "sasrec",
            ['train.negative_sampling="popularity"', "train.logq=true", 'train.loss="bce"'],
            "logq corrects for uniform negatives",
        ),
        (
            "sasrec",
            ['train.negatives_per="sequence"', "next_item.pack=true"],
            "does not combine",
        ),
        ("gru4rec", ["next_item.pack=true"], "gru4rec: next_item.pack must be false"),
        ("ncf", ['train.loss="ce"'], "ncf: train.loss must be a sampled loss"),
        ("sasrec", ['train.decay="budget"'], "needs train.time_budget"),
        ("bert4rec", ['train.train_on="train+valid"', "train.patience=3"], "set train.patience"),
    ],
)
def test_each_rule_that_ties_settings_together_is_one_config_error(
    model: str, sets: list[str], words: str
) -> None:
    with pytest.raises(ConfigError, match=words.replace("+", r"\+").replace("(", r"\(")):
        validate(_cfg(model, *sets))


def test_a_dataset_rule_needs_the_dataset() -> None:
    from types import SimpleNamespace

    cfg = _cfg("sasrec", 'train.loss="bce"', 'train.negatives_per="batch"', "train.n_negatives=50")
    assert validate(cfg) == cfg  # without the data, nothing to compare with
    with pytest.raises(ConfigError, match="50 shared negatives per batch, but the data has 30"):
        validate(cfg, SimpleNamespace(n_items=30, n_users=9))  # type: ignore[arg-type]
    popularity = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, negative_sampling="popularity")
    )
    toy = SimpleNamespace(n_items=30, n_users=9)
    assert validate(popularity, toy) == popularity  # type: ignore[arg-type]


def test_the_negative_sampler_reads_the_config_and_draws_only_absent_items() -> None:
    ce = _cfg("sasrec", 'train.loss="ce"', "train.n_negatives=5")
    assert NegativeSampler.from_config(ce.train).n == 0  # the full CE draws none
    pop = _cfg("sasrec", 'train.loss="bce"', 'train.negative_sampling="popularity"')
    with pytest.raises(ValueError, match="training item counts"):
        NegativeSampler.from_config(pop.train)
    counts = np.array([5, 0, 1, 3, 0, 2])  # index 0: padding; items 1 and 4 weigh nothing
    sampler = NegativeSampler.from_config(pop.train, counts)
    assert (sampler.n, sampler.per) == (1, "position")
    assert sampler.cdf is not None and np.allclose(sampler.cdf, [0, 0, 1 / 6, 4 / 6, 4 / 6, 1])
    seen = np.array([[3, 0], [5, 2]])  # sample 0 holds item 3, sample 1 items 5 and 2
    rows = np.array([0, 0, 1, 1])
    wide = NegativeSampler(2, "position", counts.astype(float))
    draws = wide.draw_rows(np.random.default_rng(0), seen, rows, n_items=5)
    assert draws.shape == (4, 2)
    assert set(draws[:2].ravel()) <= {2, 5} and set(draws[2:].ravel()) <= {3}
    shared = NegativeSampler(4, "batch").draw_shared(np.random.default_rng(0), n_items=5)
    assert sorted(shared.tolist()) == sorted(set(shared.tolist())) and len(shared) == 4
    with pytest.raises(ValueError, match="position, sequence or batch"):
        NegativeSampler(1, "user")
    with pytest.raises(ValueError, match="Cloze negatives_per must be position or batch"):
        ClozeSampler(
            Sequences(np.array([1, 2, 3]), np.array([0, 3]), 3),
            max_len=4,
            negatives=NegativeSampler(1, "sequence"),
        )


def test_a_training_leaves_the_process_torch_settings_as_it_found_them(tmp_path: Path) -> None:
    src = _log(tmp_path / "data")
    before = torch.get_num_threads()
    argv = ["train", "sasrec", "--data", str(src), "--out", str(tmp_path / "run"), "--quiet"]
    sets = ["sasrec.max_len=8", "sasrec.d_model=8", "train.max_epochs=1", "train.threads=1"]
    assert main([*argv, *[x for s in sets for x in ("--set", s)]]) == 0
    assert torch.get_num_threads() == before


def test_cuda_settings_leave_out_cudnn_attention_for_the_run_only() -> None:
    # flags only: setting them needs no GPU
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with torch_settings(TrainConfig(), torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with torch_settings(TrainConfig(tf32=False), torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
