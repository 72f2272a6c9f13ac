"""Item features: reading an items table (each bad table one line), encoding each feature kind
(hand-computed values), the run file's round trip, the item tower (features in the scores, id
dropout, items added without changing the others' scores) and the cold-item protocol's ranks."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.data.ids import IdCodec
from seqrec.data.item_features import ItemEncoder, items_file_bytes, load_items_file
from seqrec.data.items_table import Feature, parse_features, read_items_table
from seqrec.errors import DataError
from seqrec.experiments.cold_items import ColdSplit, rank_targets
from seqrec.models.bert4rec import BERT4Rec
from seqrec.models.gru4rec import GRU4Rec
from seqrec.models.lrurec import LRURec, LRURecConfig
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.models.tower import ItemTower, attach_item_features


def _table() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item": [10, 20, 30, 40],
            "genres": ["Action|Comedy", "Comedy", None, "Drama|Action"],
            "year": [1990.0, 2000.0, None, 1995.0],
            "title": ["red dog", "blue cat", "red cat", "red dog"],
            "vec": [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [2.0, 2.0]],
        }
    )


FEATURES = parse_features("genres:categories,year:number,title:text,vec")


def _encoder() -> tuple[pl.DataFrame, ItemEncoder]:
    df, kinds = read_items_table(_table(), features=FEATURES)
    return df, ItemEncoder.fit(df, kinds, text_dim=2)


# ---------------------------------------------------------------------------- reading


def test_kinds_are_read_from_the_columns_types_unless_named() -> None:
    table = _table().with_columns(pl.Series("brand", ["acme", "acme", "zeta", None]))
    _, kinds = read_items_table(table, features=parse_features("genres,year,title,vec,brand"))
    # titles: mostly distinct, with spaces -> text; a brand: one word, repeated -> a category
    assert [f.kind for f in kinds] == ["categories", "number", "text", "vector", "category"]
    _, kinds = read_items_table(_table(), features=parse_features({"title": "category"}))
    assert kinds == (Feature("title", "category"),)


def test_feature_names_and_kinds_are_checked() -> None:
    with pytest.raises(DataError, match="unknown kind 'colour'"):
        parse_features("genres:colour")
    with pytest.raises(DataError, match="year: named twice"):
        parse_features("year,year:number")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.drop("year"), r"items table: no column year; it has item, genres, title"),
        (lambda t: t.with_columns(pl.Series("item", [10, 20, 20, 40])), r"item 20 has 2 rows"),
        (
            lambda t: t.with_columns(pl.Series("vec", [[1.0, 0.0], [0.0], [0.5, 0.5], [2.0, 2.0]])),
            r"row 1: vec has 1 numbers, row 0 has 2",
        ),
        (
            lambda t: t.with_columns(
                pl.Series("vec", [[1.0, 0.0], [0.0, 1.0], [float("nan"), 0.5], [2.0, 2.0]])
            ),
            r"row 2: vec holds a NaN",
        ),
        (
            lambda t: t.with_columns(pl.Series("year", ["1990", "x", None, "1995"])),
            r"row 1: year = 'x' is not a number",
        ),
        (lambda t: t.with_columns(pl.Series("item", [10, None, 30, 40])), r"row 1: missing item"),
        # infinite or overflowing numbers: every score reading them would be NaN
        (
            lambda t: t.with_columns(pl.Series("year", [1990.0, float("inf"), None, 1995.0])),
            r"row 1: year = inf is not a finite number within ±1e\+15 \(kind number; leave",
        ),
        (
            lambda t: t.with_columns(pl.Series("year", ["1990", "1995", "-1e308", None])),
            r"row 2: year = '-1e308' is not a finite number",
        ),
        (
            lambda t: t.with_columns(pl.Series("year", ["1990", "Infinity", None, "1995"])),
            r"row 1: year = 'Infinity' is not a finite number",
        ),
        # ids as a log's are checked: a list or float id column is one line, not polars' error
        (
            lambda t: t.with_columns(pl.Series("item", [[1], [2], [3], [4]])),
            r"column 'item' is List\(Int64\), expected integer or text ids",
        ),
        (
            lambda t: t.with_columns(pl.Series("item", [1.5, 2.0, 3.0, 4.0])),
            r"column 'item' is Float64, expected integer or text ids \(cast it to integers first\)",
        ),
        # a cell of more values than an item can have: the tower would embed them all at once
        (
            lambda t: t.with_columns(pl.Series("genres", ["a", "|".join(["g"] * 2000), "b", "c"])),
            r"row 1: genres holds 2,000 values, over the 1,024 an item can have",
        ),
    ],
)
def test_a_bad_items_table_is_one_line(change: object, message: str) -> None:
    with pytest.raises(DataError, match=message) as err:
        read_items_table(change(_table()), features=FEATURES)  # type: ignore[operator]
    assert "\n" not in str(err.value)


def test_items_of_the_log_without_a_row_are_counted_and_named() -> None:
    df, enc = _encoder()
    with pytest.raises(DataError, match=r"2 of 4 items have no row \(7, 8\)"):
        enc.encode(df, [10, 7, 20, 8])


def test_a_file_is_read_like_a_frame(tmp_path: object) -> None:

    path = Path(str(tmp_path)) / "items.csv"
    _table().drop("vec").write_csv(path)
    df, kinds = read_items_table(path, features=parse_features("genres,year"))
    assert df.get_column("item").to_list() == [10, 20, 30, 40]
    movies = Path(str(tmp_path)) / "movies.dat"
    movies.write_bytes(
        "1::Toy Story (1995)::Animation|Comedy\n2::Caf\xe9 (1990)::Drama\n".encode("latin-1")
    )
    df, _ = read_items_table(movies, features=parse_features("title,genres"))
    assert df.row(1) == (2, "Café (1990)", "Drama")
    with pytest.raises(DataError, match="no such file"):
        read_items_table(Path(str(tmp_path)) / "nope.csv")


# ---------------------------------------------------------------------------- encoding


def test_each_kind_is_encoded_as_computed_by_hand() -> None:
    df, enc = _encoder()
    f = enc.encode(df, [30, 10, 40, 20])  # rows 1..4 in this order
    # categories sorted: Action 1, Comedy 2, Drama 3; row 0 and a missing value: none
    assert enc.categories["genres"] == ["Action", "Comedy", "Drama"]
    assert f.codes[0].tolist() == [[0, 0], [0, 0], [1, 2], [3, 1], [2, 0]]
    # year: mean 1995, std sqrt(50/3) over the three present; missing -> 0 with its flag
    std = math.sqrt(((1990 - 1995) ** 2 + (2000 - 1995) ** 2 + 0) / 3)
    assert f.dense[:, 0] == pytest.approx([0, 0, -5 / std, 0, 5 / std], abs=1e-6)
    assert f.dense[:, 1].tolist() == [0, 1, 0, 0, 0]
    # the vector as given (after the two text columns)
    assert f.dense[:, 4:].tolist() == [[0, 0], [0.5, 0.5], [1, 0], [2, 2], [0, 1]]
    text = f.dense[:, 2:4]
    assert np.allclose(np.linalg.norm(text[1:], axis=1), 1.0, atol=1e-5)  # unit length
    assert np.allclose(text[2], text[3])  # "red dog" twice: the same vector
    assert not np.allclose(text[2], text[4])
    assert enc.width == 6 and f.sizes == (3,)


def test_a_new_item_is_encoded_with_the_catalogues_encoder() -> None:
    df, enc = _encoder()
    new = pl.DataFrame(
        {
            "item": [99],
            "genres": ["Comedy|Horror"],
            "year": [2010.0],
            "title": ["red dog"],
            "vec": [[0.0, 0.0]],
        }
    )
    table, _ = read_items_table(new, features=FEATURES)
    f = enc.encode(table, [99])
    assert f.codes[0].tolist() == [[0], [2]]  # Horror was not in the catalogue: no code
    old = enc.encode(df, [10])
    assert np.allclose(f.dense[1, 2:4], old.dense[1, 2:4])  # the same title, the same vector


def test_the_items_file_round_trips() -> None:
    df, enc = _encoder()
    f = enc.encode(df, [10, 20, 30, 40])
    enc2, f2 = load_items_file(items_file_bytes(enc, f), "items.npz")
    assert (
        enc2.describe()
        == enc.describe()
        == "genres: categories (3 values), year: number, title: text (2 dims), "
        "vec: vector (2 numbers)"
    )
    assert np.array_equal(f2.dense, f.dense) and np.array_equal(f2.codes[0], f.codes[0])
    assert np.array_equal(enc2.encode(df, [40]).dense, enc.encode(df, [40]).dense)
    with pytest.raises(DataError, match="items.npz: damaged"):
        load_items_file(b"not a file", "items.npz")


# ---------------------------------------------------------------------------- the tower


def _features(n: int = 4):  # type: ignore[no-untyped-def]
    df, enc = _encoder()
    return enc, enc.encode(df, [10, 20, 30, 40][:n])


def test_an_items_vector_is_its_id_plus_its_features() -> None:
    _, f = _features()
    torch.manual_seed(0)
    tower = ItemTower(torch.nn.Embedding(5, 8, padding_idx=0), f)
    tower.eval()
    with torch.no_grad():
        tower.ids.weight[1:].zero_()
    # items 1 (id 10) and 4 (id 40) share the title; their genres and vectors differ
    w = tower.weight
    assert torch.equal(w[0], torch.zeros(8))  # padding stays zero
    assert torch.allclose(tower(torch.tensor([[2, 0]])), w[[2, 0]][None])
    same = tower.feature_vectors()
    assert torch.allclose(w, same)  # with the ids zeroed, the features alone
    with torch.no_grad():
        tower.cats[0].weight.zero_()
        tower.dense.weight.zero_()  # type: ignore[union-attr]
    assert torch.count_nonzero(tower.weight) == 0


def test_a_batch_larger_than_the_catalogue_gathers_the_same_vectors_and_gradients() -> None:
    _, f = _features()
    torch.manual_seed(0)
    tower = ItemTower(torch.nn.Embedding(5, 8, padding_idx=0), f)
    ids = torch.tensor([[1, 4, 4, 0], [2, 3, 1, 1]])  # 8 positions, 5 rows: the whole table
    big = tower(ids)
    big.square().sum().backward()
    grads = [p.grad.clone() for p in tower.parameters()]  # type: ignore[union-attr]
    tower.zero_grad()
    rows = torch.cat([tower(ids[i]) for i in range(2)])  # 4 positions each: their own rows
    rows.square().sum().backward()
    torch.testing.assert_close(big.reshape(8, 8), rows)
    for g, p in zip(grads, tower.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_id_dropout_trains_with_the_unknown_id_and_scores_with_each_items_own() -> None:
    _, f = _features()
    tower = ItemTower(torch.nn.Embedding(5, 4, padding_idx=0), f, id_dropout=1.0)
    assert tower.unknown is not None
    tower.train()
    ids = torch.tensor([1, 2, 3])
    expected = tower.unknown + tower.feature_vectors(ids)
    assert torch.allclose(tower(ids), expected)  # p = 1: the id is always the unknown one
    tower.eval()
    assert torch.allclose(tower(ids), expected)  # and in scoring too: no id was trained
    half = ItemTower(torch.nn.Embedding(5, 4, padding_idx=0), f, id_dropout=0.25)
    torch.manual_seed(0)
    dropped = half(ids.repeat(100))  # training: about a quarter of them the unknown id
    unknown = torch.isclose(dropped, half.unknown + half.feature_vectors(ids.repeat(100)))
    assert 50 < int(unknown.all(1).sum()) < 100  # of 300: 75 expected
    half.eval()
    e = half.ids(ids)
    assert torch.allclose(half(ids), e + half.feature_vectors(ids))  # scoring: its own id
    # the table scoring reuses (no gradients: cached) is the same expectation
    with torch.no_grad():
        cached = half.weight
        assert torch.allclose(cached[1:4], half(ids))
        assert half.weight is cached  # computed once while no parameter changes


def _model(kind: str, n: int) -> torch.nn.Module:
    if kind == "sasrec":
        return SASRec(n, SASRecConfig(d_model=8, max_len=5, shared_embedding=False))
    if kind == "bert4rec":
        from seqrec.models.bert4rec import BERT4RecConfig

        return BERT4Rec(n, BERT4RecConfig(d_model=8, max_len=5, n_heads=2))
    if kind == "lrurec":
        return LRURec(n, LRURecConfig(d_model=8, max_len=5))
    from seqrec.models.gru4rec import GRU4RecConfig

    return GRU4Rec(n, GRU4RecConfig(d_model=8, hidden=8, max_len=5))


@pytest.mark.parametrize("kind", ["sasrec", "bert4rec", "lrurec", "gru4rec"])
def test_added_items_leave_the_others_scores_as_they_were(kind: str) -> None:
    enc, f = _features(3)
    torch.manual_seed(0)
    model = _model(kind, 3)
    attach_item_features(model, f, 0.0)
    with torch.no_grad():  # biases that differ, so that the added one's is checked
        for name, _ in model.item_biases:  # type: ignore[attr-defined]
            getattr(model, name).copy_(torch.arange(getattr(model, name).numel()).float())
        for table in model.item_tables:  # type: ignore[attr-defined]
            tower = getattr(model, table)
            tower.cats[0].weight.zero_()  # the genres alone tell items apart, one-hot
            tower.cats[0].weight[:4, :4] = torch.eye(4)
            tower.dense.weight.zero_()
    model.eval()
    histories = torch.tensor([[0, 1, 2], [3, 2, 1]])
    before = model.score(histories)  # type: ignore[operator]
    df, _ = read_items_table(_table(), features=FEATURES)
    model.add_items(enc.encode(df, [40]))  # type: ignore[operator]
    after = model.score(histories)  # type: ignore[operator]
    assert model.n_items == 4 and after.shape == (2, 5)
    assert torch.allclose(before, after[:, :4], atol=1e-5)
    assert torch.isfinite(after[:, 4]).all()
    # item 40 (Drama|Action) is nearest to item 10 (Action|Comedy): cosine 1/2, the others 0
    for name, first in model.item_biases:  # type: ignore[attr-defined]
        bias = getattr(model, name)
        assert bias[first + 3].item() == bias[first].item() != bias[first + 1].item()


def test_an_added_item_takes_the_id_of_its_nearest_trained_items() -> None:
    enc, f = _features(3)
    tower = ItemTower(torch.nn.Embedding(4, 4, padding_idx=0), f)
    with torch.no_grad():
        tower.cats[0].weight.copy_(torch.eye(4))  # genres alone tell items apart
        tower.dense.weight.zero_()  # type: ignore[union-attr]
        tower.ids.weight.copy_(torch.arange(16.0).view(4, 4))
    df, _ = read_items_table(_table(), features=FEATURES)
    new = enc.encode(df, [20])  # Comedy, like item 1 (Action|Comedy) and item 2 (Comedy)
    one = copy.deepcopy(tower)
    tower.add_rows(new, at=4, neighbours=2)
    assert torch.equal(tower.ids.weight[4], tower.ids.weight[[1, 2]].mean(0))
    one.add_rows(new, at=4)  # the default: the nearest item's own id (item 2: Comedy alone)
    assert torch.equal(one.ids.weight[4], one.ids.weight[2])
    assert tower.codes_0.shape[0] == 5 and tower.dense_values.shape[0] == 5  # type: ignore[union-attr]


def test_a_model_without_item_features_adds_no_items() -> None:
    enc, f = _features(3)
    with pytest.raises(TypeError, match="trained with item features"):
        SASRec(3, SASRecConfig(d_model=8, max_len=5)).add_items(f)


# ------------------------------------------------------------------ the cold-item protocol


def test_cold_ranks_by_hand() -> None:
    # items 1..5; 4 and 5 are cold. Scores for every history: item i scores s[i]
    s = torch.tensor([0.0, 5.0, 4.0, 3.0, 3.0, 1.0])
    split = ColdSplit(
        cold=["d", "e"],
        log=pl.DataFrame(),
        users=["u", "v", "w"],
        histories=[["a"], [], ["b"]],
        targets=["d", "c", "e"],
    )
    items = IdCodec(["a", "b", "c", "d", "e"])
    out = rank_targets(split, items, lambda h: s[None, :].expand(len(h), -1).clone(), ks=(1, 3))
    # u: target d (3.0) after history a; above: b; tied: c -> rank 1 or 2, each half
    # w: target e (1.0) after history b; above: a, c, d -> rank 3
    assert out["cold"]["users"] == 2
    assert out["cold"]["hr@1"] == 0.0
    assert out["cold"]["hr@3"] == pytest.approx((1.0 + 0.0) / 2)
    ndcg_u = (1 / math.log2(3) + 1 / math.log2(4)) / 2
    assert out["cold"]["ndcg@3"] == pytest.approx(ndcg_u / 2)
    # v: warm target c (3.0), no history; above: a, b; tied: d -> rank 2 or 3
    assert out["warm"]["hr@3"] == pytest.approx(0.5) and out["warm"]["hr@1"] == 0.0
    # among the cold items: u's d ties with nothing cold, w's e is below d
    assert out["cold_among_cold"]["hr@1"] == pytest.approx(0.5)
    assert out["cold_among_cold"]["random_hr@1"] == pytest.approx(0.5)
    # random over the catalogue: u has 4 candidates, w has 4: 3 / 4 at k = 3
    assert out["cold"]["random_hr@3"] == pytest.approx(0.75)


def test_a_feature_named_like_the_id_column_is_one_line() -> None:
    for features, item_col in (("item:number", "item"), ("sku,genres", "sku"), ("item", "sku")):
        table = _table().with_columns(pl.col("item").alias("sku"))
        with pytest.raises(DataError, match=r"is the item id column, not a feature"):
            read_items_table(table, item_col=item_col, features=parse_features(features))


def test_an_items_file_is_looked_at_before_it_is_read(tmp_path: Path) -> None:
    """A sparse file of gigabytes, a FIFO or a device is one line, unread."""
    import os

    huge = tmp_path / "items.csv"
    with open(huge, "wb") as f:
        f.truncate(3 << 30)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, message in ((huge, r"bound"), (fifo, r"not a regular file|FIFO")):
        with pytest.raises(DataError, match=message) as err:
            read_items_table(path, features=parse_features("genres"))
        assert "\n" not in str(err.value)


def test_a_prepared_folders_items_file_is_looked_at_first(tmp_path: Path) -> None:
    from seqrec.data.prepared_items import read_prepared_items

    (tmp_path / "items.npz").symlink_to("/dev/zero")
    with pytest.raises(DataError, match="items.npz"):
        read_prepared_items(tmp_path)


def test_the_encoder_is_fitted_on_the_logs_items_only() -> None:
    """A table of many products for a log of a few: the text encoder learns the few's words."""
    from seqrec.data.prepared_items import encode_items
    from seqrec.data.settings import ItemsConfig

    n = 5000
    table = pl.DataFrame(
        {"item": list(range(n)), "title": [f"word{i} other{i} thing{i}" for i in range(n)]}
    )
    cfg = ItemsConfig(features=("title:text",), text_dim=4)
    encoded = encode_items(cfg, [3, 7, 11], table)
    assert encoded is not None
    encoder, features = encoded
    assert features.n_rows == 4
    fitted = encoder.text["title"]
    whole = ItemEncoder.fit(table, [Feature("title", "text")], text_dim=4).text["title"]
    # the three titles' terms only: a few dozen buckets, where the whole table has thousands
    assert len(fitted.idf) < 100 < 5000 < len(whole.idf)  # type: ignore[union-attr]


def test_item_features_are_weighed_before_a_tower_embeds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from seqrec.config import default_config
    from seqrec.data.item_features import ItemFeatures
    from seqrec.errors import ConfigError
    from seqrec.training.checkpoint import build_model
    from seqrec.training.sizes import check_item_features

    n, slots, width = 100, 1000, 64
    features = ItemFeatures(
        (np.zeros((n + 1, slots), np.int64),), (5,), np.zeros((n + 1, 0), np.float32)
    )
    # by hand: codes (101 x 1,000) x (8 + 4 x 64) bytes, and the vectors they are summed into
    want = (n + 1) * slots * (8 + 4 * width) + 2 * (n + 1) * width * 4
    assert check_item_features(features, width) == want
    monkeypatch.setenv("SEQREC_MAX_MODEL_BYTES", str(want - 1))
    cfg = default_config("sasrec")
    cfg = cfg.replace_section("sasrec", d_model=width)
    with pytest.raises(
        ConfigError, match=r"100 items' features ask for 25\.5 MiB \(up to 1,000 values"
    ):
        build_model(cfg, n, 0, features)
