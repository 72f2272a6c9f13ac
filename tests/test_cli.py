from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.config import RunConfig, load_config
from seqrec.data.download import DatasetSource
from seqrec.data.synthetic import synthetic_interactions


def _log(tmp_path: Path) -> Path:
    df = synthetic_interactions(n_users=80, n_items=50, seed=1)
    p = tmp_path / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    p.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    return p


def test_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _log(tmp_path)
    assert main(["stats", "--data", str(src), "--json", "--quiet"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert set(stats) == {"users", "items", "actions", "avg_length", "density"}
    assert stats["users"] == 80
    assert main(["stats", "--data", str(src), "--min-user-interactions", "30", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| dataset | #users |" in out and "| ratings |" in out


def test_evaluate_pop_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _log(tmp_path)
    ranks = tmp_path / "pop.parquet"
    argv = [
        "evaluate",
        "pop",
        "--data",
        str(src),
        "--protocol",
        "full,pop100",
        "--json",
        "--quiet",
        "--save-ranks",
        str(ranks),
    ]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert list(res) == ["full", "pop100"]
    assert set(res["full"]) == {"hr@1", "hr@5", "hr@10", "ndcg@5", "ndcg@10", "mrr"}
    assert 0 <= res["pop100"]["ndcg@10"] <= res["pop100"]["hr@10"] <= 1
    # comparing a result with itself: no difference, p = 1
    assert (
        main(["significance", str(ranks), str(ranks), "--protocol", "full,pop100", "--json"]) == 0
    )
    sig = json.loads(capsys.readouterr().out)
    assert sig["full"]["diff"] == 0 and sig["pop100"]["t_pvalue"] == 1.0


def test_bad_input_is_one_line_and_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ratings.dat"
    bad.write_text("1,2,3,4\n")
    assert main(["prepare", "--data", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("seqrec: error: ") and "ratings.dat" in err and "expected 4 fields" in err
    assert not (tmp_path / "seqrec-home" / "prepared").exists() or not any(
        (tmp_path / "seqrec-home" / "prepared").iterdir()
    )


def test_unknown_config_key_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _log(tmp_path)
    assert main(["prepare", "--data", str(src), "--set", "data.min_users=3", "--quiet"]) == 2
    assert "unknown key(s) min_users" in capsys.readouterr().err


def test_quickstart_falls_back_to_synthetic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SEQREC_DATA_DIR", raising=False)
    unreachable = DatasetSource(
        name="ml-1m",
        url="http://127.0.0.1:9/ml-1m.zip",
        archive="ml-1m.zip",
        data_file="ml-1m/ratings.dat",
        format="movielens-dat",
    )
    monkeypatch.setattr("seqrec.data.download.DATASETS", {"ml-1m": unreachable})
    # the synthetic run ends at its config's 60 epochs well inside the default 5 minutes; a
    # longer budget keeps it so on a machine busy with other work (the clock would cut it)
    assert main(["quickstart", "--quiet", "--time-budget", "1h"]) == 0
    out = capsys.readouterr()
    assert "running on SYNTHETIC data" in out.err and out.err.count("\n") == 1
    assert "| pop full |" in out.out and "| pop pop100 |" in out.out
    rows = {
        line.split("|")[1].strip(): [float(c) for c in line.split("|")[2:-1]]
        for line in out.out.splitlines()
        if line.startswith(("| pop full", "| bert4rec full"))
    }
    # the sequential pattern of the synthetic data is learned: NDCG@10 (column 5) far above POP
    assert rows["bert4rec full"][4] > 2 * rows["pop full"][4], rows


TINY = [
    "--set",
    "bert4rec.max_len=16",
    "--set",
    "bert4rec.d_model=16",
    "--set",
    "train.max_epochs=2",
    "--set",
    "train.batch_size=32",
]


def test_train_then_evaluate_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _log(tmp_path)
    run = tmp_path / "run"
    argv = ["train", "bert4rec", "--data", str(src), "--out", str(run), "--quiet", *TINY]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| bert4rec full |" in out and str(run) in out
    for name in ("config.json", "vocab.json", "model.pt", "metrics.json", "log.jsonl"):
        assert (run / name).exists(), name
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["seed"] == 0
    # evaluate DIR prints the same JSON shape as POP, and the test numbers of the run
    argv = ["evaluate", str(run), "--data", str(src), "--protocol", "full,pop100", "--json"]
    assert main([*argv, "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert list(res) == ["full", "pop100"]
    assert res["full"] == pytest.approx(metrics["test"]["full"])
    # a finished run is not trained over, nor resumed
    assert main(["train", "bert4rec", "--data", str(src), "--out", str(run), "--quiet"]) == 2
    assert "already holds files" in capsys.readouterr().err
    argv = ["train", "bert4rec", "--data", str(src), "--out", str(run), "--resume", "--quiet"]
    assert main(argv) == 2
    assert "already finished" in capsys.readouterr().err


def test_refit_trains_the_run_again_on_train_and_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path)
    run, refit = tmp_path / "run", tmp_path / "refit"
    argv = ["train", "bert4rec", "--data", str(src), "--out", str(run), "--quiet", *TINY]
    assert main([*argv, "--set", "train.max_epochs=3"]) == 0
    best = json.loads((run / "metrics.json").read_text())["best_epoch"]
    capsys.readouterr()
    assert main(["refit", str(run), "--out", str(refit), "--quiet"]) == 0  # the run's own data
    out = capsys.readouterr().out
    assert f"refit of {run}: {best + 1} epochs (its validation chose epoch {best})" in out
    metrics = json.loads((refit / "metrics.json").read_text())
    assert metrics["epochs"] == best + 1 and metrics["best_epoch"] == best  # the last state
    assert metrics["train_on"] == "train+valid" and "valid" not in metrics  # nothing validated
    stored = json.loads((refit / "config.json").read_text())
    assert stored["source"]["refit_of"] == str(run) and stored["source"]["data"] == str(src)
    assert stored["train"]["train_on"] == "train+valid" and stored["bert4rec"]["d_model"] == 16
    # a refit chose nothing on validation, and an unfinished run has nothing chosen yet
    assert main(["refit", str(refit), "--out", str(tmp_path / "again"), "--quiet"]) == 2
    assert "nothing chose its epochs on validation" in capsys.readouterr().err
    (run / "metrics.json").unlink()
    assert main(["refit", str(run), "--out", str(tmp_path / "again"), "--quiet"]) == 2
    assert "the run has not finished" in capsys.readouterr().err


def test_refit_on_every_item_and_recommendations_that_exclude(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`refit --all` trains on every item for the chosen epochs and tests nothing;
    `recommend --exclude` leaves those items out; `serve --exclude-items` reads a file of ids."""
    from seqrec.cli.serving import _read_ids

    src = _log(tmp_path)
    run, final = tmp_path / "run", tmp_path / "final"
    argv = ["train", "sasrec", "--data", str(src), "--out", str(run), "--quiet"]
    assert main([*argv, "--set", "sasrec.d_model=8", "--set", "train.max_epochs=3"]) == 0
    best = json.loads((run / "metrics.json").read_text())["best_epoch"]
    capsys.readouterr()
    assert main(["refit", str(run), "--out", str(final), "--all", "--quiet"]) == 0
    assert "on every item; nothing is held out to test it" in capsys.readouterr().out
    metrics = json.loads((final / "metrics.json").read_text())
    assert (metrics["train_on"], metrics["epochs"]) == ("all", best + 1)
    assert "test" not in metrics and "valid" not in metrics
    user = ["recommend", str(final), "--user", "3", "-k", "5", "--json", "--quiet"]
    assert main(user) == 0
    top = [r["item"] for r in json.loads(capsys.readouterr().out)["items"]]
    assert main([*user, "--exclude", f"{top[0]},{top[2]},999999"]) == 0
    fewer = [r["item"] for r in json.loads(capsys.readouterr().out)["items"]]
    assert fewer[:3] == [top[1], *top[3:5]] and top[0] not in fewer and top[2] not in fewer
    ids = tmp_path / "out-of-stock.txt"
    ids.write_text("# out of stock\n12\n\nsku-9  # a note\n")
    assert _read_ids(str(ids)) == [12, "sku-9"]
    # a model trained without a --config fits its history length to the data too
    gru = tmp_path / "gru"
    argv = ["train", "gru4rec", "--data", str(src), "--out", str(gru), "--quiet"]
    assert main([*argv, "--set", "train.max_epochs=1"]) == 0
    stored = json.loads((gru / "config.json").read_text())
    assert stored["adapt"] == [] and 16 <= stored["gru4rec"]["max_len"] < 200


def test_evaluate_rejects_a_run_on_other_items(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "bert4rec", "--data", str(src), "--out", str(run), "--quiet", *TINY]) == 0
    capsys.readouterr()
    other = tmp_path / "other" / "ratings.dat"
    other.parent.mkdir()
    df = synthetic_interactions(n_users=80, n_items=30, seed=2)
    other.write_text(
        "".join(
            f"{u}::{i}::4::{t}\n" for u, i, t in df.select("user", "item", "timestamp").iter_rows()
        )
    )
    assert main(["evaluate", str(run), "--data", str(other), "--quiet"]) == 2
    assert "trained on other items" in capsys.readouterr().err


def test_train_sasrec_with_each_loss_then_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path)
    tiny = ["--set", "sasrec.max_len=16", "--set", "sasrec.d_model=16", "--set"]
    runs = []
    for loss in ("bce", "ce"):
        run = tmp_path / f"sasrec-{loss}"
        argv = ["train", "sasrec", "--data", str(src), "--out", str(run), "--quiet", *tiny]
        recipe = ["--config", "ml-1m-sasrec"] if loss == "bce" else []  # else sasrec-ce
        assert main([*argv, "train.max_epochs=2", *recipe]) == 0
        # the paper's SASRec is "sasrec"; with another loss it is labelled apart from the paper
        label = "sasrec" if loss == "bce" else "sasrec+ce"
        out = capsys.readouterr().out
        assert f"| {label} full |" in out and ("paper:" not in out or loss == "bce")
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["model"] == "sasrec" and cfg["train"]["loss"] == loss
        lr, beta2 = (1e-3, 0.98) if loss == "bce" else (4e-3, 0.999)  # each recipe's
        assert (cfg["train"]["lr"], cfg["train"]["beta2"]) == (lr, beta2)
        runs.append(str(run))
    assert main(["compare", *runs, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    names = ["sasrec-bce", "sasrec-ce"]
    assert res["split"] == "test" and list(res["metrics"]) == names
    assert list(res["paired_tests"]) == ["sasrec-ce"]  # each run against the first
    t = res["paired_tests"]["sasrec-ce"]["full"]
    assert t["n_users"] == 80
    # the p-value is the two-sided tail of the reported t statistic with n - 1 degrees of freedom
    from scipy import stats

    assert t["t_pvalue"] == pytest.approx(2 * stats.t.sf(abs(t["t_statistic"]), 79), rel=1e-9)
    ndcg = [res["metrics"][n]["full"]["ndcg@10"] for n in names]
    assert (t["metric_a"], t["metric_b"]) == pytest.approx(ndcg)
    assert t["diff"] == pytest.approx(ndcg[0] - ndcg[1])
    assert main(["compare", *runs]) == 0  # the Markdown tables
    out = capsys.readouterr().out
    assert "| full | ndcg@10 |" in out and "| sasrec-ce | pop100 |" in out
    # the table shows run - base, and names the better side
    gain = ndcg[1] - ndcg[0]
    better = "sasrec-ce" if gain > 0 else "sasrec-bce"
    assert f"| sasrec-ce | full | {gain:+.4f} | {better} |" in out
    assert main(["compare", runs[0]]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", runs[0], runs[0]]) == 2
    assert "twice" in capsys.readouterr().err


def test_train_says_in_one_line_what_a_short_budget_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from seqrec.cli import _say_short_budget

    _say_short_budget(load_config(RunConfig, "ml-1m-bert4rec", ['train.time_budget="5m"']))
    assert capsys.readouterr().out == (
        "the epochs 5m buys here decide bert4rec.dropout=0.0 (under 120 epochs), "
        "bert4rec.max_len=100 (under 50 epochs), timed as the run starts; "
        "--set short_budget=[] keeps the config's own\n"
    )
    tiers = (
        'short_budget=[{minutes = 30, set = ["bert4rec.dropout=0.0"]}, '
        '{epochs = 50, set = ["bert4rec.max_len=100"]}]'
    )
    _say_short_budget(load_config(RunConfig, "ml-1m-bert4rec", [tiers, 'train.time_budget="5m"']))
    assert capsys.readouterr().out == (
        "5m is a short budget: this run trains with bert4rec.dropout=0.0 (under 30 min); "
        "the epochs 5m buys here decide bert4rec.max_len=100 (under 50 epochs), timed as the "
        "run starts; --set short_budget=[] keeps the config's own\n"
    )
    explicit = ['train.time_budget="15m"', "bert4rec.dropout=0.2", "bert4rec.max_len=150"]
    _say_short_budget(load_config(RunConfig, "ml-1m-bert4rec", explicit))  # explicit keys win
    minutes = 'short_budget=[{minutes = 30, set = ["bert4rec.dropout=0.0"]}]'
    _say_short_budget(load_config(RunConfig, "ml-1m-bert4rec", [minutes]))  # its own 60 minutes
    _say_short_budget(load_config(RunConfig, "ml-1m-sasrec-ce", ['train.time_budget="1m"']))
    assert capsys.readouterr().out == ""


def test_sasrec_without_a_config_starts_from_the_sasrec_ce_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path)
    tiny = ["--set", "sasrec.max_len=8", "--set", "sasrec.d_model=8", "--set", "train.max_epochs=1"]
    base = ["train", "sasrec", "--data", str(src), "--quiet", *tiny]
    assert main([*base, "--out", str(tmp_path / "ce")]) == 0
    assert "the sasrec-ce recipe" in capsys.readouterr().out
    got = json.loads((tmp_path / "ce" / "config.json").read_text())
    recipe = load_config(RunConfig, "sasrec-ce")
    assert got["train"]["loss"] == "ce"
    # the recipe's schedule and sizes, the explicit --set values winning
    assert (got["train"]["lr"], got["train"]["decay"]) == (recipe.train.lr, "plateau")
    assert (got["sasrec"]["max_len"], got["sasrec"]["d_model"]) == (8, 8)
    assert recipe.train.lr != load_config(RunConfig, None, ['model="sasrec"']).train.lr
    assert main([*base, "--out", str(tmp_path / "bce"), "--set", 'train.loss="bce"']) == 0
    assert json.loads((tmp_path / "bce" / "config.json").read_text())["train"]["loss"] == "bce"
