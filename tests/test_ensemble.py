"""seqrec.experiments.ensemble: the weighted sum of the members' log-softmax scores, checked by
hand; each member reads its own history length; runs of other items are refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seqrec.evaluation.protocols import evaluate_split
from seqrec.experiments.ensemble import Ensemble


class Fixed:
    """A member scoring items 1..3 with fixed scores; it records the histories it was given."""

    def __init__(self, scores: list[float], max_len: int | None = None) -> None:
        self.scores = torch.tensor([-math.inf, *scores])
        self.max_len = max_len
        self.seen: list[torch.Tensor] = []

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        self.seen.append(histories)
        return self.scores.expand(histories.shape[0], -1).clone()


def test_the_score_is_the_weighted_sum_of_log_probabilities() -> None:
    # A: softmax (1/4, 1/2, 1/4); B: (3/5, 1/5, 1/5)
    a, b = Fixed([0.0, math.log(2), 0.0]), Fixed([math.log(3), 0.0, 0.0])
    hist = torch.tensor([[0, 1, 2]])
    got = Ensemble([a, b]).score(hist)
    want = [
        0.5 * (math.log(p) + math.log(q))
        for p, q in ((1 / 4, 3 / 5), (1 / 2, 1 / 5), (1 / 4, 1 / 5))
    ]
    assert got[0, 0] == -math.inf
    torch.testing.assert_close(got[0, 1:], torch.tensor(want), rtol=1e-6, atol=1e-6)
    # equal weights rank item 1 (sqrt(3/20)) over 2 (sqrt(1/10)) over 3; A alone ranks 2 first
    assert got[0, 1:].argsort(descending=True).tolist() == [0, 1, 2]
    weighted = Ensemble([a, b], weights=[3, 1]).score(hist)  # normalised to 3/4, 1/4
    want = [0.75 * math.log(p) + 0.25 * math.log(q) for p, q in ((1 / 4, 3 / 5), (1 / 2, 1 / 5))]
    torch.testing.assert_close(weighted[0, 1:3], torch.tensor(want), rtol=1e-6, atol=1e-6)
    assert weighted[0, 1:].argmax().item() == 1  # 3/4 of A: item 2 wins


def test_a_member_s_scale_and_shift_do_not_move_the_sum() -> None:
    a, b = Fixed([0.3, -1.2, 2.0]), Fixed([1.0, 0.5, -0.5])
    shifted = Fixed([100.3, 98.8, 102.0])
    hist = torch.tensor([[1, 2]])
    torch.testing.assert_close(Ensemble([a, b]).score(hist), Ensemble([shifted, b]).score(hist))
    unused = Fixed([1.0, 0.5, -0.5])
    alone = Ensemble([a, unused], weights=[1, 0]).score(hist)
    assert alone[0, 1:].argsort().tolist() == a.scores[1:].argsort().tolist()
    assert not unused.seen  # a member of weight 0 is not scored


def test_each_member_reads_its_own_history_length() -> None:
    short, whole = Fixed([0.0, 0.0, 0.0], max_len=2), Fixed([0.0, 0.0, 0.0], max_len=None)
    ens = Ensemble([short, whole])
    assert ens.max_len is None
    assert Ensemble([short, Fixed([0.0] * 3, max_len=5)]).max_len == 5
    ens.score(torch.tensor([[0, 3, 1, 2]]))
    assert short.seen[0].tolist() == [[1, 2]] and whole.seen[0].tolist() == [[0, 3, 1, 2]]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1.0], "1 weights for 2 members"),
        ([0, 0], "not all 0"),
        ([1, -1], ">= 0"),
        ([1, math.nan], "finite"),
    ],
)
def test_bad_weights_are_refused(weights: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Ensemble([Fixed([0.0] * 3), Fixed([0.0] * 3)], weights)


def test_runs_rank_together_and_runs_of_other_items_are_refused(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    from seqrec.data.prepared import load_prepared
    from seqrec.training.checkpoint import load_run

    run_a, run_b = load_run(tiny_runs["sasrec"]), load_run(tiny_runs["gru4rec"])
    ds = load_prepared(run_a.source["prepared"])
    ens = Ensemble.from_runs([tiny_runs["sasrec"], tiny_runs["gru4rec"]], weights=[0.5, 0.5])
    eval_set = ds.split.eval_set("test")
    hist = torch.from_numpy(np.array([[0] * 9 + [1, 2, 3]]))
    want = 0.5 * torch.log_softmax(run_a.model.score(hist)[:, 1:], 1) + 0.5 * torch.log_softmax(
        run_b.model.score(hist)[:, 1:], 1
    )
    torch.testing.assert_close(ens.score(hist)[:, 1:], want)
    report = evaluate_split(ds, ens, "test", protocols=("full",))
    assert len(report.ranks["full"]) == len(eval_set.targets)
    alone = evaluate_split(
        ds, Ensemble.from_runs([tiny_runs["sasrec"]]), "test", protocols=("full",)
    )
    direct = evaluate_split(ds, run_a.model, "test", protocols=("full",))
    np.testing.assert_array_equal(alone.ranks["full"], direct.ranks["full"])
    # a run trained on another log: other items
    from seqrec.config import RunConfig, load_config
    from seqrec.data.prepare import prepare
    from seqrec.data.synthetic import synthetic_interactions
    from seqrec.training.fit import fit

    df = synthetic_interactions(n_users=40, n_items=30, min_len=6, max_len=12, seed=5)
    data = tmp_path / "other.csv"
    df.select("user", "item", "timestamp").write_csv(data)
    cfg = load_config(RunConfig, None, ["model='bpr-mf'", "bpr_mf.d_model=8", "train.max_epochs=1"])
    other = fit(
        prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval),
        cfg,
        tmp_path / "run",
        progress=False,
        source={"data": str(data)},
    ).run_dir
    with pytest.raises(ValueError, match="items differ"):
        Ensemble.from_runs([tiny_runs["sasrec"], other])


def test_the_weight_grid_covers_the_simplex() -> None:
    from seqrec.experiments.ensemble import weight_grid

    assert weight_grid(3, 0.5) == [
        (0, 0, 1),
        (0, 0.5, 0.5),
        (0, 1, 0),
        (0.5, 0, 0.5),
        (0.5, 0.5, 0),
        (1, 0, 0),
    ]
    assert len(weight_grid(2, 0.1)) == 11 and weight_grid(1, 0.25) == [(1.0,)]
    with pytest.raises(ValueError, match="1 / step whole"):
        weight_grid(2, 0.3)


class Oracle:
    """Scores each user's validation target 1000 above every other item."""

    max_len = None

    def __init__(self, users: np.ndarray, targets: np.ndarray, n_users: int, n_items: int) -> None:
        self.target = torch.zeros(n_users, dtype=torch.long)
        self.target[torch.from_numpy(users)] = torch.from_numpy(targets)
        self.n_items = n_items

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        assert users is not None
        s = torch.zeros(len(users), self.n_items + 1)
        s[torch.arange(len(users)), self.target[users]] = 1000.0
        return s


