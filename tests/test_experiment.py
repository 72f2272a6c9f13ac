"""`seqrec experiment`: a sweep trains each point as a run, writes its results after every point,
reuses finished points (after checking their config), refuses a changed one, and every bad spec
is one line naming the file; the shipped specs load."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.config import RunConfig, load_config
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split
from seqrec.experiments.run import _value, run_experiment
from seqrec.experiments.spec import load_spec, spec_names
from seqrec.training.policy import as_trained
from seqrec.training.rundir import RunDir

BASE = """model = "sasrec"
[sasrec]
max_len = 12
d_model = 16
attn_dropout = 0.0
[train]
max_epochs = 1
lr = 5e-3
"""


def _spec(tmp_path: Path, body: str, name: str = "sweep") -> Path:
    (tmp_path / "base.toml").write_text(BASE)
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'base = "{tmp_path / "base.toml"}"\n' + body)
    return spec


def test_a_sweep_trains_each_point_once_and_writes_results_after_each(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    spec_path = _spec(
        tmp_path,
        'metric = "test.full.ndcg@10"\naxis = "sasrec.d_model"\nvalues = [8, 16]\n'
        '[paper]\n"16" = 0.5\n',
    )
    spec = load_spec(spec_path)
    assert [p.overrides for p in spec.points] == [("sasrec.d_model=8",), ("sasrec.d_model=16",)]
    runs = tmp_path / "runs"
    path = run_experiment(spec, str(tiny_runs["data"]), runs, progress=False)
    result = json.loads(path.read_text())
    assert [r["label"] for r in result["runs"]] == ["8", "16"]
    assert [r["config"]["sasrec"]["d_model"] for r in result["runs"]] == [8, 16]
    for r in result["runs"]:  # the value is the run's own test metric
        metrics = json.loads((Path(r["run_dir"]) / "metrics.json").read_text())
        assert r["value"] == metrics["test"]["full"]["ndcg@10"]
    assert result["summary"][1]["paper"] == 0.5 and result["summary"][0]["paper"] is None
    assert result["total_train_time_s"] == sum(r["train_time_s"] for r in result["runs"])
    md = path.with_suffix(".md").read_text()
    assert "| 16 | 1 |" in md and "0.5000" in md
    # each row says its budget (the base's one epoch, no clock) and the epoch validation chose
    assert result["runs"][1]["best_epoch"] == 0 and result["summary"][1]["budget"] == "1 epoch"
    assert "| 16 | 1 | 1 epoch | 1 | 1 |" in md
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "machine: " in md and "trained at another commit" not in md
    # again: both points reused, not retrained; a point trained by other code says its commit
    stamp = (runs / "sweep" / "8-s0" / "model.pt").stat().st_mtime_ns
    metrics_path = runs / "sweep" / "8-s0" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    # as a run of other code wrote it (through the run's writer: its digest is recorded)
    RunDir(metrics_path.parent).write_metrics({**metrics, "git_commit": "0123456789abcdef"})
    run_experiment(spec, str(tiny_runs["data"]), runs, progress=False)
    assert (runs / "sweep" / "8-s0" / "model.pt").stat().st_mtime_ns == stamp
    md = path.with_suffix(".md").read_text()
    assert "trained at another commit and reused: 8 (seed 0) `0123456`" in md
    # the base changed under a finished point: refused in one line naming the key
    (tmp_path / "base.toml").write_text(BASE.replace("lr = 5e-3", "lr = 1e-3"))
    with pytest.raises(ConfigError, match=r"8-s0: holds a run of another config \(train\.lr"):
        run_experiment(load_spec(spec_path), str(tiny_runs["data"]), runs, progress=False)


def test_a_rows_budget_cell_names_what_ended_its_training() -> None:
    from seqrec.experiments.run import _budget

    clock = {"train": {"time_budget": "20m", "max_epochs": 200, "max_steps": 0}}
    assert _budget(clock, {"stopped": "time_budget"}) == "20m"
    assert _budget(clock, {"stopped": "max_epochs"}) == "20m, 200 epochs first"
    assert _budget(clock, {"stopped": "early_stopping"}) == "20m, early stop"
    epochs = {"train": {"time_budget": None, "max_epochs": 30, "max_steps": 0}}
    assert _budget(epochs, {"stopped": "max_epochs"}) == "30 epochs"
    assert _budget(epochs, {"stopped": "early_stopping"}) == "30 epochs, early stop"


def test_an_epochs_sweep_trains_every_point_the_same_epochs_without_a_clock(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "budgeted.toml").write_text(
        BASE.replace("max_epochs = 1", 'max_epochs = 50\ntime_budget = "1m"\ndecay = "budget"')
    )
    path = tmp_path / "by-epochs.toml"
    path.write_text(
        f'base = "{tmp_path / "budgeted.toml"}"\nepochs = 2\naxis = "sasrec.d_model"\n'
        "values = [8, 16]\n"
    )
    spec = load_spec(path)
    cfg = spec.config(spec.points[0], 0)
    assert (cfg.train.time_budget, cfg.train.max_epochs, cfg.train.decay) == (None, 2, "epochs")
    assert cfg.train.patience == 0
    result = json.loads(
        run_experiment(spec, str(tiny_runs["data"]), tmp_path / "runs", progress=False).read_text()
    )
    assert [r["epochs"] for r in result["runs"]] == [2, 2] and result["spec"]["epochs"] == 2
    assert (
        "2 epochs a point (no time budget)"
        in (tmp_path / "runs/by-epochs/by-epochs.md").read_text()
    )
    # `--epochs` turns a budgeted spec into one, under its own name
    budgeted = _spec(tmp_path, 'budget = "1m"\naxis = "sasrec.d_model"\nvalues = [8]\n')
    assert main(["experiment", str(budgeted), "--data", "x", "--epochs", "3", "--dry-run"]) == 0
    assert "8 seed 0: sasrec.d_model=8 [" in (out := capsys.readouterr().out) and "3 epochs]" in out
    assert load_spec(budgeted).with_epochs(3).name == "sweep-3ep"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('axis = "sasrec.d_model"\nvalues = [8]\ncolour = 1\n', "unknown key(s) colour"),
        ("values = [8]\n", "points must be a list"),
        ('axis = "sasrec.d_model"\nvalues = []\n', "no points"),
        ('axis = "sasrec.d_model"\nvalues = [8, 8]\n', "point labels must differ"),
        ('[[points]]\nlabel = "a+"\n[[points]]\nlabel = "a-plus"\n', "as directory names"),
        ('axis = "sasrec.d_model"\nvalues = [8]\ncolumns = ["hr"]\n', "columns must be a list"),
        ('axis = "sasrec.d_model"\nvalues = [8]\npaper_table = "x"\n', "no paper table 'x'"),
        ('axis = "sasrec.d_model"\nvalues = [8]\nplot = "pie"\n', "plot must be"),
        ('[[points]]\nlabel = "a"\nbudget = 5\n', "points[0].budget must be"),
        ('axis = "sasrec.d_model"\nvalues = [8]\nepochs = 0\n', "epochs must be a positive"),
        ('axis = "sasrec.d_model"\nvalues = [8]\nepochs = 2\nbudget = "1m"\n', "not both"),
        ('values = [8]\n[[series]]\nlabel = "a"\n', "series[0] needs a label and an axis"),
        (
            'values = [8]\n[[series]]\nlabel = "a"\naxis = "sasrec.d_model"\nset = "x"\n',
            "series[0].set must be",
        ),
        (
            'values = [8]\n[[series]]\nlabel = "a"\naxis = "sasrec.d_model"\nvalues = 3\n',
            "series[0].values must be",
        ),
        ('axis = "sasrec.nope"\nvalues = [8]\n', "point '8'"),
        ('axis = "sasrec.d_model"\nvalues = [8]\nseeds = []\n', "seeds must be"),
        ('axis = "sasrec.d_model"\nvalues = [8]\nmetric = "ndcg"\n', "metric must look like"),
        ('[[points]]\nset = ["sasrec.d_model=8"]\n', "points[0] needs a label"),
        ("axis = [", "not valid TOML"),
        ('set = "x"\naxis = "sasrec.d_model"\nvalues = [8]\n', "set must be a list"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_file(tmp_path: Path, body: str, message: str) -> None:
    spec = _spec(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_spec(spec)
    assert str(spec) in str(err.value) and message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_shipped_specs_load_and_list_their_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"table3-ml1m", "table4-ml1m", "table5-ml1m", "table5-beauty", "fig3-ml1m"} <= set(
        spec_names()
    )
    table3 = load_spec("table3-ml1m")  # a point with its own base: another model
    assert [table3.config(p, 0).model for p in table3.points] == ["sasrec", "bert4rec", "bert4rec"]
    assert table3.config(table3.points[1], 0).cloze.max_predictions == 1
    table4 = load_spec("table4-ml1m")
    assert [p.label for p in table4.points] == ["10", "50", "100", "200", "400"]
    assert table4.paper_value("200", table4.metric) == 0.4759 and table4.budget == "5m"
    assert table4.config(table4.points[0], 0).bert4rec.max_len == 10
    fig4 = load_spec("fig4-ml1m")
    assert fig4.config(fig4.points[-1], 0).cloze.mask_prob == 0.9
    # Beauty: the paper's N grid and Table 4 row, its SASRec (n = 50, dropout 0.5) at d = 256
    beauty4 = load_spec("table4-beauty")
    assert [p.label for p in beauty4.points] == ["10", "20", "30", "40", "50"]
    assert beauty4.paper_value("20", beauty4.metric) == 0.1875
    sasrec = load_spec("table3-beauty").config(load_spec("table3-beauty").points[0], 0)
    assert (sasrec.model, sasrec.sasrec.d_model, sasrec.sasrec.max_len) == ("sasrec", 256, 50)
    assert (
        load_spec("fig4-beauty").config(load_spec("fig4-beauty").points[5], 0).cloze.mask_prob
        == 0.6
    )
    # Table 5 on Beauty: one change per point to the shipped Beauty recipe (dropout 0.2)
    ablations = load_spec("table5-beauty")
    cfgs = {p.label: ablations.config(p, 0).bert4rec for p in ablations.points}
    assert (cfgs["L = 2, h = 2"].dropout, cfgs["w/o dropout"].dropout) == (0.2, 0.0)
    assert cfgs["w/o LN"].ablate == ("ln",) and cfgs["h = 8"].n_heads == 8
    assert ablations.paper_value("w/o RC", ablations.metric) == 0.1619
    # Figure 3 on Beauty: the ML-1M baselines' recipes at Beauty's N, the file not re-filtered
    fig3b = load_spec("fig3-beauty")
    gru = fig3b.config(next(p for p in fig3b.points if p.label == "GRU4Rec+ 128"), 0)
    assert (gru.model, gru.gru4rec.max_len, gru.gru4rec.hidden) == ("gru4rec", 50, 128)
    assert (gru.data.min_user_interactions, gru.data.min_item_interactions) == (1, 1)
    bert = fig3b.config(fig3b.points[0], 0)
    assert (bert.bert4rec.d_model, bert.data.min_user_interactions) == (16, None)
    assert main(["experiment", "table5-ml1m", "--data", "ml-1m", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "h = 8 seed 0: bert4rec.dropout=0.0 short_budget=[] bert4rec.n_heads=8" in out
        and "recipe (no dropout) seed 0: bert4rec.dropout=0.0 short_budget=[] [" in out
    )
    # the spec's `set` overrides its base for its own points, not points with another base,
    # and a point's own override wins ("dropout 0.2")
    table5 = load_spec("table5-ml1m")
    drop = {p.label: table5.config(p, 0).bert4rec.dropout for p in table5.points}
    assert drop["recipe (no dropout)"] == 0.0 and drop["dropout 0.2"] == 0.2
    point = next(p for p in table5.points if p.label == "dropout 0.2")  # at its 5-minute budget
    assert as_trained(table5.config(point, 0)).bert4rec.dropout == 0.2
    # the ML-1M specs keep N = 200 at their short budgets, as they were measured, and table 4's
    # own N wins
    assert {as_trained(table5.config(p, 0)).bert4rec.max_len for p in table5.points} == {200}
    table4 = load_spec("table4-ml1m")
    lengths = [as_trained(table4.config(p, 0)).bert4rec.max_len for p in table4.points]
    assert lengths == [10, 50, 100, 200, 400]
    assert load_config(RunConfig, "ml-1m-bert4rec").bert4rec.dropout == 0.1
    assert table3.points[0].overrides == ("sasrec.d_model=256",)
    assert table3.config(table3.points[2], 0).bert4rec.dropout == 0.0


def test_the_bpr_mf_seeds_spec_trains_table_2s_bpr_mf_row() -> None:
    """bert4rec-table2-bpr-mf-seeds repeats Table 2's BPR-MF point over seeds; specs cannot
    refer to each other's points, so the two must not drift apart: same config, seed aside."""
    table2, seeds = load_spec("bert4rec-table2"), load_spec("bert4rec-table2-bpr-mf-seeds")
    row = next(p for p in table2.points if p.label == "bpr-mf")
    assert seeds.seeds == (0, 1, 2) and len(seeds.points) == 1
    for seed in seeds.seeds:
        assert seeds.config(seeds.points[0], seed) == table2.config(row, seed)


