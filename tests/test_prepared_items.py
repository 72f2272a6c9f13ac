"""An items table prepared with its log (`prepare(..., items=, item_features=)`, `seqrec prepare
--items-table`): its features kept with the dataset, checked before anything is written, part of
the dataset's key, and read by a run trained on it; a sentence-embedding model as a text
feature's encoder (`items.text_encoder`), with a small model built here (no download)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.cli import main
from seqrec.config import ItemsConfig, RunConfig, load_config
from seqrec.data.item_features import ItemEncoder, items_file_bytes, load_items_file
from seqrec.data.items_table import Feature, read_items_table
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.data.prepared_items import encode_items
from seqrec.errors import ConfigError, DataError
from seqrec.training.fit import fit
from seqrec.training.rundir import RunDir
from seqrec.training.validation import validate


def _log(n_items: int = 30, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = 500
    return pl.DataFrame(
        {
            "user": rng.integers(0, 50, n),
            "item": rng.integers(0, n_items, n) + 100,  # external ids 100..
            "ts": np.arange(n),
        }
    )


def _items(n_items: int = 30) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item": np.arange(n_items) + 100,
            "genre": [f"g{i % 3}" for i in range(n_items)],
            "year": [1990.0 + i for i in range(n_items)],
        }
    )


def _run_cfg(model: str = "sasrec") -> RunConfig:
    sets = ["train.max_epochs=1", "train.eval_every=1", "train.batch_size=16"]
    if model == "sasrec":
        sets += ["sasrec.d_model=8", "sasrec.n_heads=1", "sasrec.max_len=8"]
    return load_config(RunConfig, None, [f"model={model!r}".replace("'", '"'), *sets])


def test_the_prepared_dataset_keeps_its_items_features(tmp_path: Path) -> None:
    def prepared() -> PreparedDataset:
        features = ["genre", "year:number"]
        return prepare(
            _log(), time_col="ts", items=_items(), item_features=features, out=tmp_path / "p"
        )

    ds = prepared()
    found = ds.item_features()
    assert found is not None
    encoder, features = found
    assert [str(f) for f in encoder.features] == ["genre:category", "year:number"]
    # row r is internal item r: its genre's code (1 + the value's place among g0 g1 g2)
    genres = [1 + (int(item) - 100) % 3 for item in ds.item_ids]
    assert features.codes[0][1:, 0].tolist() == genres
    assert features.codes[0][0, 0] == 0  # the padding row
    years = np.array([1990.0 + int(item) - 100 for item in ds.item_ids])
    z = (years - 2004.5) / np.std(np.arange(30.0) + 1990.0)  # standardised over the table
    np.testing.assert_allclose(features.dense[1:, 0], z, rtol=1e-5)
    # prepared again with the same table: the same folder, reused
    again = prepared()
    assert again.path == ds.path
    assert (
        prepare(_log(), time_col="ts", out=tmp_path / "q", progress=False).item_features() is None
    )


def test_another_items_table_is_another_dataset(tmp_path: Path) -> None:
    kw = {"time_col": "ts", "item_features": ["genre"], "out": tmp_path / "p", "progress": False}
    prepare(_log(), items=_items(), **kw)  # type: ignore[arg-type]
    other = _items().with_columns(pl.lit("g0").alias("genre"))
    with pytest.raises(ConfigError, match="prepared from another source or settings"):
        prepare(_log(), items=other, **kw)  # type: ignore[arg-type]
    a = prepare(_log(), time_col="ts", items=_items(), item_features=["genre"], progress=False)
    b = prepare(_log(), time_col="ts", items=other, item_features=["genre"], progress=False)
    assert a.path != b.path  # the cache: one folder per table


def test_a_bad_items_table_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "p"
    with pytest.raises(DataError, match=r"items table: 20 of 30 items have no row"):
        prepare(
            _log(),
            time_col="ts",
            items=_items().head(10),
            item_features=["genre"],
            out=out,
            progress=False,
        )
    assert not out.exists()
    with pytest.raises(DataError, match="no column colour"):
        prepare(_log(), time_col="ts", items=_items(), item_features=["colour"], out=out)
    with pytest.raises(ConfigError, match="items= and item_features= go together"):
        prepare(_log(), time_col="ts", items=_items(), out=out)
    assert not out.exists()


def test_a_run_on_the_prepared_dataset_reads_its_features(tmp_path: Path) -> None:
    ds = prepare(
        _log(),
        time_col="ts",
        items=_items(),
        item_features=["genre"],
        out=tmp_path / "p",
        progress=False,
    )
    run = fit(ds, _run_cfg(), tmp_path / "run", progress=False)
    cfg = RunDir(run.run_dir).config()
    assert cfg.items.table == str(ds.path.resolve())
    assert cfg.items.features == ("genre:category",)
    tower = run.model.item_emb  # the tower: the prepared genres, one code per row
    codes = ds.item_features()[1].codes[0]  # type: ignore[index]
    assert tower.codes_0[: ds.n_items + 1].cpu().numpy().tolist() == codes.tolist()
    stored = RunDir(run.run_dir).item_features()
    assert stored is not None
    np.testing.assert_array_equal(stored[1].codes[0], codes)
    # a model that reads no item features trains on the ids
    pop = fit(ds, _run_cfg("bpr-mf"), tmp_path / "mf", progress=False)
    assert RunDir(pop.run_dir).config().items.features == ()


def test_items_table_naming_a_prepared_folder_of_another_log(tmp_path: Path) -> None:
    ds = prepare(_log(), time_col="ts", items=_items(), item_features=["genre"], out=tmp_path / "p")
    cfg = ItemsConfig(str(ds.path), features=("genre",))
    assert encode_items(cfg, ds.item_ids) is not None
    with pytest.raises(DataError, match="the features of another log's 30 items"):
        encode_items(cfg, ds.item_ids[:-1])
    plain = prepare(_log(), time_col="ts", out=tmp_path / "q", progress=False)
    with pytest.raises(DataError, match="no prepared dataset with items"):
        encode_items(ItemsConfig(str(plain.path), features=("genre",)), plain.item_ids)


def test_cli_prepare_with_an_items_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log().write_csv(tmp_path / "log.csv")
    _items().write_csv(tmp_path / "items.csv")
    prep = tmp_path / "prep"
    args = ["prepare", "--data", str(tmp_path / "log.csv"), "--time-col", "ts", "--quiet"]
    items = ["--items-table", str(tmp_path / "items.csv"), "--item-features", "genre,year"]
    assert main([*args, *items, "--out", str(prep)]) == 0
    assert "item features genre: category (3 values), year: number" in capsys.readouterr().out
    assert (prep / "items.npz").exists()
    sets = ["train.max_epochs=1", "sasrec.d_model=8", "sasrec.max_len=8"]
    run = ["train", "sasrec", "--data", str(prep), "--out", str(tmp_path / "run"), "--quiet"]
    assert main([*run, *(a for s in sets for a in ("--set", s))]) == 0
    assert RunDir(tmp_path / "run").config().items.features == ("genre:category", "year:number")


# ----------------------------------------------------------------- sentence embeddings


def test_text_encoder_values_are_checked() -> None:
    cfg = _run_cfg()
    bad = dataclasses.replace(cfg.items, text_encoder="bert")
    with pytest.raises(ConfigError, match=r"items.text_encoder: 'bert'; expected \"hashed\""):
        validate(dataclasses.replace(cfg, items=bad))
    table, kinds = read_items_table(
        pl.DataFrame({"item": [1, 2], "title": ["a red dog", "a blue cat"]}),
        features=[Feature("title", "text")],
    )
    missing = "sentence-transformers:/no/such/model"
    with pytest.raises(DataError, match=r"^items.text_encoder sentence-transformers:/no/such/"):
        ItemEncoder.fit(table, kinds, text_encoder=missing)


def _tiny_sentence_model(folder: Path) -> Path:
    """A sentence-embedding model of random weights, saved in `folder`: a one-layer BERT over a
    word list written here, mean-pooled (what a downloaded model is, at a test's size)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    try:  # sentence-transformers 6 moved its modules
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "blue", "dog", "cat", "big"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    bert = folder / "bert"
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(bert)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(words),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=32,
    )
    BertModel(config).save_pretrained(bert)
    st = SentenceTransformer(modules=[Transformer(str(bert)), Pooling(8)])
    st.save(str(folder / "st"))
    return folder / "st"


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None,
    reason="sentence-transformers is not installed (pip install 'seqrec[text]')",
)
def test_a_sentence_embedding_model_encodes_text(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = _tiny_sentence_model(tmp_path)
    titles = ["a red dog", "a blue cat", None, "big red cat"]
    table, kinds = read_items_table(
        pl.DataFrame({"item": [1, 2, 3, 4], "title": titles}), features=[Feature("title", "text")]
    )
    encoder = ItemEncoder.fit(table, kinds, text_encoder=f"sentence-transformers:{model}")
    assert encoder.width == 8
    assert encoder.describe() == f"title: text (8 dims, {model})"
    features = encoder.encode(table, [4, 1, 3])
    expected = SentenceTransformer(str(model), device="cpu").encode(
        ["big red cat", "a red dog"], normalize_embeddings=True
    )
    np.testing.assert_allclose(features.dense[1:3], expected, atol=1e-6)
    assert not features.dense[3].any() and not features.dense[0].any()  # no text; padding
    np.testing.assert_allclose(np.linalg.norm(features.dense[1:3], axis=1), 1.0, atol=1e-6)
    # the run file keeps the model's name, not its weights: a new item is encoded by it again
    enc2, back = load_items_file(items_file_bytes(encoder, features), "items.npz")
    np.testing.assert_array_equal(back.dense, features.dense)
    np.testing.assert_allclose(enc2.encode(table, [1]).dense[1], expected[1], atol=1e-6)
