"""Recommender: top-k for any history, every policy of the module docstring, and the same
scores as evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.cli import main
from seqrec.data.prepared import load_prepared
from seqrec.evaluation.protocols import pad_histories
from seqrec.models.base import BlockScores
from seqrec.serving.recommender import Recommender, UnknownItemsError

MODELS = ["sasrec", "bert4rec"]


@pytest.fixture(scope="module", params=MODELS)
def rec(request: pytest.FixtureRequest, tiny_runs: dict[str, Path]) -> Recommender:
    return Recommender.from_run(tiny_runs[request.param])


def test_scores_equal_what_evaluation_ranks_by(rec: Recommender) -> None:
    ds = rec.dataset
    assert ds is not None
    eval_set = ds.split.eval_set("test")
    rows = np.arange(40)
    inputs = torch.from_numpy(pad_histories(eval_set.histories, rows, rec.max_len))
    expected = rec.model.score(inputs)  # type: ignore[operator]
    got = rec.scores([eval_set.histories[r] for r in rows])
    assert torch.allclose(got, expected, atol=1e-5)
    # and the ranked list is that order (history items excluded)
    history = [rec.item_ids[i - 1] for i in eval_set.histories[0]]
    top = rec.recommend(history, k=5)
    scores = expected[0].clone()
    scores[torch.from_numpy(eval_set.histories[0])] = -torch.inf
    want = torch.topk(scores, 5).indices.tolist()
    assert [item for item, _ in top] == [rec.item_ids[i - 1] for i in want]
    assert [s for _, s in top] == pytest.approx(torch.topk(scores, 5).values.tolist(), abs=1e-5)


def test_exclude_seen_and_candidates(rec: Recommender) -> None:
    history = rec.item_ids[:6]
    top = rec.recommend(history, k=rec.n_items)
    assert len(top) == rec.n_items - 6 and not {i for i, _ in top} & set(history)
    scores = [s for _, s in top]
    assert scores == sorted(scores, reverse=True)
    with_seen = rec.recommend(history, k=rec.n_items, exclude_seen=False)
    assert {i for i, _ in with_seen} == set(rec.item_ids)
    cands = rec.item_ids[3:10]  # three of them are in the history
    only = rec.recommend(history, k=10, candidates=cands)
    assert {i for i, _ in only} == set(rec.item_ids[6:10])  # fewer than k remain: 4


def test_unknown_items_are_dropped_and_counted_or_rejected(tiny_runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(tiny_runs["sasrec"])
    history = [rec.item_ids[0], "no-such-item", rec.item_ids[1], 999_999]
    before = rec.dropped
    enc = rec.encode(history)
    assert enc.unknown == ["no-such-item", 999_999] and rec.dropped == before + 2
    _same(rec.recommend(history), rec.recommend(rec.item_ids[:2]))
    strict = Recommender.from_run(tiny_runs["sasrec"], unknown="reject")
    with pytest.raises(UnknownItemsError, match="2 unknown item id"):
        strict.recommend(history)
    _same(strict.recommend(rec.item_ids[:2]), rec.recommend(rec.item_ids[:2]))
    # ids match by their text too: "1001" finds item 1001
    assert rec.encode([str(rec.item_ids[0])]).ids.tolist() == [1]


def test_empty_or_all_unknown_history_gets_the_popularity_ranking(rec: Recommender) -> None:
    ds = rec.dataset
    assert ds is not None
    counts = np.bincount(ds.split.train.items, minlength=rec.n_items + 1)[1:]
    order = np.argsort(-counts, kind="stable")[:5]
    top = rec.recommend([], k=5)
    assert [s for _, s in top] == pytest.approx(counts[order].tolist())
    assert sorted(s for _, s in top) == sorted(counts[order].tolist())
    assert rec.recommend(["unknown-1", "unknown-2"], k=5) == top


def test_long_history_keeps_its_last_max_len_items(rec: Recommender) -> None:
    assert rec.max_len is not None
    long = (rec.item_ids * 3)[: rec.max_len + 7]
    a = rec.recommend(long, k=10, exclude_seen=False)
    b = rec.recommend(long[-rec.max_len :], k=10, exclude_seen=False)
    _same(a, b)


def _same(a: list[tuple[object, float]], b: list[tuple[object, float]]) -> None:
    assert [i for i, _ in a] == [i for i, _ in b]
    assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-5)


def test_batch_equals_one_by_one_and_users(rec: Recommender) -> None:
    histories = [rec.item_ids[i : i + n] for i, n in ((0, 3), (5, 1), (2, 9))] + [[]]
    batch = rec.recommend_batch(histories, k=7)
    for got, one in zip(batch, [rec.recommend(h, k=7) for h in histories], strict=True):
        _same(got, one)  # the batch pads to its longest row: float noise only
    ds = rec.dataset
    assert ds is not None
    user = ds.user_ids[4]
    full = [ds.item_ids[i - 1] for i in ds.sequences[4]]
    _same(rec.recommend_user(user, k=5), rec.recommend(full, k=5))
    with pytest.raises(Exception, match="not in the training data"):
        rec.recommend_user("nobody")


def test_k_is_checked_and_titles_come_from_movies_dat(rec: Recommender) -> None:
    for k in (0, rec.n_items + 1):
        with pytest.raises(ValueError, match="k must be in"):
            rec.recommend([], k=k)
    item = rec.item_ids[0]
    assert rec.describe(item) == {"title": f"Movie {item} (2000)", "genres": ["Drama", "Comedy"]}


def test_popularity_is_stored_in_the_run(tiny_runs: dict[str, Path]) -> None:
    vocab = json.loads((tiny_runs["sasrec"] / "vocab.json").read_text())
    run_cfg = json.loads((tiny_runs["sasrec"] / "config.json").read_text())
    ds = load_prepared(run_cfg["source"]["prepared"])
    assert (
        vocab["popularity"] == np.bincount(ds.split.train.items, minlength=ds.n_items + 1).tolist()
    )


def test_cli_recommend_history_and_file(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tiny_runs["sasrec"])
    rec = Recommender.from_run(run)
    ids = rec.item_ids[:3]
    history = ",".join(map(str, ids)) + ",nope"
    assert main(["recommend", run, "--history", history, "-k", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dropped"] == ["nope"] and [r["rank"] for r in out["items"]] == [1, 2, 3, 4]
    assert [r["item"] for r in out["items"]] == [i for i, _ in rec.recommend(ids, k=4)]
    assert out["items"][0]["title"].startswith("Movie ")
    assert main(["recommend", run, "--history", history, "--unknown", "reject"]) == 2
    assert "1 unknown item id(s): nope" in capsys.readouterr().err
    # a file of histories: a log with user,item,timestamp (rows out of time order)
    log = tmp_path / "histories.csv"
    log.write_text(f"user,item,timestamp\na,{ids[1]},20\na,{ids[0]},10\nb,{ids[2]},5\n")
    recs = tmp_path / "recs.parquet"
    argv = ["recommend", run, "--input", str(log), "--output", str(recs), "-k", "3", "--quiet"]
    assert main(argv) == 0
    df = pl.read_parquet(recs)
    assert df.columns == ["user", "rank", "item", "score", "title"] and df.height == 6
    got_a = df.filter(pl.col("user") == "a").get_column("item").to_list()
    # integer ids stay integers (they were written as text)
    assert all(isinstance(i, int) for i in ids) and df.schema["item"] == pl.Int64
    assert got_a == [i for i, _ in rec.recommend([ids[0], ids[1]], k=3)]
    assert main(["recommend", run, "--input", str(log), "--quiet"]) == 2
    assert "needs --output" in capsys.readouterr().err


def test_titles_of_a_renumbered_user_item_file_join_through_its_map_or_are_refused(
    tmp_path: Path,
) -> None:
    """A `user item` file numbers items itself: a movies.dat given for it is joined through
    the id map beside it (file item 1 = movie 50 here), and refused without one."""
    from seqrec.errors import ConfigError
    from seqrec.serving.files import item_metadata

    data = tmp_path / "paper" / "toy.txt"
    data.parent.mkdir()
    data.write_text("1 1\n1 2\n")
    movies = tmp_path / "movies.dat"
    movies.write_bytes(b"1::GoldenEye (1995)::Action\n50::The Usual Suspects (1995)::Crime\n")
    with pytest.raises(ConfigError, match="numbers its items itself"):
        item_metadata(movies, str(data))
    (data.parent / "ml-1m.item-map.txt").write_text("1 50\n2 1\n")
    meta = item_metadata(movies, str(data))
    assert meta is not None
    assert meta["1"]["title"] == "The Usual Suspects (1995)"
    assert meta["2"]["title"] == "GoldenEye (1995)"
    # a raw log's ids are the movies' own: joined directly
    raw = tmp_path / "ratings.dat"
    raw.write_text("1::1::5::1\n")
    assert item_metadata(movies, str(raw))["1"]["title"] == "GoldenEye (1995)"  # type: ignore[index]


def test_batches_are_bounded_by_the_catalogue_and_answer_the_same(
    rec: Recommender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past a byte bound that fits a few whole rows, the catalogue is read in blocks of items
    (a block's top k merged into the running one): with a bound of 3 rows, blocks of 2
    items give the top k of the whole catalogue, with and without the seen items, within
    candidates, and for an empty history (the popularity)."""
    histories = [rec.encode(rec.item_ids[i : i + 5]).ids for i in range(0, 40, 4)]
    histories.append(np.zeros(0, dtype=np.int64))
    candidates = rec.item_ids[::3]
    want = {
        (exclude, cands is None): rec.recommend_encoded(histories, 7, exclude, candidates=cands)
        for exclude in (True, False)
        for cands in (None, candidates)
    }
    widths: list[int] = []
    real = BlockScores.blocks

    def counted(self: BlockScores, width: int) -> Any:
        for lo, block in real(self, width):
            widths.append(block.shape[1])
            yield lo, block

    monkeypatch.setattr(rec, "scores_bytes", 3 * 4 * (rec.n_items + 1))
    monkeypatch.setattr(rec, "_scores", None)  # the whole-row path is not taken
    monkeypatch.setattr(BlockScores, "blocks", counted)
    for (exclude, whole), w in want.items():
        got = rec.recommend_encoded(histories, 7, exclude, candidates=None if whole else candidates)
        for g, one in zip(got[:-1], w[:-1], strict=True):
            _same(g, one)  # the same items, scores to float rounding (other matmul shapes)
        # popularity counts tie: the same counts (which of the tied items comes first may vary)
        assert [v for _, v in got[-1]] == [v for _, v in w[-1]]
    assert max(widths) == 3 * (rec.n_items + 1) // rec.batch_size < rec.n_items
    assert sum(widths) == 4 * (rec.n_items + 1)  # each pass covers the catalogue once
