from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from seqrec.config import default_config
from seqrec.data.candidates import (
    _gumbel_top_n,
    _inverse_cdf,
    item_popularity,
    sample_negatives,
)
from seqrec.data.preprocess import Sequences, preprocess
from seqrec.data.split import EvalSet, leave_one_out
from seqrec.data.synthetic import synthetic_interactions
from seqrec.evaluation.protocols import evaluate, full_ranks, pad_histories
from seqrec.models.baselines import Popularity
from seqrec.training.checkpoint import build_model

# the module (the package's `seqrec.evaluation.protocols` is the function)
ev = importlib.import_module("seqrec.evaluation.protocols")


class TableScorer:
    """Scores from a fixed (n_users, V) table, looked up by the history's identity."""

    max_len = None

    def __init__(self, table: np.ndarray, histories: Sequences) -> None:
        self.table = torch.as_tensor(table, dtype=torch.float32)
        self.keys = {tuple(histories[u].tolist()): u for u in range(histories.n_users)}

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        rows = [self.keys[tuple(int(i) for i in h if i != 0)] for h in histories]
        return self.table[rows]


def test_pad_histories_left_pads_and_truncates() -> None:
    seqs = Sequences.from_lists([[1, 2, 3], [4], [5, 6, 7, 8]])
    assert pad_histories(seqs, np.array([0, 1, 2])).tolist() == [
        [0, 1, 2, 3],
        [0, 0, 0, 4],
        [5, 6, 7, 8],
    ]
    assert pad_histories(seqs, np.array([0, 2]), max_len=2).tolist() == [[2, 3], [7, 8]]


def test_full_ranking_excludes_history_and_counts_ties_against_target() -> None:
    # 1 user, items 1..6, history [1, 2, 3, 4] then the test target 5.
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5]], n_items=6)
    split = leave_one_out(seqs)
    #           pad   1    2    3    4    5(target) 6
    table = np.array([[9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 1.0]])
    report = evaluate(TableScorer(table, split.test.histories), split.test, protocols=["full"])
    # history items 1-4 are excluded; item 6 ties with the target and counts against it
    assert report.ranks["full"].tolist() == [1]
    table[0, 6] = 0.5
    report = evaluate(TableScorer(table, split.test.histories), split.test, protocols=["full"])
    assert report.ranks["full"].tolist() == [0]
    assert report.metrics["full"]["hr@1"] == 1.0


def test_nan_target_ranks_last() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4]], n_items=6)
    split = leave_one_out(seqs)
    table = np.array([[0, 0, 0, 0, np.nan, 0, 0]], dtype=np.float64)
    report = evaluate(TableScorer(table, split.test.histories), split.test, protocols=["full"])
    assert report.ranks["full"].tolist() == [2]  # history 1-3 excluded; both rivals (5, 6) above


def test_sampled_ranking_uses_given_negatives() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4]], n_items=8)
    split = leave_one_out(seqs)
    table = np.array([[0, 0, 0, 0, 5.0, 6.0, 5.0, 1.0, 9.0]])
    negs = np.array([[5, 6, 7, 0]])  # 0 = padding, ignored
    report = evaluate(
        TableScorer(table, split.test.histories),
        split.test,
        protocols=["uni100"],
        negatives={"uni100": negs},
    )
    assert report.ranks["uni100"].tolist() == [2]  # 5 beats it, 6 ties it, 7 is below


def test_sampled_protocol_needs_negatives() -> None:
    seqs = Sequences.from_lists([[1, 2, 3]], n_items=3)
    with pytest.raises(ValueError, match="needs the stored negatives"):
        evaluate(Popularity.fit(seqs), leave_one_out(seqs).test, protocols=["pop100"])


@pytest.mark.parametrize("n", [10, 100])  # 10: the i.i.d.-stream path; 100: the Gumbel fallback
def test_negatives_never_touch_history_and_are_distinct(n: int) -> None:
    pre = preprocess(synthetic_interactions(n_users=200, n_items=150, seed=3))
    seqs = pre.sequences
    users = leave_one_out(seqs).test.users
    for weights in (None, item_popularity(seqs)):
        negs = sample_negatives(seqs, users, n=n, weights=weights, seed=7, max_cells=3000)
        for e, u in enumerate(users):
            row = negs[e][negs[e] != 0]
            assert len(set(row.tolist())) == len(row)
            # never the validation item, the test item or any other history item
            assert not set(row.tolist()) & set(seqs[u].tolist())
            eligible = seqs.n_items - len(set(seqs[u].tolist()))
            assert len(row) == min(n, eligible)
        again = sample_negatives(seqs, users, n=n, weights=weights, seed=7, max_cells=3000)
        assert np.array_equal(negs, again)  # same seed -> same candidates


