"""HSTU's time bias (models/hstu.py, `hstu.time_bias`) and the timestamps it reads, end to end: the
log's times kept with the prepared sequences (and none where the log has none), the buckets of
the time between query and key by hand, the training batches' and evaluation's times, and every
way a trained model of time is asked for recommendations (library, estimator, CLI, HTTP), each
of which needs the histories' times and refuses, in one line, to go without them."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.config import RunConfig, load_config
from seqrec.data.batches import NextItemSampler
from seqrec.data.prepare import has_timestamps, prepare
from seqrec.data.preprocess import Sequences
from seqrec.data.settings import DataConfig
from seqrec.errors import ConfigError, SeqrecError
from seqrec.evaluation.protocols import evaluate
from seqrec.models.hstu import HSTU, HSTUConfig, time_buckets
from seqrec.serving.batching import MicroBatcher
from seqrec.serving.recommender import Recommender
from seqrec.training.fit import fit

SMALL = ["hstu.d_model=8", "hstu.d_qk=4", "hstu.d_v=4", "hstu.max_len=12", "hstu.dropout=0.0"]


def _frame() -> pl.DataFrame:
    """Two users; user "a"'s times out of row order (the sort puts item 11 first)."""
    return pl.DataFrame(
        {
            "user": ["a", "a", "a", "a", "b", "b", "b"],
            "item": [10, 11, 12, 13, 10, 12, 11],
            "timestamp": [5, 3, 9, 20, 1, 2, 3],
        }
    )


def test_the_logs_times_are_kept_with_its_sequences_and_its_split(tmp_path: Path) -> None:
    ds = prepare(_frame(), out=tmp_path / "p", progress=False)
    seqs = ds.sequences
    assert seqs.times is not None
    assert seqs.items.tolist() == [2, 1, 3, 4, 1, 3, 2]  # items 10..13 are 1..4
    assert seqs.times.tolist() == [3, 5, 9, 20, 1, 2, 3]
    split = ds.split
    assert split.train.times is not None and split.train.times.tolist() == [3, 5, 1]
    assert split.test.histories.times is not None
    assert split.test.histories.times.tolist() == [3, 5, 9, 1, 2]
    assert split.valid.target_times is not None and split.valid.target_times.tolist() == [9, 2]
    assert split.test.target_times is not None and split.test.target_times.tolist() == [20, 3]
    taken = split.test.take(np.array([1]))
    assert taken.target_times is not None and taken.target_times.tolist() == [3]
    # rows in time order without a time column: the row order is no time, none is kept
    assert (
        prepare(_frame(), out=tmp_path / "q", progress=False, time_col=None).sequences.times is None
    )


def test_which_files_have_real_timestamps() -> None:
    with_col, without = DataConfig(), DataConfig(time_col=None)
    assert has_timestamps("movielens-dat", without)  # its own column, whatever the setting
    assert has_timestamps("csv", with_col) and not has_timestamps("csv", without)
    assert not has_timestamps("user-item", with_col)  # the papers' files: line order only


def test_time_buckets_by_hand() -> None:
    # keys at 0, 10, 100; the queries' next items at 10, 100, and the last query at 1000
    times = torch.tensor([[0, 10, 100, 1000]])
    got = time_buckets(times, 128)[0]
    # floor(ln(max(|t_q - t_k|, 1)) / 0.301)
    want = [
        [math.floor(math.log(10) / 0.301), 0, math.floor(math.log(90) / 0.301)],
        [math.floor(math.log(100) / 0.301), math.floor(math.log(90) / 0.301), 0],
        [math.floor(math.log(g) / 0.301) for g in (1000, 990, 900)],
    ]
    assert got.tolist() == want == [[7, 0, 14], [15, 14, 0], [22, 22, 22]]
    assert time_buckets(times, 20)[0, 2].tolist() == [20, 20, 20]  # at most n_buckets


def _time_model(seed: int = 0) -> HSTU:
    torch.manual_seed(seed)
    cfg = HSTUConfig(d_model=8, n_layers=2, d_qk=4, d_v=4, max_len=8, dropout=0.0, time_bias=True)
    model = HSTU(12, cfg).eval()
    with torch.no_grad():
        for layer in model.layers:
            assert layer.time_w is not None
            layer.time_w.normal_(0.0, 1.0)  # large enough to show
    return model