def test_points_with_their_own_budgets_extra_columns_and_the_papers_table(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    spec_path = _spec(
        tmp_path,
        'metric = "test.pop100.ndcg@10"\ncolumns = ["test.pop100.hr@10", "test.full.mrr"]\n'
        'plot = "bar"\nbudget = "1h"\n'
        '[[points]]\nlabel = "a+"\nset = ["sasrec.d_model=8"]\nbudget = "0.001s"\n'
        '[[points]]\nlabel = "b"\n'
        '[paper]\n"a+" = 0.25\n',
    )
    spec = load_spec(spec_path)
    assert [spec.config(p, 0).train.time_budget for p in spec.points] == ["0.001s", "1h"]
    two = spec.with_budget("2m")
    assert [two.config(p, 0).train.time_budget for p in two.points] == ["2m", "2m"]
    runs = tmp_path / "runs"
    path = run_experiment(spec, str(tiny_runs["data"]), runs, progress=False)
    result = json.loads(path.read_text())
    assert (runs / "sweep" / "a-plus-s0").is_dir()  # "+" spelled out, not dropped
    a = result["runs"][0]
    metrics = json.loads((Path(a["run_dir"]) / "metrics.json").read_text())
    assert metrics["stopped"] == "time_budget" and metrics["epochs"] == 1
    assert a["columns"] == {
        "test.pop100.hr@10": metrics["test"]["pop100"]["hr@10"],
        "test.full.mrr": metrics["test"]["full"]["mrr"],
    }
    summary = result["summary"][0]
    assert summary["paper"] == 0.25 and summary["columns"]["test.full.mrr"]["paper"] is None
    md = path.with_suffix(".md").read_text()
    assert "| test.pop100.hr@10 (paper) | test.full.mrr (paper) |" in md
    head = md.splitlines()[2]  # each point's own budget is its row's, not the header's
    assert head.startswith("Base config") and "budget" not in head and "a point" not in head
    assert f"{metrics['test']['pop100']['hr@10']:.4f}" in md.splitlines()[6]
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_reproduce_lists_a_papers_rows_with_its_numbers_beside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table2 = load_spec("bert4rec-table2")
    labels = [p.label for p in table2.points]
    assert labels == ["bpr-mf", "ncf", "fpmc", "gru4rec", "gru4rec+", "caser", "sasrec", "bert4rec"]
    assert [table2.config(p, 0).model for p in table2.points][:3] == ["bpr-mf", "ncf", "fpmc"]
    # the paper's numbers come from seqrec.evaluation.reference: BERT4Rec Table 2 (pop100)
    assert table2.paper_value("bpr-mf", "test.pop100.ndcg@10") == 0.2365
    assert table2.paper_value("bert4rec", "test.pop100.hr@10") == 0.6970
    assert table2.paper_value("caser", "test.pop100.mrr") == 0.3648
    # a paper reports test numbers: none stands beside a validation metric of the same name
    assert table2.paper_value("caser", "valid.pop100.mrr") is None
    table3 = load_spec("sasrec-table3")  # SASRec Table III (uni100)
    assert table3.paper_value("transrec", "test.uni100.ndcg@10") == 0.3969
    assert table3.paper_value("sasrec", "test.uni100.hr@10") == 0.8245
    assert table3.config(table3.points[1], 0).fpmc.user_term is False  # FMC
    assert main(["reproduce", "sasrec-table3", "--data", "ml-1m", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fmc seed 0: (the base) [ml-1m-fmc, 5m]" in out
    assert (
        'sasrec seed 0: train.val_protocol="uni100" [ml-1m-sasrec, the config\'s own stopping rule]'
        in out
    )
    args = ["reproduce", "bert4rec-table2", "--data", "x", "--dry-run", "--time-budget", "1m"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("1m]") == 8 and "gru4rec+ seed 0: (the base) [ml-1m-gru4rec-plus, 1m]" in out


def test_series_sweep_one_axis_per_model_over_shared_values(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "b4r.toml").write_text(
        'model = "bert4rec"\n[bert4rec]\nmax_len = 12\nattn_dropout = 0.0\n'
        "[train]\nmax_epochs = 1\n"
    )
    spec_path = _spec(
        tmp_path,
        "values = [8, 16]\n"
        '[[series]]\nlabel = "SASRec"\naxis = "sasrec.d_model"\n'
        f'[[series]]\nlabel = "BERT4Rec"\nbase = "{tmp_path / "b4r.toml"}"\n'
        'axis = ["bert4rec.d_model", "bert4rec.n_heads"]\n'
        '[[series]]\nlabel = "small"\naxis = "sasrec.d_model"\nvalues = [4]\n'
        'set = ["train.lr=0.01"]\n',
    )
    spec = load_spec(spec_path)
    labels = ["SASRec 8", "SASRec 16", "BERT4Rec 8", "BERT4Rec 16", "small 4"]
    assert [p.label for p in spec.points] == labels  # a series may have its own values
    assert spec.config(spec.points[4], 0).train.lr == 0.01  # ... and its own overrides
    assert spec.config(spec.points[0], 0).train.lr == 5e-3
    spec = dataclasses.replace(spec, points=spec.points[:4])
    cfg = spec.config(spec.points[3], 0)  # both keys of a list axis take the value
    assert (cfg.model, cfg.bert4rec.d_model, cfg.bert4rec.n_heads) == ("bert4rec", 16, 16)
    assert spec.x_label == "d_model"
    path = run_experiment(spec, str(tiny_runs["data"]), tmp_path / "runs", progress=False)
    result = json.loads(path.read_text())
    assert [s["series"] for s in result["summary"]] == ["SASRec"] * 2 + ["BERT4Rec"] * 2
    for line in ("SASRec", "BERT4Rec"):  # each series' highest point, named in the table too
        values = {s["label"]: s["mean"] for s in result["summary"] if s["series"] == line}
        top = max(values, key=lambda label: values[label])
        assert result["best"][line] == {"label": top, "value": values[top]}
        assert f"{line}: {top} ({values[top]:.4f})" in path.with_suffix(".md").read_text()
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    grid = load_spec("baselines-d-ml1m")  # selection on validation, never on test
    assert grid.metric.startswith("valid.") and len(grid.points) == 23  # NCF: 16, 32, 64
    assert grid.config(grid.points[6], 0).ncf.factors == 32
    assert grid.config(grid.points[8], 0).fpmc.d_model == 16
    fig3 = load_spec("fig3-ml1m")  # the shipped Figure 3: four models x five sizes
    assert len(fig3.points) == 20 and fig3.config(fig3.points[12], 0).gru4rec.hidden == 64


def test_a_validation_metric_of_a_train_plus_valid_run_is_a_one_line_error() -> None:
    metrics = {"test": {"full": {"ndcg@10": 0.25}}, "train_on": "train+valid"}
    assert _value(metrics, "test.full.ndcg@10") == 0.25
    with pytest.raises(ConfigError, match="train_on = 'train\\+valid' has no valid metrics"):
        _value(metrics, "valid.full.ndcg@10")


def test_a_grid_search_trains_every_combination_and_names_the_best_on_validation(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    body = (
        'metric = "valid.full.ndcg@10"\ncolumns = ["test.full.ndcg@10"]\n'
        '[grid]\n"train.lr" = [5e-3, 1e-4]\n"sasrec.d_model" = [8, 16]\n'
    )
    spec = load_spec(_spec(tmp_path, body, "grid"))
    assert [p.label for p in spec.points] == [
        "lr=0.005 d_model=8",
        "lr=0.005 d_model=16",
        "lr=0.0001 d_model=8",
        "lr=0.0001 d_model=16",
    ]
    assert spec.points[1].overrides == ("train.lr=0.005", "sasrec.d_model=16")
    small = dataclasses.replace(spec, points=spec.points[::3])  # two points: train them
    path = run_experiment(small, str(tiny_runs["data"]), tmp_path / "runs", progress=False)
    result = json.loads(path.read_text())
    values = {r["label"]: r["value"] for r in result["runs"]}
    best = max(values, key=lambda k: values[k])
    assert result["best"] == {"search": {"label": best, "value": values[best]}}
    assert f"search: {best} (" in path.with_suffix(".md").read_text()


def test_a_random_search_draws_its_points_from_the_space_with_its_seed(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    body = (
        'metric = "valid.full.ndcg@10"\n[random]\nn = 6\nseed = 3\n'
        '[random.space]\n"train.lr" = {low = 1e-4, high = 1e-2, log = true}\n'
        '"sasrec.n_layers" = [1, 2]\n'
    )
    spec = load_spec(_spec(tmp_path, body, "rand"))
    again = load_spec(_spec(tmp_path, body, "rand"))
    assert spec.points == again.points and len(spec.points) == 6
    for i, point in enumerate(spec.points):
        lr = float(point.overrides[0].removeprefix("train.lr="))
        layers = int(point.overrides[1].removeprefix("sasrec.n_layers="))
        assert 1e-4 <= lr <= 1e-2 and layers in (1, 2)
        assert point.label.startswith(f"#{i + 1} lr=")
    assert len({p.overrides for p in spec.points}) == 6  # drawn, not repeated
    path = run_experiment(spec, str(tiny_runs["data"]), tmp_path / "runs", progress=False)
    result = json.loads(path.read_text())
    assert len(result["runs"]) == 6 and result["spec"]["metric"] == "valid.full.ndcg@10"
    assert set(result["best"]) == {"search"}
    with pytest.raises(ConfigError, match="a search selects on validation"):
        load_spec(_spec(tmp_path, body.replace("valid.full", "test.full"), "on_test"))
    with pytest.raises(ConfigError, match="a grid or a random search, not both"):
        load_spec(_spec(tmp_path, body + '[grid]\n"train.lr" = [1e-3]\n', "both"))
    with pytest.raises(ConfigError, match=r"\[random\] needs n >= 1"):
        load_spec(_spec(tmp_path, "[random]\nn = 0\nspace = {}\n", "bad"))


def test_an_ensemble_spec_adds_a_row_ranking_by_its_members_runs_together(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from seqrec.data.prepare import prepare
    from seqrec.experiments.ensemble import Ensemble, weight_grid
    from seqrec.training.checkpoint import load_run

    body = (
        'ensemble = true\ncolumns = ["valid.full.ndcg@10"]\n'
        '[[points]]\nlabel = "narrow"\nset = ["sasrec.d_model=8"]\n'
        f'[[points]]\nlabel = "gru"\nbase = "{tmp_path / "gru.toml"}"\n'
    )
    (tmp_path / "gru.toml").write_text(
        'model = "gru4rec"\n[gru4rec]\nmax_len = 12\nd_model = 16\nhidden = 16\n'
        "[train]\nmax_epochs = 1\nlr = 5e-3\n"
    )
    spec = load_spec(_spec(tmp_path, body, "ens"))
    assert spec.ensemble and [p.label for p in spec.points] == ["narrow", "gru"]
    spec = spec.with_seeds([0, 1])
    runs = tmp_path / "runs"
    path = run_experiment(spec, str(tiny_runs["data"]), runs, progress=False)
    result = json.loads(path.read_text())
    labels = [(r["label"], r["seed"]) for r in result["runs"]]
    assert labels == [("narrow", 0), ("narrow", 1), ("gru", 0), ("gru", 1)] + [
        ("ensemble", 0),
        ("ensemble", 1),
    ]
    cfg = spec.config(spec.points[0], 0)
    ds = prepare(str(tiny_runs["data"]), data_cfg=cfg.data, eval_cfg=cfg.eval)
    for row in result["runs"][4:]:
        members = [r for r in result["runs"][:4] if r["seed"] == row["seed"]]
        assert row["members"] == ["narrow", "gru"]
        assert tuple(row["weights"]) in weight_grid(2, 0.1)
        models = [load_run(r["run_dir"]).model for r in members]
        alone = [evaluate_split(ds, m, "valid").metrics["full"]["ndcg@10"] for m in models]
        # the grid holds each member alone, so the chosen weights rank validation at least as
        # well as the better member
        assert row["valid"]["full"]["ndcg@10"] >= max(alone) - 1e-9
        assert row["columns"]["valid.full.ndcg@10"] == row["valid"]["full"]["ndcg@10"]
        test = evaluate_split(ds, Ensemble(models, row["weights"]), "test").metrics
        assert row["value"] == pytest.approx(test["full"]["ndcg@10"])
        assert row["members_train_time_s"] == sum(r["train_time_s"] for r in members)
    assert result["total_train_time_s"] == sum(r["train_time_s"] for r in result["runs"][:4])
    md = path.with_suffix(".md").read_text()
    assert "| ensemble | 2 | — | — |" in md and "seed 1: narrow " in md
    assert " min over 4 run(s)" in md
    # the runs are reused, and the ensemble rows computed again from them
    stamp = (runs / "ens" / "gru-s1" / "model.pt").stat().st_mtime_ns
    assert main(["experiment", str(tmp_path / "ens.toml"), "--data", str(tiny_runs["data"]),
                 "--runs-dir", str(runs), "--seeds", "0,1", "--quiet"]) == 0  # fmt: skip
    assert (runs / "ens" / "gru-s1" / "model.pt").stat().st_mtime_ns == stamp
    assert json.loads(path.read_text())["runs"][4:] == result["runs"][4:]
    capsys.readouterr()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('ensemble = 1\n[[points]]\nlabel = "a"\n[[points]]\nlabel = "b"\n', "true or false"),
        ('ensemble = true\n[[points]]\nlabel = "a"\n', "two or more [[points]]"),
        ('ensemble = true\naxis = "sasrec.d_model"\nvalues = [8, 16]\n', "two or more"),
        (
            'ensemble = true\n[[points]]\nlabel = "a"\n[[points]]\nlabel = "ensemble"\n',
            "names the ensemble's row",
        ),
        (
            'ensemble = true\n[[points]]\nlabel = "a"\n[[points]]\nlabel = "b"\n'
            'set = ["data.min_item_interactions=3"]\n',
            "point 'b' prepares the data or evaluates otherwise than 'a'",
        ),
    ],
)
def test_a_bad_ensemble_spec_is_refused_before_anything_trains(
    tmp_path: Path, body: str, message: str
) -> None:
    spec = _spec(tmp_path, body)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_spec(spec)


def test_experiment_seeds_must_be_distinct_integers(tiny_runs: dict[str, Path]) -> None:
    for bad in ("0,x", "1,1", "-1"):
        assert main(["experiment", "table4-ml1m", "--data", "ml-1m", "--seeds", bad]) == 2
    assert load_spec("ensemble-ml1m").with_seeds([0, 2]).seeds == (0, 2)


def test_a_set_on_the_command_line_reaches_every_point_and_wins(tmp_path: Path) -> None:
    spec = load_spec("bert4rec-table2")  # points with their own bases, one with its own lr
    bpr = [p.label for p in spec.points].index("bpr-mf")
    assert spec.config(spec.points[bpr], 0).train.lr == 1e-2
    sets = ["data.min_item_interactions=1", "train.lr=5e-3"]
    changed = spec.with_overrides(sets)
    cfgs = [changed.config(p, 0) for p in changed.points]
    assert {c.data.min_item_interactions for c in cfgs} == {1}
    assert {c.train.lr for c in cfgs} == {5e-3}  # bpr-mf's own lr = 1e-2 is overridden
    assert changed.points[bpr].overrides[-2:] == tuple(sets)  # recorded in the results' spec
    with pytest.raises(ConfigError, match="section.key=value"):
        spec.with_overrides(["lr=5e-3"])


def test_a_point_out_of_range_fails_when_its_config_is_made_not_at_preparation() -> None:
    spec = load_spec("ensemble-ml1m").with_overrides(["data.min_user_interactions=0"])
    with pytest.raises(
        ConfigError, match=r"data\.min_user_interactions must be in \[1, 1000000000\], got 0"
    ):
        spec.config(spec.points[0], 0)
    bad = load_spec("ensemble-ml1m").with_overrides(['train.val_metric="ndcg@7"'])
    with pytest.raises(ConfigError, match="val_metric 'ndcg@7' is not one of"):
        bad.config(bad.points[1], 0)  # the loop's own rules too, not the ranges alone
