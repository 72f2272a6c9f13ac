"""The baselines with a per-user term (BPR-MF, FPMC / FMC, Caser): what each computes, against
hand-computed values; causality; the unknown-user rule (the user term left out) in `score`,
`recommend` and `recommend_user`; training on tiny synthetic data above POP; save -> load."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.config import RunConfig, default_config, load_config
from seqrec.data.batches import NextItemConfig, NextItemSampler
from seqrec.data.prepare import prepare_frame
from seqrec.data.prepared import PreparedDataset
from seqrec.data.preprocess import Sequences
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import evaluate_split
from seqrec.models import ncf as ncf_module
from seqrec.models.baselines import Popularity
from seqrec.models.bprmf import BPRMF, BPRMFConfig
from seqrec.models.caser import Caser, CaserConfig
from seqrec.models.fpmc import FPMC, FPMCConfig
from seqrec.models.ncf import NCF, NCFConfig
from seqrec.models.transrec import TransRec, TransRecConfig
from seqrec.serving.recommender import Recommender
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit


def test_bpr_mf_scores_user_dot_item_plus_bias_and_unknown_users_by_the_bias() -> None:
    torch.manual_seed(0)
    m = BPRMF(5, 3, BPRMFConfig(d_model=4)).eval()
    with torch.no_grad():
        m.item_bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0]))
    m.requires_grad_(False)
    h = torch.tensor([[0, 1, 2], [3, 4, 5], [0, 0, 1]])
    users = torch.tensor([2, 0, -1])
    s = m.score(h, users)
    p, q = m.user_emb.weight.detach(), m.item_emb.weight.detach()
    # by hand: user u is row u + 1 of the table, item i row i
    for b, u in enumerate([2, 0]):
        for i in range(1, 6):
            want = float(p[u + 1] @ q[i]) + float(m.item_bias[i - 1])
            assert float(s[b, i]) == pytest.approx(want, abs=1e-6)
    assert s[2, 1:].tolist() == pytest.approx(m.item_bias.tolist())  # unknown: the bias
    assert torch.equal(m.score(h[2:]), s[2:])  # no users given = unknown
    assert torch.equal(m.score(h[2:], torch.tensor([7])), s[2:])  # out of range = unknown
    # the history plays no part
    assert torch.allclose(m.score(torch.tensor([[0, 0, 4]]), users[:1]), s[:1], atol=1e-6)


def test_fpmc_is_the_mf_term_plus_the_chain_from_the_last_item_and_fmc_the_chain() -> None:
    torch.manual_seed(0)
    m = FPMC(6, 2, FPMCConfig(d_model=3)).eval().requires_grad_(False)
    h = torch.tensor([[0, 2, 5], [1, 3, 4]])
    s = m.score(h, torch.tensor([1, -1]))
    u, i_u = m.user_emb.weight, m.item_emb.weight
    prev, nxt = m.prev_emb.weight, m.next_emb.weight
    for i in range(1, 7):
        want0 = float(u[2] @ i_u[i]) + float(nxt[i] @ prev[5])  # user 1 after item 5
        want1 = float(nxt[i] @ prev[4])  # unknown user after item 4: the chain alone
        assert float(s[0, i]) == pytest.approx(want0, abs=1e-6)
        assert float(s[1, i]) == pytest.approx(want1, abs=1e-6)
    fmc = FPMC(6, 2, FPMCConfig(d_model=3, user_term=False)).eval().requires_grad_(False)
    assert not hasattr(fmc, "user_emb")
    s = fmc.score(h, torch.tensor([1, 0]))
    assert float(s[0, 3]) == pytest.approx(float(fmc.next_emb.weight[3] @ fmc.prev_emb.weight[5]))
    # training features: position t holds the item there (l) and the user
    hid = m(h, users=torch.tensor([1, 0]))
    assert hid.shape == (2, 3, 6)
    assert torch.equal(hid[0, 1, 3:], prev[2]) and torch.equal(hid[1, 0, :3], u[1])


def test_transrec_ranks_by_bias_minus_the_squared_distance_from_the_translated_point() -> None:
    torch.manual_seed(0)
    m = TransRec(5, 3, TransRecConfig(d_model=4, init_std=1.0)).eval().requires_grad_(False)
    with torch.no_grad():
        m.user_emb.weight[1:].normal_()  # row 0, the unknown user, stays 0
        m.translation.normal_()
        m.item_bias.normal_()
    g = m.points()
    assert (g.norm(dim=1) <= 1 + 1e-6).all()  # inside the unit ball
    assert float(m.item_emb.weight[1:].norm(dim=1).max()) > 1  # (the raw ones are not)
    h = torch.tensor([[0, 1, 4], [2, 3, 2]])
    s = m.score(h, torch.tensor([1, -1]))
    for b, (last, t_u) in enumerate([(4, m.user_emb.weight[2]), (2, torch.zeros(4))]):
        a = g[last] + m.translation + t_u
        want = torch.stack([m.item_bias[i - 1] - ((a - g[i]) ** 2).sum() for i in range(1, 6)])
        # TransRec's scores up to one constant per row (‖a‖²): the same differences
        diff = s[b, 1:] - want
        assert torch.allclose(diff, diff[0].expand_as(diff), atol=1e-5)
        assert float(diff[0]) == pytest.approx(float((a * a).sum()), abs=1e-5)


def test_ncf_is_gmf_and_an_mlp_tower_projected_to_one_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    m = NCF(7, 3, NCFConfig(factors=2, n_layers=2, init_std=0.5)).eval().requires_grad_(False)
    # the tower: 2 * (2 * 2) = 8 inputs -> 4 -> 2 (f)
    assert [layer.in_features for layer in m.tower if isinstance(layer, torch.nn.Linear)] == [8, 4]
    h, users = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([2, -1])
    s = m.score(h, users)
    assert s.shape == (2, 8) and s[:, 0].eq(-math.inf).all()
    for b, row in enumerate([3, 0]):  # user 2 is row 3; the unknown user row 0 (zeros)
        pu, mu = m.user_gmf.weight[row], m.user_mlp.weight[row]
        for i in range(1, 8):
            gmf = pu * m.item_gmf.weight[i]
            x = torch.cat([mu, m.item_mlp.weight[i]])
            for layer in m.tower:
                x = layer(x)
            want = float(m.predict(torch.cat([gmf, x]))[0])
            assert float(s[b, i]) == pytest.approx(want, abs=1e-5)
    # the unknown user: the GMF branch is zero, the score the MLP on the item alone
    assert torch.equal(m.user_vector(h[1:], users[1:]), torch.zeros(1, 2 + 4))
    # the sampled losses read pair_logits: the same numbers as the score's columns
    items = torch.tensor([[5, 1, 7], [2, 2, 3]])
    pairs = m.pair_logits(m.user_vector(h, users), items)
    assert torch.allclose(pairs, s.gather(1, items), atol=1e-6)
    with pytest.raises(ConfigError, match="no output layer"):
        m.output_weights()
    # scored a few items at a time (the chunks follow the batch and the tower's width): the same
    monkeypatch.setattr(ncf_module, "_SCORE_FLOATS", 3 * 2 * 4)  # 3 items per chunk, 3 chunks
    assert torch.allclose(m.score(h, users), s, atol=1e-6)


def _caser() -> Caser:
    torch.manual_seed(0)
    cfg = CaserConfig(window=3, d_model=8, n_v=2, n_h=3, dropout=0.0)
    return Caser(30, 4, cfg).eval().requires_grad_(False)


def test_caser_reads_exactly_the_last_window_items_and_is_causal() -> None:
    m = _caser()
    users = torch.tensor([1])
    a = torch.tensor([[0, 0, 3, 4, 5, 6, 7]])
    ha = m(a, users=users)
    for t in range(2, 7):
        b = a.clone()
        b[0, t] = 20
        hb = m(b, users=users)
        assert torch.allclose(ha[0, :t], hb[0, :t], atol=1e-6)  # the past never sees the future
        assert not torch.allclose(ha[0, t], hb[0, t])
        # position t + 3 and later no longer read position t (the window is 3 items)
        assert torch.allclose(ha[0, t + 3 :], hb[0, t + 3 :], atol=1e-6)
    # the score is the last position's: the same for any longer history with those 3 items
    s = m.score(torch.tensor([[1, 2, 5, 6, 7], [0, 0, 5, 6, 7]]), torch.tensor([1, 1]))
    assert torch.allclose(s[0], s[1]) and s.shape == (2, 31)
    # [z; P_u] by hand for the user half; an unknown user's half is zero
    assert torch.equal(ha[0, -1, 8:], m.user_emb.weight[2])
    assert m(a, users=torch.tensor([-1]))[0, -1, 8:].abs().sum() == 0


def test_caser_convolutions_along_the_sequence_equal_the_2d_ones_image_by_image() -> None:
    torch.manual_seed(0)
    m = Caser(30, 4, CaserConfig(window=4, d_model=6, n_v=3, n_h=2, dropout=0.0)).eval()
    ids = torch.tensor([[0, 0, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]])
    got = m.convolutions(ids)  # (2, 8, 3 * 6 + 2 * 4)
    padded = torch.nn.functional.pad(ids, (3, 0))
    for b in range(2):
        for t in range(8):
            img = m.item_emb(padded[b, t : t + 4])[None, None]  # (1, 1, L, d): items up to t
            v = m.conv_v(img).reshape(-1)
            h = [torch.relu(conv(img)).squeeze(3).amax(dim=2).reshape(-1) for conv in m.conv_h]
            assert torch.allclose(got[b, t], torch.cat([v, *h]), atol=1e-5), (b, t)


def test_the_next_item_batches_carry_each_rows_user() -> None:
    train = Sequences.from_lists([[1, 2, 3], [4], [5, 6, 7, 8], [2, 9]])
    sampler = NextItemSampler(
        train, max_len=10, cfg=NextItemConfig(bucket_batches=1), batch_size=2, seed=0
    )
    seen = {}
    for batch in sampler.epoch(0):
        assert batch.users is not None and batch.model_inputs(users=True)["users"] is batch.users
        for row, user in zip(batch.inputs.tolist(), batch.users.tolist(), strict=True):
            seen[user] = [i for i in row if i]
    # user 1 has one item (no next-item pair); each other row is its user's input s_1..s_{T-1}
    assert seen == {0: [1, 2], 2: [5, 6, 7], 3: [2]}
    packed = NextItemSampler(train, max_len=10, cfg=NextItemConfig(pack=True), batch_size=4)
    batch = next(iter(packed.epoch(0)))
    with pytest.raises(ValueError, match="reads each row's user"):
        batch.model_inputs(users=True)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    df = synthetic_interactions(n_users=300, n_items=40, min_len=10, max_len=30, seed=0)
    return prepare_frame(df, tmp_path_factory.mktemp("toy") / "prepared", name="toy")


def _config(model: str, *more: str) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        [
            f'model="{model}"',
            "train.lr=1e-2",
            "train.batch_size=16",
            "train.max_epochs=8",
            "train.eval_every=4",
            "train.patience=0",
            *more,
        ],
    )


@pytest.mark.parametrize(
    ("model", "more", "margin"),
    [
        # the ring's items follow each other: a user's items lie on one arc, which BPR-MF learns
        ("bpr-mf", ["bpr_mf.d_model=16", "train.n_negatives=4"], 0.15),
        ("fpmc", ["fpmc.d_model=16", "train.n_negatives=4"], 0.3),
        ("caser", ["caser.d_model=16", "caser.dropout=0.1"], 0.3),
        ("transrec", ["transrec.d_model=16", "train.n_negatives=4"], 0.3),
        # NCF scores (user, item) pairs, so it learns the users' arcs, as BPR-MF
        ("ncf", ["ncf.factors=16", "train.lr=5e-3"], 0.15),
    ],
)
def test_learns_the_toy_pattern_above_pop(
    model: str, more: list[str], margin: float, toy: PreparedDataset, tmp_path: Path
) -> None:
    result = fit(toy, _config(model, *more), tmp_path / "run", progress=False)
    pop = evaluate_split(toy, Popularity.fit(toy.split.train), "valid", protocols=["full"])
    ours = result.metrics["valid"]["full"]["ndcg@10"]
    assert ours > pop.metrics["full"]["ndcg@10"] + margin, (model, ours)
    # save -> load gives identical scores, with and without users
    run = load_run(result.run_dir, device=result.model.device)  # where fit left it
    h = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]], device=result.model.device)
    users = torch.tensor([3, -1], device=result.model.device)
    assert torch.equal(run.model.score(h, users), result.model.score(h, users))
    assert evaluate_split(toy, run.model, "test").metrics == result.metrics["test"]
    # recommend_user passes the user: the same top-k as scoring its history with its index
    rec = Recommender.from_run(result.run_dir)
    user_id = toy.user_ids[5]
    mine = rec.recommend_user(user_id, k=5)
    seq = toy.sequences[5]
    assert mine == rec.recommend_encoded([seq], k=5, users=[5])[0]
    history = [toy.item_ids[i - 1] for i in seq]
    anonymous = rec.recommend(history, k=5)
    assert anonymous == rec.recommend_encoded([seq], k=5)[0] and len(anonymous) == 5
    # a batch with user ids (a log file): known users get their term, unknown ones none
    both = rec.recommend_batch([history, history], k=5, users=[user_id, "nobody"])
    # same items; scores equal up to float rounding (a batch of two may take another matmul kernel)
    for got, want in zip(both, [mine, anonymous], strict=True):
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
    if model == "bpr-mf":  # an anonymous history: the learned item bias, a popularity ranking
        assert mine != anonymous
        bias = run.model.output_weights()[1]
        assert bias is not None
        order = [toy.item_ids[int(i)] for i in torch.argsort(bias, descending=True)]
        assert [item for item, _ in anonymous] == [
            i for i in order if i not in set(toy.item_ids[j - 1] for j in seq)
        ][:5]


def test_user_models_refuse_packed_rows_and_have_their_own_sections(
    toy: PreparedDataset, tmp_path: Path
) -> None:
    for model in ("bpr-mf", "fpmc", "caser", "transrec", "ncf"):
        cfg = _config(model, "next_item.pack=true")
        with pytest.raises(ConfigError, match="next_item.pack must be false"):
            fit(toy, cfg, tmp_path / model, progress=False)
    with pytest.raises(ConfigError, match="ncf: train.loss must be a sampled loss"):
        fit(toy, _config("ncf", 'train.loss="ce"'), tmp_path / "ncf-ce", progress=False)
    assert default_config("caser").caser.window == 5 and default_config("caser").train.loss == "bce"
    assert default_config("fpmc").fpmc.user_term and default_config("bpr-mf").train.loss == "bpr"
    with pytest.raises(ConfigError, match=r"\[caser\] is a section of model 'caser'"):
        load_config(RunConfig, None, ['model="fpmc"', "caser.window=3"])
    assert math.isfinite(default_config("bpr-mf").bpr_mf.init_std)


def test_popularity_negatives_are_a_next_item_option(toy: PreparedDataset, tmp_path: Path) -> None:
    from seqrec.models.registry import entry

    counts = np.bincount(toy.split.train.items, minlength=toy.n_items + 1)[1:]

    def drawn(mode: str) -> np.ndarray:
        cfg = _config("bpr-mf", f'train.negative_sampling="{mode}"', "train.n_negatives=50")
        batches = entry("bpr-mf").batches(cfg, toy).epoch(0)
        negs = np.concatenate(
            [b.negatives.numpy().ravel() for b in batches if b.negatives is not None]
        )
        return np.bincount(negs, minlength=toy.n_items + 1)[1:]

    # popularity: drawn in proportion to the training counts (less the users' own items);
    # uniform: popular items are drawn less, being in more users' sequences
    assert np.corrcoef(drawn("popularity"), counts)[0, 1] > 0.5
    assert np.corrcoef(drawn("uniform"), counts)[0, 1] < 0
    with pytest.raises(ConfigError, match="needs the next-item task; bert4rec has none"):
        fit(
            toy,
            _config("bert4rec", 'train.loss="bce"', 'train.negative_sampling="popularity"'),
            tmp_path / "b",
            progress=False,
        )
