"""The item index (seqrec.serving.index): approximate top-k whose candidates are re-scored
exactly. On a small catalogue it agrees with exact scoring, never returns a seen or excluded
item, is a run file like the others (a tampered one refused), is not used when it holds other
weights, and `--exact` leaves it out."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.errors import ConfigError, RunError
from seqrec.serving.index import ItemIndex, candidates_wanted, weights_digest
from seqrec.serving.indexing import build_index, choose_breadth, index_if_large
from seqrec.serving.recommender import Recommender
from seqrec.training.rundir import RunDir

LIBRARIES = [  # (library, kind)
    pytest.param(
        lib,
        kind,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(lib) is None,
            reason=f"{lib} is not installed (pip install 'seqrec[ann]')",
        ),
        id=f"{lib}-{kind}",
    )
    for lib, kind in (("faiss", "ivf"), ("faiss", "hnsw"), ("usearch", "hnsw"))
]


@pytest.fixture
def run(tiny_runs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the tiny SASRec run (the shared one stays as it is)."""
    out = tmp_path / "run"
    shutil.copytree(tiny_runs["sasrec"], out)
    return out


def test_candidates_wanted_by_hand() -> None:
    assert candidates_wanted(10, 1000, seen=30, excluded=5) == 2 * 10 + 30 + 5
    assert candidates_wanted(10, 40, seen=30, excluded=5) == 40  # capped at the catalogue
    assert candidates_wanted(5, 1000, seen=0, excluded=0, oversample=3) == 15


@pytest.mark.parametrize(("library", "kind"), LIBRARIES)
def test_the_index_finds_the_exact_top_k_with_the_bias_in_the_search(
    library: str, kind: str
) -> None:
    torch.manual_seed(0)
    centres = torch.randn(30, 16) * 2  # items and histories in groups, as trained vectors are
    weight = centres[torch.randint(0, 30, (3000,))] + torch.randn(3000, 16) * 0.5
    queries = centres[torch.randint(0, 30, (100,))] + torch.randn(100, 16) * 0.5
    bias = torch.randn(3000) * 0.5
    bias[[7, 99, 2500]] = 1000.0  # three items every query's exact top 3 holds: by their bias
    index = ItemIndex.build(weight, bias, library=library, kind=kind, nprobe=64)
    found = index.search(queries, 30)
    exact = torch.topk(queries @ weight.T + bias, 10).indices.numpy() + 1  # internal ids
    recall = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)])
    assert recall >= 0.98
    # searched without the bias they would seldom be found; with it, nearly always
    assert np.mean([{8, 100, 2501} <= set(row) for row in found]) >= 0.95
    again = ItemIndex.from_bytes(index.to_bytes(), "index.bin")
    np.testing.assert_array_equal(again.search(queries, 30), found)
    assert again.digest == weights_digest(weight, bias)


@pytest.mark.parametrize(("library", "kind"), LIBRARIES)
def test_recommendations_with_the_index_are_the_exact_ones(
    library: str, kind: str, run: Path
) -> None:
    exact = Recommender.from_run(run, exact=True)
    index = build_index(exact, library=library, kind=kind, sample=50)
    assert index.recall["recall@10"] == 1.0  # 60 items: every candidate re-scored
    assert json.loads((run / "sha256.json").read_text())["index.bin"]
    rec = Recommender.from_run(run)
    assert rec.index is not None and (rec.index.library, rec.index.kind) == (library, kind)
    assert Recommender.from_run(run, exact=True).index is None
    rng = np.random.default_rng(0)
    histories = [list(rng.choice(rec.item_ids, size=n, replace=False)) for n in (3, 10, 25, 40)]
    banned = [histories[0][0], rec.item_ids[5]]
    for exclude_seen in (True, False):
        want = exact.recommend_batch(histories, k=10, exclude_seen=exclude_seen, exclude=banned)
        got = rec.recommend_batch(histories, k=10, exclude_seen=exclude_seen, exclude=banned)
        assert [[i for i, _ in r] for r in got] == [[i for i, _ in r] for r in want]
        np.testing.assert_allclose(
            [s for r in got for _, s in r], [s for r in want for _, s in r], rtol=1e-5
        )
        for history, answer in zip(histories, got, strict=True):
            ids = {i for i, _ in answer}
            assert not ids & set(banned)
            assert not exclude_seen or not ids & set(history)