class Counted:
    """A member that counts the users it scores."""

    def __init__(self, member: Any) -> None:
        self.member, self.max_len, self.users = member, member.max_len, 0

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        self.users += len(histories)
        return self.member.score(histories, users)


def test_weights_are_chosen_on_validation_as_the_ensemble_ranks(tiny_runs: dict[str, Path]) -> None:
    from seqrec.data.prepared import load_prepared
    from seqrec.experiments.ensemble import choose_weights
    from seqrec.training.checkpoint import load_run

    a, b = load_run(tiny_runs["sasrec"]).model, load_run(tiny_runs["gru4rec"]).model
    ds = load_prepared(load_run(tiny_runs["sasrec"]).source["prepared"])
    choice = choose_weights([a, b], ds, step=0.25)
    assert [w for w, _ in choice.grid] == [(0, 1), (0.25, 0.75), (0.5, 0.5), (0.75, 0.25), (1, 0)]
    for w, value in choice.grid:  # each grid value is the ensemble's own validation metric
        direct = evaluate_split(ds, Ensemble([a, b], w), "valid", protocols=("full",))
        assert value == pytest.approx(direct.metrics["full"]["ndcg@10"], abs=1e-12)
    assert choice.value == max(v for _, v in choice.grid)
    assert choice.metric == "valid full ndcg@10"
    # an oracle of the validation targets wins at its first non-zero weight (ties: earlier)
    valid = ds.split.eval_set("valid")
    oracle = Oracle(valid.users, valid.targets, ds.n_users, ds.n_items)
    choice = choose_weights([a, oracle], ds, step=0.25, metric="hr@1")
    assert choice.weights == (0, 1) and choice.value == 1.0
    choice = choose_weights([oracle, a], ds, step=0.25, metric="hr@1")
    assert choice.weights == (0.25, 0.75) and choice.value == 1.0
    # users a chunk at a time (here 7 users' scores fit): the same values, each user scored once
    whole = choose_weights([a, b], ds, step=0.25)
    counted = Counted(b)
    chunked = choose_weights([a, counted], ds, step=0.25, max_bytes=7 * (ds.n_items + 1) * 4 * 2)
    assert chunked.weights == whole.weights
    assert [v for _, v in chunked.grid] == pytest.approx([v for _, v in whole.grid], abs=1e-12)
    assert counted.users == len(valid.targets) > 7
    with pytest.raises(ValueError, match="unknown metric"):
        choose_weights([a, b], ds, metric="auc")


def test_evaluate_ranks_by_an_ensemble_of_runs(
    tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from seqrec.cli import main

    one = ["evaluate", str(tiny_runs["sasrec"]), "--json", "--quiet", "--protocol", "full"]
    assert main(one) == 0
    alone = json.loads(capsys.readouterr().out)
    both = [*one, "--with", str(tiny_runs["gru4rec"])]
    assert main([*both, "--weights", "1,0"]) == 0  # the first run alone
    assert json.loads(capsys.readouterr().out)["full"] == pytest.approx(alone["full"])
    assert main([*both, "--weights", "0.5,0.5"]) == 0
    half = json.loads(capsys.readouterr().out)["full"]
    from seqrec.data.prepared import load_prepared
    from seqrec.training.checkpoint import load_run

    ds = load_prepared(load_run(tiny_runs["sasrec"]).source["prepared"])
    ens = Ensemble.from_runs([tiny_runs["sasrec"], tiny_runs["gru4rec"]])
    assert half == pytest.approx(
        evaluate_split(ds, ens, "test", protocols=("full",)).metrics["full"]
    )
    assert main(both) == 0  # weights chosen on validation, said on stderr
    assert "weights chosen on valid full ndcg@10 (11 grid points)" in capsys.readouterr().err
    for argv, message in [
        ([*both, "--weights", "1"], "1 numbers for 2 runs"),
        ([*both, "--weights", "a,b"], "expected 'valid' or one number per run"),
        ([*both, "--weights", "0,0"], "not all 0"),
        ([*one, "--weights", "1"], "give the other runs of the ensemble with --with"),
        (["evaluate", "pop", "--with", str(tiny_runs["gru4rec"])], "not 'pop'"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
