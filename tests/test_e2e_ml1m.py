"""Oracles on the real MovieLens-1M files (shared/data/README.md). Run when SEQREC_DATA_DIR points
at a folder laid out like shared/data; skipped otherwise. Nothing here is copied into the repo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.data.io import read_movielens_dat, read_user_item_txt
from seqrec.data.prepare import prepare
from seqrec.data.preprocess import preprocess
from seqrec.evaluation.protocols import evaluate_split
from seqrec.evaluation.reference import PAPER_ROWS
from seqrec.models.baselines import Popularity
from seqrec.serving.files import item_metadata

pytestmark = pytest.mark.e2e


def _map(path: Path) -> dict[int, int]:
    pairs = np.loadtxt(path, dtype=np.int64)
    return dict(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True))


@pytest.fixture(scope="module")
def paper(shared_data: Path) -> dict[int, list[int]]:
    """The papers' file as {movielens user: [movielens movies in order]}."""
    pre = preprocess(
        read_user_item_txt(shared_data / "bert4rec-paper/ml-1m.txt.gz"),
        min_user_interactions=1,
        min_item_interactions=1,
    )
    umap = _map(shared_data / "bert4rec-paper/ml-1m.user-map.txt")
    imap = _map(shared_data / "bert4rec-paper/ml-1m.item-map.txt")
    seqs, users, items = pre.sequences, pre.user_ids.to_list(), pre.item_ids.to_list()
    return {
        umap[users[u]]: [imap[items[i - 1]] for i in seqs[u].tolist()] for u in range(seqs.n_users)
    }


def test_paper_file_loaded_as_is(shared_data: Path) -> None:
    pre = preprocess(read_user_item_txt(shared_data / "bert4rec-paper/ml-1m.txt.gz"))
    s = pre.sequences
    assert (s.n_users, s.n_items, len(s.items)) == (6040, 3416, 999_611)
    assert pre.item_ids.to_list() == list(range(1, 3417))  # the paper's ids are kept


def test_five_core_gives_paper_item_sets(shared_data: Path, paper: dict[int, list[int]]) -> None:
    pre = preprocess(read_user_item_txt(shared_data / "ml-1m/interactions_time_ordered.txt.gz"))
    s = pre.sequences
    assert (s.n_items, len(s.items)) == (3416, 999_611)
    assert int(s.lengths.min()) == 18
    users, items = pre.user_ids.to_list(), pre.item_ids.to_list()
    ours = {users[u]: sorted(items[i - 1] for i in s[u].tolist()) for u in range(s.n_users)}
    assert ours == {u: sorted(v) for u, v in paper.items()}


def _raw_partial(shared_data: Path) -> pl.DataFrame:
    df = read_movielens_dat(shared_data / "ml-1m/ratings_PARTIAL_users0001-2999.dat.gz")
    keep = set(_map(shared_data / "bert4rec-paper/ml-1m.item-map.txt").values())
    return df.filter(pl.col("item").is_in(list(keep)))


def test_stable_time_sort_gives_paper_order(shared_data: Path, paper: dict[int, list[int]]) -> None:
    pre = preprocess(_raw_partial(shared_data), min_user_interactions=1, min_item_interactions=1)
    s, users, items = pre.sequences, pre.user_ids.to_list(), pre.item_ids.to_list()
    assert s.n_users == 2999
    for u in range(s.n_users):
        assert [items[i - 1] for i in s[u].tolist()] == paper[users[u]], f"user {users[u]}"


def test_sorting_ties_by_item_id_does_not(shared_data: Path, paper: dict[int, list[int]]) -> None:
    """The trap: with ties broken by item id, almost no user matches the papers' order."""
    df = _raw_partial(shared_data).sort(["user", "timestamp", "item"])
    by_user = df.group_by("user", maintain_order=True).agg(pl.col("item"))
    same = sum(items == paper[u] for u, items in by_user.iter_rows())
    assert same < 100


def test_pop_gives_the_recorded_numbers_and_both_papers_rows(shared_data: Path) -> None:
    """POP is deterministic (training counts, candidates drawn with seed 42): every metric under
    every protocol equals the value in benchmarks/results/evaluation/pop_ml1m.json to 1e-4, and
    the sampled protocols reproduce both papers' POP rows within 0.015."""
    import json

    ds = prepare(shared_data / "bert4rec-paper/ml-1m.txt.gz", progress=False)
    report = evaluate_split(ds, Popularity.fit(ds.split.train), "test")
    results = Path(__file__).resolve().parent.parent / "benchmarks/results/evaluation/pop_ml1m.json"
    recorded = json.loads(results.read_text())["metrics"]
    for protocol, values in recorded.items():
        for metric, value in values.items():
            assert report.metrics[protocol][metric] == pytest.approx(value, abs=1e-4), (
                protocol,
                metric,
            )
    for protocol in ("pop100", "uni100"):
        _, paper_row = PAPER_ROWS[("pop", protocol)]
        for metric, value in paper_row.items():
            assert report.metrics[protocol][metric] == pytest.approx(value, abs=0.015), (
                protocol,
                metric,
            )


def test_titles_of_the_papers_file_join_through_the_item_map(shared_data: Path) -> None:
    meta = item_metadata(None, str(shared_data / "bert4rec-paper" / "ml-1m.txt.gz"))
    assert meta is not None and len(meta) == 3416
    # paper item 1 is MovieLens movie 1198 (ml-1m.item-map.txt)
    assert meta["1"] == {
        "title": "Raiders of the Lost Ark (1981)",
        "genres": ["Action", "Adventure"],
    }


def test_a_given_movies_dat_joins_the_papers_file_through_its_map(shared_data: Path) -> None:
    """`recommend --items movies.dat` on a run of the papers' file: paper item 10 is MovieLens
    2858, American Beauty (the file's own number 10 is GoldenEye)."""
    meta = item_metadata(
        str(shared_data / "ml-1m" / "movies.dat"),
        str(shared_data / "bert4rec-paper" / "ml-1m.txt.gz"),
    )
    assert meta is not None and meta["10"]["title"] == "American Beauty (1999)"
