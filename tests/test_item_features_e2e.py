"""Item features end to end: every model that reads them trains, saves and loads with them;
the estimator and the CLI take an items table; a new item is added to a trained run and is
recommended after a history of its neighbours; a run's items file is checked like its other
files; a config that cannot use item features is one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

import seqrec
from planted import N_GENRES, PER_GENRE, feature_config, planted_log, post_json
from seqrec.cli import main
from seqrec.config import ItemsConfig, RunConfig, load_config
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.errors import ConfigError, RunError
from seqrec.serving.recommender import Recommender
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit
from seqrec.training.rundir import RunDir
from seqrec.training.validation import validate


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreparedDataset, Path]:
    log, items = planted_log()
    root = tmp_path_factory.mktemp("features")
    table = root / "items.csv"
    items.filter(pl.col("item") <= N_GENRES * PER_GENRE).write_csv(table)
    return prepare(log, out=root / "prepared", name="planted", progress=False), table


@pytest.mark.parametrize("model", ["sasrec", "bert4rec", "lrurec", "gru4rec"])
def test_each_feature_model_trains_saves_and_loads_with_its_features(
    model: str, planted: tuple[PreparedDataset, Path], tmp_path: Path
) -> None:
    ds, table = planted
    result = fit(ds, feature_config(model, table), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "items.npz").exists()
    assert "items.npz" in json.loads((tmp_path / "run" / "sha256.json").read_text())
    run = load_run(tmp_path / "run")
    assert run.items is not None and run.items[0].describe().startswith("genre: category (4")
    histories = torch.tensor([[0, 1, 5, 9], [2, 6, 10, 14]])
    result.model.eval()
    assert torch.allclose(result.model.score(histories), run.model.score(histories), atol=1e-6)
    assert "item_emb.cats.0.weight" in run.model.state_dict()
    assert "item_emb.codes_0" in run.model.state_dict()  # the weights hold the features too
    if run.model.onnx_export:  # the exported graph scores as the model does
        ort = pytest.importorskip("onnxruntime")
        from seqrec.serving.export import export_run

        out = export_run(tmp_path / "run", "onnx")
        got = ort.InferenceSession(str(out)).run(["scores"], {"histories": histories.numpy()})[0]
        want = run.model.score(histories).numpy()
        assert np.allclose(got[:, 1:], want[:, 1:], atol=1e-4)


def test_a_new_item_is_recommended_after_its_neighbours(
    planted: tuple[PreparedDataset, Path],
) -> None:
    log, items = planted_log()
    model = seqrec.SASRec(d_model=16, max_len=10, max_epochs=15, patience=0, seed=0)
    model.set_params(set=["items.id_dropout=0.5"])
    model.fit(
        log, items=items.filter(pl.col("item") <= 40), item_features=["genre"], progress=False
    )
    history = [np.asarray([4, 8, 12])]  # internal ids
    before = model.recommender_.scores(history)
    new = model.add_items(items.filter(pl.col("item") > 40))
    assert new == [41, 42, 43, 44]
    # item 44 is of genre 0, like 4, 8, 12, ...: a history of those ranks it first among the new
    recs = model.recommender_.recommend([4, 8, 12, 16, 20], k=40)
    ranked_new = [item for item, _ in recs if item > 40]
    assert ranked_new[0] == 44
    similar = model.similar_items([44], k=3)
    assert all(int(s) % N_GENRES == 0 for s in similar.get_column("similar").to_list())
    # the run directory records them: a later load has them, the old answers unchanged
    again = seqrec.load(model.run_dir_)
    assert again.recommender_.n_items == 44
    assert torch.allclose(again.recommender_.scores(history)[:, :41], before, atol=1e-6)
    with pytest.raises(seqrec.errors.DataError, match=r"4 of its 4 items are already in"):
        again.add_items(items.filter(pl.col("item") > 40))


def test_the_cli_trains_with_an_items_table_and_adds_items(
    planted: tuple[PreparedDataset, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, items = planted_log()
    data = tmp_path / "log.csv"
    log.write_csv(data)
    _, table = planted
    new = tmp_path / "new.csv"
    items.filter(pl.col("item") > 40).write_csv(new)
    out = tmp_path / "run"
    args = ["train", "gru4rec", "--data", str(data), "--out", str(out), "--quiet"]
    args += ["--items-table", str(table), "--item-features", "genre,title:text"]
    args += ["--set", "train.max_epochs=2", "--set", "gru4rec.max_len=10"]
    assert main(args) == 0
    assert main(["add-items", str(out), "--items", str(new)]) == 0
    assert "4 items added (41, 42, 43, 44); 40 -> 44 items" in capsys.readouterr().out
    assert main(["recommend", str(out), "--history", "4,8,12", "-k", "44"]) == 0
    assert "44" in capsys.readouterr().out


def test_a_tampered_items_file_is_refused(
    planted: tuple[PreparedDataset, Path], tmp_path: Path
) -> None:
    ds, table = planted
    fit(ds, feature_config("sasrec", table), tmp_path / "run", progress=False)
    path = tmp_path / "run" / "items.npz"
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RunError, match=r"items.npz: its sha256 is not one this run recorded"):
        Recommender.from_run(tmp_path / "run")


def test_configs_that_cannot_read_item_features_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="items.features: given without items.table"):
        validate(load_config(RunConfig, None, ['model="sasrec"', 'items.features=["genre"]']))
    cfg = load_config(
        RunConfig, None, ['model="bpr-mf"', 'items.table="x.csv"', 'items.features=["genre"]']
    )
    with pytest.raises(ConfigError, match=r"bpr-mf reads no item features \(the models that do: "):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"items.id_dropout must be in \[0, 1\]"):
        validate(load_config(RunConfig, None, ['model="sasrec"', "items.id_dropout=1.5"]))
    assert ItemsConfig().features == ()


def test_a_bad_items_table_writes_nothing(
    planted: tuple[PreparedDataset, Path], tmp_path: Path
) -> None:
    ds, _ = planted
    table = tmp_path / "items.csv"
    pl.DataFrame({"item": [1, 2], "genre": ["a", "b"]}).write_csv(table)  # most items missing
    with pytest.raises(seqrec.errors.DataError, match=r"38 of 40 items have no row"):
        fit(
            ds,
            feature_config("sasrec", table, 'items.features=["genre"]'),
            tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run").exists()


def test_items_are_added_over_http(planted: tuple[PreparedDataset, Path], tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")

    from seqrec.serving.service import ServeOptions, create_app
    from test_serve import _running

    ds, table = planted
    fit(ds, feature_config("sasrec", table), tmp_path / "run", progress=False)
    rec = Recommender.from_run(tmp_path / "run")

    new = [{"item": 41, "genre": "g1", "title": "film 41 of kind 1"}]
    with _running(create_app(rec, ServeOptions(save_items=False))) as url:
        assert post_json(url + "/items", {"items": new}) == (200, {"added": [41], "n_items": 41})
        status, body = post_json(url + "/items", {"items": new})
        assert status == 422 and "already in the catalogue (41)" in str(body["detail"])
        status, body = post_json(url + "/items", {"items": [{"item": 42}]})
        assert status == 422 and "no column genre" in str(body["detail"])
        # every item but the history's: the new one is among them
        status, body = post_json(url + "/recommend", {"history": [1, 5, 9], "k": 40})
        items = [row["item"] for row in body["items"]]  # type: ignore[attr-defined]
        assert status == 200 and 41 in items and len(items) == 38
    assert RunDir(tmp_path / "run").vocab()["items"][-1] != 41  # save_items=False: not recorded


def test_adding_items_to_a_run_without_features_is_one_line(
    planted: tuple[PreparedDataset, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds, table = planted
    cfg = load_config(RunConfig, None, ['model="sasrec"', "sasrec.d_model=8", "train.max_epochs=1"])
    fit(ds, cfg, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "vocab.json").read_bytes()
    assert main(["add-items", str(tmp_path / "run"), "--items", str(table)]) != 0
    err = capsys.readouterr().err.strip()
    assert "trained without item features" in err and "\n" not in err
    assert (tmp_path / "run" / "vocab.json").read_bytes() == before
    assert (
        main(
            [
                "train",
                "sasrec",
                "--data",
                "x.csv",
                "--out",
                str(tmp_path / "r2"),
                "--item-features",
                "genre",
            ]
        )
        != 0
    )
    assert "items.features: given without items.table" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_init_from_a_run_whose_catalogue_grew(
    model: str, planted: tuple[PreparedDataset, Path], tmp_path: Path
) -> None:
    from seqrec.training.setup import setup

    ds, table = planted
    fit(ds, feature_config(model, table, "train.max_epochs=1"), tmp_path / "old", progress=False)
    old = load_run(tmp_path / "old")
    log, items = planted_log(seed=1)  # another log, in another order, with four new items
    extra = [(1000 + i, item, t) for i, item in enumerate([41, 42, 43, 44]) for t in range(3)]
    log = pl.concat([log, pl.DataFrame(extra, schema=log.schema, orient="row")])
    log = log.with_columns(pl.col("item").cast(pl.Int64))
    grown = tmp_path / "items.csv"
    items.write_csv(grown)
    new_ds = prepare(log, out=tmp_path / "prepared", name="grown", progress=False)
    assert new_ds.n_items == 44 and list(new_ds.item_ids) != list(old.item_ids)
    init = json.dumps(str(tmp_path / "old"))
    cfg = feature_config(model, grown, f"train.init_from={init}")
    training = setup(new_ds, cfg, torch.device("cpu"))
    ids_old = old.model.item_emb.ids.weight  # type: ignore[union-attr]
    ids_new = training.model.item_emb.ids.weight  # type: ignore[union-attr]
    for r, item in enumerate(new_ds.item_ids, start=1):
        if item <= 40:  # a known item keeps its row, wherever it now is
            assert torch.equal(ids_new[r], ids_old[old.item_ids.index(item) + 1])
        else:  # a new one: the row of a known item of its genre (its nearest by features)
            match = [i for i in range(1, 41) if torch.equal(ids_new[r], ids_old[i])]
            assert match and all(old.item_ids[i - 1] % N_GENRES == item % N_GENRES for i in match)
    if model == "bert4rec":  # [MASK] keeps its row, now after 44 items
        assert torch.equal(ids_new[45], ids_old[41])
    # and the run trains from there; without item features the same start is refused
    fit(new_ds, cfg, tmp_path / "new", progress=False)
    plain = load_config(RunConfig, None, [f'model="{model}"', f"train.init_from={init}"])
    with pytest.raises(ConfigError, match="trained on other items"):
        fit(new_ds, plain, tmp_path / "refused", progress=False)