def test_a_catalogue_past_the_dense_bound_is_drawn_for_many_users_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dense fallback's bound (max_cells / catalogue rows) was also the step of the draws: a
    catalogue of ten million items drew for one user at a time."""
    pre = preprocess(synthetic_interactions(n_users=600, n_items=150, seed=3))
    seqs = pre.sequences
    users = leave_one_out(seqs).test.users
    steps: list[int] = []
    take = Sequences.take
    monkeypatch.setattr(
        Sequences, "take", lambda self, rows: steps.append(len(rows)) or take(self, rows)
    )
    for n in (10, 100):  # the stream; the fallback, in pieces of the bound (300 // 151 = 1 row)
        steps.clear()
        negs = sample_negatives(seqs, users, n=n, seed=7, max_cells=300)
        assert steps == [256, 256, len(users) - 512]
        for e, u in enumerate(users):
            row = negs[e][negs[e] != 0]
            assert len(set(row.tolist())) == len(row)
            assert not set(row.tolist()) & set(seqs[u].tolist())
            assert len(row) == min(n, seqs.n_items - len(set(seqs[u].tolist())))


def test_the_sorted_lookup_of_draws_is_searchsorted() -> None:
    rng = np.random.default_rng(0)
    w = rng.random(1001) * (rng.random(1001) < 0.7)  # zero weights: runs of equal cdf values
    cdf = np.cumsum(w) / w.sum()
    u = np.concatenate([rng.random(3000), cdf[rng.integers(0, 1001, 200)]]).reshape(100, 32)
    np.testing.assert_array_equal(_inverse_cdf(cdf, u), np.searchsorted(cdf, u, side="right"))


def test_popularity_sampling_follows_weights() -> None:
    seqs = Sequences.from_lists([[1]] * 4000, n_items=11)
    w = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10], dtype=np.float64)  # item 11 is 10x
    negs = sample_negatives(seqs, np.arange(4000), n=1, weights=w, seed=0)
    share = (negs[:, 0] == 11).mean()
    assert share == pytest.approx(10 / 19, abs=0.03)
    uni = sample_negatives(seqs, np.arange(4000), n=1, weights=None, seed=0)
    assert (uni[:, 0] == 11).mean() == pytest.approx(1 / 10, abs=0.02)


def test_without_replacement_inclusion_probability_both_paths() -> None:
    """Two draws without replacement: P(heavy item 11 included) = p + sum_j p_j * p / (1 - p_j)
    with p = 10/19 and nine light items of 1/19 each: 10/19 + 9 * (1/19) * (10/19) / (18/19)
    = 0.789; two independent draws (with replacement) would give 1 - (9/19)^2 = 0.776. With
    60,000 rows the standard error is 0.0017, so the 0.005 tolerance tells the two apart."""
    expected = 10 / 19 + 9 * (1 / 19) * (10 / 19) / (18 / 19)
    with_replacement = 1 - (9 / 19) ** 2
    n = 60_000
    seqs = Sequences.from_lists([[1]] * n, n_items=11)
    w = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10], dtype=np.float64)
    stream = sample_negatives(seqs, np.arange(n), n=2, weights=w, seed=1)
    seen = np.zeros((n, 12), dtype=bool)
    seen[:, :2] = True
    gumbel = _gumbel_top_n(w, seen, 2, np.random.default_rng(1))
    for draws in (stream, gumbel):
        share = (draws == 11).any(1).mean()
        assert share == pytest.approx(expected, abs=0.005)
        assert abs(share - with_replacement) > 0.008


def _naive_ranks(
    scores: np.ndarray,
    seqs: Sequences,
    split_users: np.ndarray,
    hist: Sequences,
    targets: np.ndarray,
    negs: np.ndarray | None,
) -> list[int]:
    out = []
    for e, _u in enumerate(split_users):
        s, t = scores, int(targets[e])
        if negs is None:
            seen = set(hist[e].tolist())
            rivals = [i for i in range(1, seqs.n_items + 1) if i != t and i not in seen]
        else:
            rivals = [int(i) for i in negs[e] if i != 0]
        out.append(sum(1 for i in rivals if s[i] >= s[t]))
    return out


def test_vectorised_evaluation_matches_naive_loop() -> None:
    pre = preprocess(synthetic_interactions(n_users=120, n_items=80, seed=5))
    seqs = pre.sequences
    split = leave_one_out(seqs)
    pop = Popularity.fit(split.train)
    scores = pop.counts.numpy()
    for eval_set in (split.valid, split.test):
        negs = {
            "uni100": sample_negatives(seqs, eval_set.users, n=30, seed=1),
            "pop100": sample_negatives(
                seqs, eval_set.users, n=30, weights=item_popularity(seqs), seed=2
            ),
        }
        report = evaluate(pop, eval_set, negatives=negs, batch_size=17)
        h, t = eval_set.histories, eval_set.targets
        assert report.ranks["full"].tolist() == _naive_ranks(
            scores, seqs, eval_set.users, h, t, None
        )
        for p in ("uni100", "pop100"):
            assert report.ranks[p].tolist() == _naive_ranks(
                scores, seqs, eval_set.users, h, t, negs[p]
            )


def test_a_diverged_scorer_gets_the_worst_rank_under_every_protocol() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4]], n_items=8)
    split = leave_one_out(seqs)
    negs = {"uni100": np.array([[5, 6, 7, 0]]), "pop100": np.array([[6, 7, 8, 5]])}
    nan = np.full((1, 9), np.nan)
    report = evaluate(
        TableScorer(nan, split.test.histories),
        split.test,
        protocols=["full", "uni100", "pop100"],
        negatives=negs,
    )
    # the history is 1-3 and the target 4: every candidate counts above the NaN target
    ranks = {p: r.tolist() for p, r in report.ranks.items()}
    assert ranks == {"full": [4], "uni100": [3], "pop100": [4]}  # rivals 5-8; 3 and 4 negatives
    assert all(report.metrics[p]["hr@1"] == 0.0 for p in ranks)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_rival_counts_above_a_finite_target(bad: float) -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4]], n_items=6)
    split = leave_one_out(seqs)
    #                 pad 1  2  3  4(target) 5    6
    table = np.array([[0, 0, 0, 0, 5.0, bad, 1.0]])
    scorer = TableScorer(table, split.test.histories)
    report = evaluate(
        scorer, split.test, protocols=["full", "uni100"], negatives={"uni100": np.array([[5, 6]])}
    )
    assert report.ranks["full"].tolist() == [1] and report.ranks["uni100"].tolist() == [1]


def test_an_infinite_target_ranks_last() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4]], n_items=6)
    split = leave_one_out(seqs)
    table = np.array([[0, 0, 0, 0, np.inf, -1.0, -2.0]])
    report = evaluate(TableScorer(table, split.test.histories), split.test, protocols=["full"])
    assert report.ranks["full"].tolist() == [2]


def test_full_ranks_match_masking_the_whole_row() -> None:
    # random scores with ties, NaN and +-inf; histories with repeats, padding and the target
    # itself: the one-pass count equals masking the excluded items out and counting the rest
    gen = torch.Generator().manual_seed(0)
    b, v = 64, 40
    scores = torch.randint(0, 6, (b, v), generator=gen).float()
    scores[torch.rand(b, v, generator=gen) < 0.05] = torch.nan
    scores[torch.rand(b, v, generator=gen) < 0.05] = torch.inf
    scores[torch.rand(b, v, generator=gen) < 0.05] = -torch.inf
    targets = torch.randint(1, v, (b,), generator=gen)
    t_score = scores.gather(1, targets[:, None])
    t_score = torch.where(torch.isfinite(t_score), t_score, -torch.inf)
    seen = torch.randint(1, 8, (b, 12), generator=gen)  # ids 1-7 only: many repeats
    seen[:, :3] = 0  # left padding
    seen[::4, -1] = targets[::4]  # a target already in the history
    got = full_ranks(scores, t_score, torch.cat([seen, targets[:, None]], 1))
    want = []
    for r in range(b):
        out = set(seen[r].tolist()) | {0, int(targets[r])}
        t = float(t_score[r])
        want.append(sum(1 for i in range(v) if i not in out and not float(scores[r, i]) < t))
    assert got.tolist() == want and got.dtype == torch.int64
    assert max(want) > min(want)  # the case is not degenerate


class _Scored(Exception):
    """Raised by DeviceScorer once it has seen where its histories were put."""


class DeviceScorer:
    max_len = None

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.seen: list[str] = []

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        self.seen.append(histories.device.type)
        raise _Scored


def test_histories_go_to_the_scorers_device_unless_told() -> None:
    # on a GPU machine `fit` leaves the model on the GPU: evaluating it must not feed it CPU
    # tensors (on an H200 the tests that fed CPU histories to a model fit had left there failed)
    split = leave_one_out(Sequences.from_lists([[1, 2, 3, 4]], n_items=6))
    scorer = DeviceScorer("meta")
    for device in (None, "cpu"):
        with pytest.raises(_Scored):
            evaluate(scorer, split.test, protocols=["full"], device=device)
    assert scorer.seen == ["meta", "cpu"]
    # a model's device is its weights'
    model = build_model(default_config("sasrec"), n_items=6).to("meta")
    assert model.device == torch.device("meta")


class TableBlocks:
    """A TableScorer's rows read a few columns at a time, as `BlockScores` reads a model's."""

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores

    def pairs(self, items: torch.Tensor) -> torch.Tensor:
        return self.scores.gather(1, items).masked_fill(items == 0, -torch.inf)

    def blocks(self, width: int) -> Iterator[tuple[int, torch.Tensor]]:
        for lo in range(0, self.scores.shape[1], width):
            yield lo, self.scores[:, lo : lo + width].clone()


class BlockTableScorer(TableScorer):
    blockwise = True

    def block_scores(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> Any:
        return TableBlocks(self.score(histories, users))


def _ranks_whole_and_in_blocks(
    scorer: TableScorer, eval_set: EvalSet, negs: dict[str, np.ndarray], monkeypatch: Any
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Ranks scored whole, then in blocks of 3 items (a byte bound of 17 rows x 3 columns)."""
    kw: dict[str, Any] = {"protocols": ["full", *negs], "negatives": negs, "batch_size": 17}
    whole = evaluate(scorer, eval_set, **kw).ranks
    blocked = BlockTableScorer(scorer.table.numpy(), eval_set.histories)
    monkeypatch.setattr(ev, "SCORES_BYTES", 4 * 17 * 3)
    assert ev.score_plan(blocked, eval_set.histories.n_items, 17) == (17, 3)
    in_blocks = evaluate(blocked, eval_set, **kw).ranks
    monkeypatch.undo()
    return (
        {p: r.tolist() for p, r in whole.items()},
        {p: r.tolist() for p, r in in_blocks.items()},
    )