def test_a_layer_adds_the_weight_of_each_pairs_time_bucket() -> None:
    """One layer, one head, written out: the position bias and the time weight of the bucket of
    (query i's next item's time - key j's time) added before the SiLU."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    cfg = HSTUConfig(d_model=8, n_layers=1, d_qk=3, d_v=4, max_len=6, dropout=0.0, time_bias=True)
    model = HSTU(12, cfg).eval()
    layer = model.layers[0]
    assert layer.rab is not None and layer.time_w is not None
    with torch.no_grad():
        layer.time_w.normal_(0.0, 1.0)
    ids, times = torch.tensor([[4, 9, 2]]), torch.tensor([[0, 10, 100, 1000]])
    buckets = [[7, 0, 14], [15, 14, 0], [22, 22, 22]]  # test_time_buckets_by_hand
    with torch.no_grad():
        e = model.item_emb.weight[ids[0]] * math.sqrt(8) + model.pos_emb.weight[:3]
        mixed = F.silu(F.layer_norm(e, (8,), eps=1e-6) @ layer.uvqk)
        u, v, q, k = mixed[:, :4], mixed[:, 4:8], mixed[:, 8:11], mixed[:, 11:14]
        out = torch.zeros(3, 4)
        for i in range(3):
            for j in range(i + 1):
                bias = layer.rab[5 + j - i] + layer.time_w[buckets[i][j]]
                out[i] += F.silu(q[i] @ k[j] + bias) / 6 * v[j]
        want = e + layer.out(u * F.layer_norm(out, (4,), eps=1e-6))
        assert torch.allclose(model(ids, times=times)[0], want, atol=1e-5)


def test_times_move_the_output_and_padding_does_not() -> None:
    model = _time_model()
    with torch.no_grad():
        short = model(torch.tensor([[4, 9, 2]]), times=torch.tensor([[0, 10, 100, 1000]]))
        padded = model(
            torch.tensor([[0, 0, 4, 9, 2]]), times=torch.tensor([[0, 0, 0, 10, 100, 1000]])
        )
        later = model(torch.tensor([[4, 9, 2]]), times=torch.tensor([[0, 10, 100, 10**8]]))
        last = model.user_vector(
            torch.tensor([[4, 9, 2]]), times=torch.tensor([[0, 10, 100, 1000]])
        )
    assert torch.allclose(padded[:, 2:], short, atol=1e-5)
    assert torch.allclose(last, short[:, -1], atol=1e-5)
    assert torch.allclose(later[:, :2], short[:, :2], atol=1e-5)  # their next items: unchanged
    assert not torch.allclose(later[:, 2], short[:, 2], atol=1e-3)  # the query time: read
    with pytest.raises(ValueError, match=r"hstu\.time_bias reads `times` \(B, L \+ 1\)"):
        model(torch.tensor([[4, 9, 2]]))
    with pytest.raises(ValueError, match="score it with `times`"):
        model.score(torch.tensor([[4, 9, 2]]))


def test_a_training_batch_holds_its_inputs_times_and_its_last_targets() -> None:
    train = Sequences.from_lists(
        [[1, 2, 3, 4], [2, 3]], n_items=6, times=[[10, 20, 30, 40], [5, 6]]
    )
    sampler = NextItemSampler(train, max_len=8, batch_size=2, times=True)
    batch = next(iter(sampler.epoch(0)))
    by_row = {tuple(r): t for r, t in zip(batch.inputs.tolist(), batch.times.tolist(), strict=True)}
    # inputs s_1..s_{T-1}, left-padded to the batch's width 3; times of those, then s_T's
    assert by_row[(1, 2, 3)] == [10, 20, 30, 40]
    assert by_row[(0, 0, 2)] == [0, 0, 5, 6]
    assert batch.model_inputs()["times"] is batch.times
    with pytest.raises(ValueError, match="timestamps"):
        NextItemSampler(Sequences.from_lists([[1, 2]], n_items=4), max_len=4, times=True)


class _Recorder:
    """A scorer of time that records the times evaluation gives it."""

    max_len = None
    uses_times = True

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def score(self, histories: torch.Tensor, users: Any = None, times: Any = None) -> torch.Tensor:
        self.seen += times.tolist()
        return torch.zeros(histories.shape[0], 5)


def test_evaluation_gives_each_history_its_times_and_its_targets(tmp_path: Path) -> None:
    ds = prepare(_frame(), out=tmp_path / "p", progress=False)
    scorer = _Recorder()
    evaluate(scorer, ds.split.test, protocols=["full"])
    # rows in length order, padded to the longest (3 items): the items' times, then the target's
    assert sorted(scorer.seen) == [[0, 1, 2, 3], [3, 5, 9, 20]]


def _cfg(*more: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            'model="hstu"',
            *SMALL,
            "train.max_epochs=2",
            "train.lr=5e-3",
            "train.threads=1",
            "train.n_negatives=8",
            *more,
        ],
    )


@pytest.fixture(scope="module")
def time_run(tiny_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = _cfg("hstu.time_bias=true")
    root = tmp_path_factory.mktemp("time")
    ds = prepare(tiny_runs["data"], data_cfg=cfg.data, eval_cfg=cfg.eval, out=root / "prepared")
    return fit(ds, cfg, root / "run", progress=False).run_dir


def test_a_log_without_times_or_packed_rows_is_refused_before_training(tmp_path: Path) -> None:
    from seqrec.training.validation import validate

    ds = prepare(_frame(), out=tmp_path / "p", progress=False, time_col=None)
    with pytest.raises(ConfigError, match=r"hstu\.time_bias: .* has no timestamps"):
        fit(ds, _cfg("hstu.time_bias=true"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="next_item.pack must be false"):
        validate(_cfg("hstu.time_bias=true", "next_item.pack=true"))


def test_a_model_of_time_recommends_with_times_and_refuses_without(time_run: Path) -> None:
    rec = Recommender.from_run(time_run)
    assert rec.model.uses_times
    history = rec.item_ids[:4]
    times = [100, 200, 300, 400]
    once = rec.recommend_batch([history], k=5, times=[times], at=[1000])
    again = rec.recommend_batch([history], k=5, times=[times], at=[1000])
    assert once == again
    later = rec.recommend_batch([history], k=5, times=[times], at=[10**9])
    assert [s for _, s in later[0]] != pytest.approx([s for _, s in once[0]], abs=1e-4)
    with pytest.raises(SeqrecError, match="reads when each item happened"):
        rec.recommend(history, k=5)
    with pytest.raises(ValueError, match="history 0: 3 times for 4 items"):
        rec.recommend_batch([history], k=5, times=[times[:3]])
    for bad in ([1.5, 2, 3, 4], [1, 2, 3, 2**63 + 5]):
        with pytest.raises(ValueError, match="history 0's times: expected whole seconds"):
            rec.recommend_batch([history], k=5, times=[bad])
    # an unknown item is dropped with its time: the same answer as the history without it
    if rec.unknown == "drop":
        with_unknown = rec.recommend_batch(
            [[*history[:2], "nope", *history[2:]]], k=5, times=[[100, 200, 250, 300, 400]], at=1000
        )
        assert with_unknown == once
    # a user of the training data: their own times, and `at` as given
    assert rec.dataset is not None
    user = rec.dataset.user_ids[0]
    assert rec.recommend_user(user, k=3, at=10**9) == rec.recommend_user(user, k=3, at=10**9)
    assert rec.recommend_user(user, k=3, at=10**9) != rec.recommend_user(user, k=3, at=10)


def test_the_estimator_and_the_cli_pass_the_times(time_run: Path, tmp_path: Path) -> None:
    from seqrec.cli import main
    from seqrec.estimator import load

    model = load(time_run, device="cpu")
    rec = model.recommender_
    history = rec.item_ids[:3]
    table = model.recommend_histories([history], k=3, times=[[1, 2, 3]], at=50)
    want = rec.recommend_batch([history], k=3, times=[[1, 2, 3]], at=50)[0]
    assert table.get_column("item").to_list() == [i for i, _ in want]
    with pytest.raises(SeqrecError, match="reads when each item happened"):
        model.recommend_histories([history], k=3)
    users = model.recommend(k=2, at=50)
    assert users.height == 2 * len(model.dataset_.user_ids)
    ids = ",".join(map(str, history))
    args = [
        "recommend",
        str(time_run),
        "--history",
        ids,
        "--times",
        "1,2,3",
        "--at",
        "50",
        "-k",
        "3",
    ]
    assert main([*args, "--json"]) == 0
    assert main(["recommend", str(time_run), "--history", ids, "--times", "x"]) == 2


def test_timed_and_untimed_requests_never_share_a_batch() -> None:
    calls: list[tuple[int, bool]] = []

    def score(histories: list[Any], k: int, ex: bool, users: list[int], times: Any, at: Any) -> Any:
        calls.append((len(histories), times is None))
        return [
            [(int(h.sum()), float(a) if at else 0.0)]
            for h, a in zip(histories, at or [0] * len(histories), strict=True)
        ]

    b = MicroBatcher(score, max_size=8, wait=0.01)

    async def main() -> list[Any]:
        timed = [
            b.recommend(np.array([n]), 3, True, -1, None, (np.array([7]), 99)) for n in range(3)
        ]
        plain = [b.recommend(np.array([n]), 3, True, -1, None) for n in range(3)]
        return await asyncio.gather(*timed, *plain)

    got = asyncio.run(main())
    b.close()
    assert got == [[(n, 99.0)] for n in range(3)] + [[(n, 0.0)] for n in range(3)]
    assert sorted(calls) == [(3, False), (3, True)]


def test_the_http_service_reads_timestamps(time_run: Path) -> None:
    from seqrec.serving.service import create_app
    from test_serve import _call, _running  # a real server on a free port

    rec = Recommender.from_run(time_run)
    history = rec.item_ids[:3]
    want = [i for i, _ in rec.recommend_batch([history], k=3, times=[[1, 2, 3]], at=[50])[0]]
    with _running(create_app(rec)) as url:
        body: dict[str, Any] = {"history": history, "k": 3, "timestamps": [1, 2, 3], "at": 50}
        status, out = _call(url, "/recommend", body)
        assert status == 200 and [x["item"] for x in out["items"]] == want, out
        status, out = _call(url, "/recommend", {"history": history, "k": 3})
        assert status == 422 and "give timestamps, one per item" in out["detail"]
        status, out = _call(url, "/recommend", {"history": history, "timestamps": [1, 2]})
        assert status == 422 and "timestamps: 2 times for 3 items" in out["detail"]
        for bad in ({"timestamps": [1, 2, 10**30]}, {"timestamps": [1, 2, 3], "at": 2**62}):
            status, out = _call(url, "/recommend", {"history": history, **bad})
            assert status == 422 and "expected whole seconds within" in json.dumps(out), out
        user = {"user": rec.dataset.user_ids[0], "k": 3, "at": 50} if rec.dataset else None
        status, out = _call(url, "/recommend", user)
        assert status == 200 and len(out["items"]) == 3, out
        batch = {"histories": [history, history], "k": 3, "timestamps": [[1, 2, 3]] * 2, "at": 50}
        status, out = _call(url, "/recommend/batch", batch)
        assert status == 200 and [x["item"] for x in out["results"][1]["items"]] == want
        batch["timestamps"] = [[1, 2, 3]]
        status, out = _call(url, "/recommend/batch", batch)
        assert status == 422 and "1 lists for 2 histories" in out["detail"]


def test_a_model_of_time_is_not_exported(time_run: Path, tmp_path: Path) -> None:
    from seqrec.serving.export import export_run

    with pytest.raises(ConfigError, match="reads each history's times"):
        export_run(time_run, "torchscript", tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_a_model_without_time_ignores_times(tiny_runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(tiny_runs["sasrec"])
    history = rec.item_ids[:3]
    assert rec.recommend_batch([history], k=3, times=[[1, 2, 3]], at=[5]) == [
        rec.recommend(history, k=3)
    ]
    assert json.dumps(rec.recommend(history, k=3))  # plain answers, as before