@pytest.mark.parametrize(("library", "kind"), LIBRARIES)
def test_a_tampered_or_stale_index_is_not_used(
    library: str, kind: str, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = Recommender.from_run(run, exact=True)
    build_index(rec, library=library, kind=kind, sample=20)
    data = bytearray((run / "index.bin").read_bytes())
    data[-10] ^= 0xFF
    (run / "index.bin").write_bytes(bytes(data))
    # a damaged index only loses its speed: the run serves, every item scored, and says so
    assert Recommender.from_run(run).index is None
    err = capsys.readouterr().err
    assert "index.bin: its sha256 is not one this run recorded" in err and "scoring exactly" in err
    # an index of other weights (a grown or retrained model): scored exactly, and said
    torch.manual_seed(1)
    other = ItemIndex.build(torch.randn(rec.n_items, 16), None, library=library, kind=kind)
    RunDir(run).save_index(other.to_bytes())
    assert Recommender.from_run(run).index is None
    assert "built from other weights" in capsys.readouterr().err


def test_cli_index_recommend_exact_and_remove(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("faiss")
    assert main(["index", str(run), "--sample", "30"]) == 0
    out = capsys.readouterr().out
    assert "item index of 60 items (faiss hnsw, m 32, ef 200/32)" in out  # the least ef tried
    assert "recall@10 against exact scoring 1.0000 on 30 histories" in out
    rec = Recommender.from_run(run)
    history = ",".join(str(i) for i in rec.item_ids[:5])
    answers = []
    for extra in ([], ["--exact"]):
        assert main(["recommend", str(run), "--history", history, "--json", *extra]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert answers[0] == answers[1]
    assert main(["index", str(run), "--remove"]) == 0
    assert not (run / "index.bin").exists()
    assert Recommender.from_run(run).index is None
    assert main(["index", str(run), "--ef-search", "0"]) == 2
    assert "--ef-search: expected >= 1" in capsys.readouterr().err
    assert main(["index", str(run), "--nprobe", "4"]) == 2  # a setting of the other kind
    assert "--nprobe: not a setting of a hnsw index" in capsys.readouterr().err
    assert main(["index", str(run), "--kind", "ivf", "--library", "usearch"]) == 2
    assert "an ivf index is faiss's" in capsys.readouterr().err


def test_a_model_not_scored_by_a_dot_product_has_no_index(
    tmp_path: Path, tiny_runs: dict[str, Path]
) -> None:
    from seqrec.config import RunConfig, load_config
    from seqrec.data.prepare import load_prepared
    from seqrec.training.fit import fit

    ds = load_prepared(Recommender.from_run(tiny_runs["sasrec"]).run.source["prepared"])
    cfg = load_config(RunConfig, None, ['model="ncf"', "ncf.factors=8", "train.max_epochs=1"])
    fitted = fit(ds, cfg, tmp_path / "ncf", progress=False)
    with pytest.raises(ConfigError, match="ncf model's scores are not a dot product"):
        build_index(Recommender.from_run(fitted.run_dir, exact=True))


def test_a_large_catalogue_gets_its_index_when_trained(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("faiss")
    assert index_if_large(run) is None  # 60 items: below the threshold
    assert not (run / "index.bin").exists()
    monkeypatch.setattr("seqrec.serving.indexing.INDEX_MIN_ITEMS", 50)
    monkeypatch.setattr("seqrec.serving.indexing.MIN_RECALL", 1.01)  # what no index reaches
    assert index_if_large(run, progress=False) is None
    assert "under 1.01: not kept, every item is scored" in capsys.readouterr().err
    assert not (run / "index.bin").exists()
    monkeypatch.setattr("seqrec.serving.indexing.MIN_RECALL", 0.98)
    index = index_if_large(run, progress=False)
    assert index is not None and (run / "index.bin").exists()


def _breadth_trial(attr: str) -> tuple[torch.Tensor, dict[int, float], Any]:
    """Random (ungrouped: hard to search) item vectors, and a recall_of for choose_breadth
    that records each breadth (`attr` of the index) it was asked at and the recall there."""
    torch.manual_seed(0)
    weight, queries = torch.randn(4000, 16), torch.randn(200, 16)
    exact = torch.topk(queries @ weight.T, 10).indices.numpy() + 1
    tried: dict[int, float] = {}

    def recall_of(ix: ItemIndex) -> float:
        found = ix.search(queries, 10)
        hits = [len(set(f) & set(e)) for f, e in zip(found, exact, strict=True)]
        tried[getattr(ix, attr)] = sum(hits) / (10 * len(hits))
        return tried[getattr(ix, attr)]

    return weight, tried, recall_of


def test_an_ivf_index_searches_the_fewest_lists_that_reach_the_target() -> None:
    pytest.importorskip("faiss")
    weight, tried, recall_of = _breadth_trial("nprobe")
    index = ItemIndex.build(weight, None, kind="ivf", nlist=64)
    assert (index.kind, index.nlist) == ("ivf", 64)
    got = choose_breadth(index, recall_of, target=0.95)
    assert got >= 0.95 and got == tried[index.nprobe]
    assert list(tried) == [8, 12, 16, 24, 32, 48, 64][: len(tried)]
    assert index.nprobe == list(tried)[-1]
    assert len(tried) > 1 and all(tried[n] < 0.95 for n in list(tried)[:-1])  # the fewest
    assert choose_breadth(index, recall_of, target=1.01) == 1.0 and index.nprobe == 64  # capped
    assert ItemIndex.from_bytes(index.to_bytes(), "index.bin").nprobe == 64  # kept in the file


def test_a_graph_searches_the_least_ef_that_reaches_the_target() -> None:
    pytest.importorskip("faiss")
    weight, tried, recall_of = _breadth_trial("ef_search")
    index = ItemIndex.build(weight, None, m=4, ef_construction=16)  # a sparse graph: misses
    got = choose_breadth(index, recall_of, target=0.99)
    assert list(tried) == [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024][: len(tried)]
    assert index.ef_search == list(tried)[-1] and got == tried[index.ef_search]
    assert len(tried) > 1 and all(tried[e] < 0.99 for e in list(tried)[:-1])
    assert got >= 0.99 or index.ef_search == 1024


def test_seqrec_train_builds_the_index_unless_told_not_to(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("faiss")
    monkeypatch.setattr("seqrec.serving.indexing.INDEX_MIN_ITEMS", 50)  # the tiny log's 60
    small = ["--set", "sasrec.max_len=10", "--set", "sasrec.d_model=16"]
    train = ["train", "sasrec", "--data", str(tiny_runs["data"]), "--quiet", *small]
    for name, extra in (("with", []), ("without", ["--no-index"])):
        argv = [*train, "--out", str(tmp_path / name), "--set", "train.max_epochs=1", *extra]
        assert main(argv) == 0
    assert ItemIndex.from_bytes((tmp_path / "with" / "index.bin").read_bytes(), "index.bin")
    assert not (tmp_path / "without" / "index.bin").exists()


def test_an_index_file_written_before_kinds_existed_reads_as_a_graph() -> None:
    pytest.importorskip("faiss")
    torch.manual_seed(0)
    weight, queries = torch.randn(500, 8), torch.randn(20, 8)
    index = ItemIndex.build(weight, None, kind="hnsw")
    data = index.to_bytes()
    magic, rest = data[: data.index(b"\n") + 1], data[data.index(b"\n") + 1 :]
    head, _, payload = rest.partition(b"\n")
    meta = json.loads(head)
    for key in ("kind", "nlist", "nprobe"):  # what an older header lacks
        del meta[key]
    old = ItemIndex.from_bytes(magic + json.dumps(meta).encode() + b"\n" + payload, "index.bin")
    assert (old.kind, old.nlist, old.nprobe) == ("hnsw", 0, 0)
    np.testing.assert_array_equal(old.search(queries, 10), index.search(queries, 10))
    # forged headers: each refused before the payload reaches faiss (an ivf kind over a graph
    # was an AssertionError at search, an ef_search of 10^9 a bad_alloc)
    meta.update(kind="hnsw", nlist=0, nprobe=0)
    for change, message in (
        ({"kind": "lsh"}, "kind 'lsh'"),
        ({"kind": "ivf", "nlist": 4, "nprobe": 1}, "another kind of index"),
        ({"ef_search": 10**9}, "ef_search 1000000000"),
        ({"m": 2**31 - 1}, "m 2147483647"),
        ({"ef_construction": 0}, "ef_construction 0"),
        ({"n_items": 10**12}, "n_items 1000000000000"),
        ({"dim": 10**9}, "dim 1000000000"),
        ({"dim": 7}, "not of the header's width"),
        ({"nprobe": 5}, "nprobe 5"),
        ({"library": "usearch", "kind": "ivf", "nlist": 4, "nprobe": 1}, "an ivf index is faiss"),
        ({"n_items": 499}, "holds another number of items"),
    ):
        forged = magic + json.dumps({**meta, **change}).encode() + b"\n" + payload
        with pytest.raises(RunError, match=rf"index.bin: damaged \(.*{re.escape(message)}"):
            ItemIndex.from_bytes(forged, "index.bin")
    with pytest.raises(RunError, match=r"its header: 500 items, not 600"):
        ItemIndex.from_bytes(data, "index.bin", n_items=600)


def test_serve_searches_the_index_as_wide_as_told(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("fastapi")
    from seqrec.serving.service import ServeOptions, create_app

    assert main(["index", str(run), "--sample", "30", "--ef-search", "40"]) == 0
    for breadth, want in ((0, 40), (7, 7)):  # 0: as built
        rec = Recommender.from_run(run)
        create_app(rec, ServeOptions(search_breadth=breadth))
        assert rec.index is not None and rec.index.ef_search == want
    create_app(Recommender.from_run(run, exact=True), ServeOptions(search_breadth=7))
    assert "no item index in use; --search-breadth has nothing to set" in capsys.readouterr().err
    for flags, message in (
        (["--search-breadth", "-1"], "--search-breadth: expected >= 1"),
        (["--search-breadth", "8", "--exact"], "--search-breadth: --exact searches no index"),
    ):
        assert main(["serve", str(run), *flags]) == 2
        assert message in capsys.readouterr().err


def test_a_breadth_sets_the_kinds_own_setting() -> None:
    pytest.importorskip("faiss")
    torch.manual_seed(0)
    weight = torch.randn(200, 8)
    graph = ItemIndex.build(weight, None, kind="hnsw", m=8, ef_search=16)
    lists = ItemIndex.build(weight, None, kind="ivf", nlist=4, nprobe=1)
    graph.set_breadth(50)
    lists.set_breadth(3)
    assert (graph.ef_search, lists.nprobe) == (50, 3)
    lists.set_breadth(100)  # at most every list
    assert lists.nprobe == 4
    with pytest.raises(ConfigError, match="a search breadth is >= 1, got 0"):
        graph.set_breadth(0)


def test_a_huge_sparse_index_is_refused_unread_and_the_run_serves_exactly(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("faiss")
    exact = Recommender.from_run(run, exact=True)
    build_index(exact, sample=20)
    with open(run / "index.bin", "r+b") as f:  # 60 GB that take no disk (the probe's file)
        f.truncate(60 << 30)
    rec = Recommender.from_run(run)  # read whole, this was a MemoryError
    assert rec.index is None
    err = capsys.readouterr().err.strip()
    assert "index.bin" in err and "bound" in err and len(err.splitlines()) == 1
    histories = [list(exact.item_ids[:3]), list(exact.item_ids[5:9])]
    for got, want in zip(
        rec.recommend_batch(histories, k=5), exact.recommend_batch(histories, k=5), strict=True
    ):
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