def test_ranks_scored_in_blocks_of_items_equal_the_whole_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # popularity counts (many ties) and a table of ties, NaN and +-inf: a catalogue read a few
    # items at a time ranks every target as the whole-row pass does, under every protocol
    pre = preprocess(synthetic_interactions(n_users=120, n_items=80, seed=5))
    split = leave_one_out(pre.sequences)
    hist = split.test.histories
    gen = torch.Generator().manual_seed(1)
    v = hist.n_items + 1
    wild = torch.randint(0, 6, (hist.n_users, v), generator=gen).float()
    for value in (torch.nan, torch.inf, -torch.inf):
        wild[torch.rand(hist.n_users, v, generator=gen) < 0.05] = value
    counts = Popularity.fit(split.train).counts.float().expand(hist.n_users, v).numpy()
    negs = {
        "uni100": sample_negatives(pre.sequences, split.test.users, n=30, seed=1),
        "pop100": sample_negatives(
            pre.sequences, split.test.users, n=30, weights=item_popularity(pre.sequences), seed=2
        ),
    }
    for table in (counts, wild.numpy()):
        whole, in_blocks = _ranks_whole_and_in_blocks(
            TableScorer(table, hist), split.test, negs, monkeypatch
        )
        assert in_blocks == whole
        assert len(set(whole["full"])) > 5  # not a degenerate case


def test_a_model_scored_in_blocks_ranks_as_scored_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # a model's own BlockScores (its output layer a slice at a time, the target's score its
    # own dot product) ranks as its whole (B, V) scores do; a model is `blockwise`
    pre = preprocess(synthetic_interactions(n_users=60, n_items=50, seed=2))
    split = leave_one_out(pre.sequences)
    torch.manual_seed(0)
    model = build_model(default_config("sasrec"), n_items=pre.sequences.n_items).eval()
    negs = {"uni100": sample_negatives(pre.sequences, split.test.users, n=30, seed=1)}
    kw: dict[str, Any] = {"protocols": ["full", "uni100"], "negatives": negs, "batch_size": 16}
    whole = evaluate(model, split.test, **kw)
    # a million items: 256 rows in blocks of 16 MB, but 4 whole rows for a scorer that is not
    assert ev.score_plan(model, 10**6, 256) == (256, 16384)
    assert ev.score_plan(Popularity.fit(split.train), 10**6, 256) == (4, None)
    monkeypatch.setattr(ev, "SCORES_BYTES", 4 * 16 * 7)
    assert ev.score_plan(model, pre.sequences.n_items, 16) == (16, 7)
    in_blocks = evaluate(model, split.test, **kw)
    for p in ("full", "uni100"):
        assert in_blocks.ranks[p].tolist() == whole.ranks[p].tolist()
