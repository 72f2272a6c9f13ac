"""The Cloze task's training samples (§3.6): windows, masking statistics, mask-last samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqrec.data.batches import (
    ClozeConfig,
    ClozeSampler,
    NextItemConfig,
    NextItemSampler,
    pack_rows,
    sliding_windows,
)
from seqrec.data.negatives import draw_negatives, draw_shared_negatives
from seqrec.data.preprocess import Sequences


def test_sliding_windows_hand_computed() -> None:
    # max_len 4, step 0.5 -> stride 2. Length 10: starts 6, 4, 2 (range(6, 0, -2)) and 0.
    row, start, end = sliding_windows(np.array([3, 10, 5]), 4, 0.5)
    assert list(zip(row, start, end, strict=True)) == [
        (0, 0, 3),
        (1, 0, 4),
        (1, 2, 6),
        (1, 4, 8),
        (1, 6, 10),
        (2, 0, 4),  # length 5: starts 1 and 0
        (2, 1, 5),
    ]
    row, start, end = sliding_windows(np.array([3, 10]), 4, 0.0)  # only the last N items
    assert list(zip(row, start, end, strict=True)) == [(0, 0, 3), (1, 6, 10)]


def _seqs(n_users: int = 64, seed: int = 0, min_len: int = 1) -> Sequences:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, 60, size=n_users)
    return Sequences.from_lists([list(rng.integers(1, 101, size=n)) for n in lengths], n_items=100)


def _rows(sampler: ClozeSampler, epoch: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(items of the sample, masked flags) per sample, padding removed."""
    out = []
    for b in sampler.epoch(epoch):
        flat_targets = iter(b.targets.tolist())
        for inputs, masked in zip(b.inputs.numpy(), b.positions.numpy(), strict=True):
            real = (inputs != 0) | masked
            items = inputs.copy()
            items[masked] = [next(flat_targets) for _ in range(int(masked.sum()))]
            out.append((items[real], masked[real]))
    return out


def test_cloze_masks_round_rho_times_length_items() -> None:
    seqs = _seqs()
    cfg = ClozeConfig(mask_prob=0.2, max_predictions=8, last_item_ratio=0.0, sliding_step=0.0)
    sampler = ClozeSampler(seqs, max_len=50, cfg=cfg, batch_size=16, seed=3)
    rows = _rows(sampler)
    assert len(rows) == 64 and len(sampler) == 4
    lengths = np.array([len(items) for items, _ in rows])
    n_masked = np.array([m.sum() for _, m in rows])
    expected = np.clip(np.floor(np.minimum(seqs.lengths, 50) * 0.2 + 0.5), 1, 8)
    # at least one, at most max_predictions, round(ρ * length) in between (half rounds up)
    assert sorted(zip(lengths, n_masked, strict=True)) == sorted(
        zip(np.minimum(seqs.lengths, 50), expected, strict=True)
    )
    # the inputs hold [MASK] exactly at the masked positions
    for b in sampler.epoch(0):
        assert (b.inputs[b.positions] == 101).all() and (b.inputs[~b.positions] != 101).all()


def test_targets_are_the_original_items() -> None:
    rng = np.random.default_rng(0)
    lists = [list(rng.integers(1, 101, size=n)) for n in range(1, 30)]  # distinct lengths
    seqs = Sequences.from_lists(lists, n_items=100)
    sampler = ClozeSampler(seqs, max_len=80, batch_size=8, seed=0)
    for items, _ in _rows(sampler):
        assert items.tolist() == lists[len(items) - 1]


def test_mask_last_samples_mask_only_the_last_item() -> None:
    seqs = _seqs(40, min_len=20)  # Cloze masks >= 4 items of these
    cfg = ClozeConfig(mask_prob=0.2, last_item_ratio=0.25, sliding_step=0.0)
    sampler = ClozeSampler(seqs, max_len=80, cfg=cfg, batch_size=16, seed=0)
    assert sampler.n_last == 10
    rows = _rows(sampler)
    only_last = [m[-1] and m.sum() == 1 for _, m in rows]
    assert len(rows) == 50 and sum(only_last) == 10
    assert all(m.sum() >= 4 for (_, m), last in zip(rows, only_last, strict=True) if not last)


def test_fresh_masks_each_epoch_and_seeded() -> None:
    seqs = _seqs()
    a = ClozeSampler(seqs, max_len=50, batch_size=16, seed=1)
    b = ClozeSampler(seqs, max_len=50, batch_size=16, seed=1)
    e0 = [x.positions for x in a.epoch(0)]
    assert all(torch.equal(x, y.positions) for x, y in zip(e0, b.epoch(0), strict=True))
    e1 = [x.positions for x in a.epoch(1)]
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(e0, e1, strict=True))


def test_random_replace_option() -> None:
    seqs = _seqs(200)
    cfg = ClozeConfig(mask_prob=0.5, max_predictions=100, random_replace=True, last_item_ratio=0)
    sampler = ClozeSampler(seqs, max_len=80, cfg=cfg, batch_size=256, seed=0)
    (b,) = list(sampler.epoch(0))
    assert int(b.positions.sum()) > 2000
    at_masked = b.inputs[b.positions]
    share_mask = float((at_masked == 101).float().mean())
    share_kept = float((at_masked == b.targets).float().mean())
    assert 0.77 < share_mask < 0.83 and 0.08 < share_kept < 0.13  # 80 % / 10 % (+ chance)


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="mask_prob"):
        ClozeSampler(_seqs(), max_len=50, cfg=ClozeConfig(mask_prob=0.0))


# ------------------------------------------------------------------ SASRec's next-item batches


def test_next_item_batches_shift_by_one_hand_computed() -> None:
    # user 0: 5 3 8 -> inputs 5 3, targets 3 8; user 1 (one item) gives no sample;
    # user 2: 1 2 3 4 5 6 with n = 3 -> the last 3 pairs: inputs 3 4 5, targets 4 5 6
    seqs = Sequences.from_lists([[5, 3, 8], [7], [1, 2, 3, 4, 5, 6]], n_items=9)
    sampler = NextItemSampler(seqs, max_len=3, batch_size=8, seed=0, n_negatives=0)
    (b,) = list(sampler.epoch(0))
    got = sorted(
        (tuple(i.tolist()), tuple(t.tolist()))
        for i, t in zip(b.inputs, torch.where(b.positions, _scatter(b), 0), strict=True)
    )
    assert got == [((0, 5, 3), (0, 3, 8)), ((3, 4, 5), (4, 5, 6))]
    assert b.negatives is None and len(sampler) == 1


def _scatter(b) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The targets back in their (B, L) positions."""
    out = torch.zeros_like(b.inputs)
    out[b.positions] = b.targets
    return out


def test_next_item_sliding_windows_cover_long_histories() -> None:
    seqs = Sequences.from_lists([list(range(1, 11))], n_items=10)  # 9 (input, target) pairs
    cfg = NextItemConfig(sliding_step=0.5)
    sampler = NextItemSampler(seqs, max_len=4, cfg=cfg, batch_size=8, seed=0, n_negatives=0)
    (b,) = list(sampler.epoch(0))
    # windows over the pairs: starts 5, 3, 1 and 0 (stride 2)
    assert sorted(tuple(r.tolist()) for r in b.inputs) == [
        (1, 2, 3, 4),
        (2, 3, 4, 5),
        (4, 5, 6, 7),
        (6, 7, 8, 9),
    ]


@pytest.mark.parametrize("per", ["position", "sequence"])
def test_negatives_never_hit_the_sequence_and_are_seeded(per: str) -> None:
    # user u holds items from its own block 10u+1..10u+10 (with repeats), so any input item
    # tells whose sequence a sample is; the catalogue is 1..100
    rng = np.random.default_rng(2)
    lists = [
        list(rng.integers(10 * u + 1, 10 * u + 11, size=int(rng.integers(2, 40))))
        for u in range(10)
    ]
    seqs = Sequences.from_lists(lists, n_items=100)

    def batches() -> list:  # type: ignore[type-arg]
        s = NextItemSampler(
            seqs, max_len=30, batch_size=4, seed=5, n_negatives=7, negatives_per=per
        )
        return list(s.epoch(0))

    a, b = batches(), batches()
    assert all(torch.equal(x.negatives, y.negatives) for x, y in zip(a, b, strict=True))
    for batch in a:
        n_rows = int(batch.positions.sum()) if per == "position" else batch.size
        assert batch.negatives.shape == (n_rows, 7)
        rows = (
            torch.nonzero(batch.positions)[:, 0] if per == "position" else torch.arange(batch.size)
        )
        user = (batch.inputs[:, -1] - 1) // 10  # (B,) whose sequence each sample is
        for r, negs in zip(rows.tolist(), batch.negatives.tolist(), strict=True):
            assert all(1 <= n <= 100 for n in negs)
            assert not set(negs) & set(lists[int(user[r])])  # never an item of the sequence


def test_draw_negatives_hand_checked() -> None:
    # catalogue 1..4; row 0 holds 1 2 3 -> its only possible negative is 4
    rng = np.random.default_rng(0)
    out = draw_negatives(rng, np.array([[1, 2, 3], [0, 0, 4]]), np.array([0, 0, 1]), 5, 4)
    assert (out[:2] == 4).all() and set(out[2].tolist()) <= {1, 2, 3}
    with pytest.raises(ValueError, match="every item"):
        draw_negatives(rng, np.array([[1, 2, 3, 4]]), np.array([0]), 1, 4)


def test_cloze_negatives_for_the_sampled_losses() -> None:
    # BERT4Rec with a sampled loss: k negatives per masked position, none in its window
    seqs = _seqs(30, seed=4)
    sampler = ClozeSampler(seqs, max_len=50, batch_size=8, seed=0, n_negatives=3)
    for b in sampler.epoch(0):
        assert b.negatives is not None and b.negatives.shape == (len(b.targets), 3)
        rows = torch.nonzero(b.positions)[:, 0]
        for r, negs in zip(rows.tolist(), b.negatives.tolist(), strict=True):
            window = set(_scatter(b)[r].tolist()) | set(b.inputs[r].tolist())
            assert not set(negs) & window
    assert next(iter(ClozeSampler(seqs, max_len=50, batch_size=8).epoch(0))).negatives is None


def test_epoch_loss_norm_weighs_every_position_the_same() -> None:
    seqs = _seqs(n_users=100, seed=3, min_len=2)
    grouped = NextItemConfig(bucket_batches=4, loss_norm="epoch")
    sampler = NextItemSampler(seqs, max_len=20, cfg=grouped, batch_size=8, seed=0, n_negatives=0)
    batches = list(sampler.epoch(0))
    counts = np.array([int(b.positions.sum()) for b in batches])
    mean = counts.sum() / len(batches)  # target positions per batch over the epoch
    assert sampler.mean_targets == pytest.approx(mean)
    for b, m in zip(batches, counts, strict=True):
        # the batch mean times loss_scale = the batch sum / the epoch's mean count
        assert b.loss_scale == pytest.approx(m / mean)
    assert counts.min() < counts.max()  # grouping made batches of different sizes
    plain = NextItemSampler(seqs, max_len=20, batch_size=8, seed=0, n_negatives=0)
    assert {b.loss_scale for b in plain.epoch(0)} == {1.0}


# ------------------------------------------------------------------ packed next-item batches


def test_pack_rows_hand_computed() -> None:
    # total 12, longest 5 -> 3 rows; longest first in snake order: rows 0, 1, 2, then 2 again
    row, offset, width = pack_rows(np.array([5, 3, 2, 2]))
    assert row.tolist() == [0, 1, 2, 2] and offset.tolist() == [0, 0, 0, 2] and width == 5
    # 10 items, longest 7 -> 2 rows; dealt 7 (row 0), 1 (row 1), then back: 1 (row 1), 1 (row 0)
    row, offset, width = pack_rows(np.array([1, 7, 1, 1]))
    assert row.tolist() == [1, 0, 1, 0] and offset.tolist() == [0, 0, 1, 7] and width == 8


def test_pack_rows_never_overlaps() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 200, size=int(rng.integers(1, 130)))
        row, offset, width = pack_rows(lengths)
        taken = np.zeros((int(row.max()) + 1, width), dtype=np.int64)
        for r, o, n in zip(row, offset, lengths, strict=True):
            taken[r, o : o + n] += 1
        assert taken.max() == 1 and taken.sum() == lengths.sum()  # every item one slot
        assert taken.size < 1.5 * lengths.sum() + lengths.max()


def _unpacked_pairs(b) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    """(inputs, targets) of every sequence of a batch, padding dropped, packed or not."""
    targets = _scatter(b)
    if b.segments is None:
        rows = [(i[i != 0], t[i != 0]) for i, t in zip(b.inputs, targets, strict=True)]
    else:
        rows = [
            (b.inputs[b.segments == s], targets[b.segments == s])
            for s in b.segments.unique().tolist()
            if s
        ]
    return sorted((tuple(i.tolist()), tuple(t.tolist())) for i, t in rows)


def test_packed_batches_hold_the_same_sequences_and_positions() -> None:
    seqs = _seqs(n_users=100, seed=5, min_len=2)
    plain = NextItemSampler(seqs, max_len=30, batch_size=16, seed=1, n_negatives=0)
    packed = NextItemSampler(
        seqs, max_len=30, cfg=NextItemConfig(pack=True), batch_size=16, seed=1, n_negatives=0
    )
    n_slots = n_plain = 0
    for a, b in zip(plain.epoch(0), packed.epoch(0), strict=True):
        assert _unpacked_pairs(a) == _unpacked_pairs(b)
        assert b.size == a.size == len(_unpacked_pairs(a))  # sequences, not rows
        assert b.inputs.shape[0] < b.size
        assert b.segments is not None and b.position_ids is not None
        # positions as in a left-padded row of width N = 30: the last item of each is 29
        for s in b.segments.unique().tolist():
            if s:
                pos = b.position_ids[b.segments == s]
                assert pos.tolist() == list(range(30 - len(pos), 30))
        n_slots += b.inputs.numel()
        n_plain += a.inputs.numel()
    assert n_slots < 0.8 * n_plain


def test_packed_negatives_avoid_their_own_sequence() -> None:
    rng = np.random.default_rng(2)
    lists = [
        list(rng.integers(10 * u + 1, 10 * u + 11, size=int(rng.integers(2, 40))))
        for u in range(10)
    ]
    seqs = Sequences.from_lists(lists, n_items=100)
    cfg = NextItemConfig(pack=True)
    s = NextItemSampler(seqs, max_len=30, cfg=cfg, batch_size=4, seed=5, n_negatives=7)
    for b in s.epoch(0):
        assert b.negatives is not None and b.negatives.shape == (len(b.targets), 7)
        user = (b.inputs[b.positions] - 1) // 10  # every item tells whose sequence it is
        for u, negs in zip(user.tolist(), b.negatives.tolist(), strict=True):
            assert not set(negs) & set(lists[u])
    with pytest.raises(ValueError, match="pack"):
        NextItemSampler(seqs, max_len=30, cfg=cfg, n_negatives=7, negatives_per="sequence")


# ------------------------------------------------------------------ packed Cloze batches


def _cloze_samples(b) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    """(inputs, masked positions as 0/1, position ids) of every sample, padding dropped."""
    if b.segments is None:
        real = b.inputs != 0
        width = b.inputs.shape[1]
        pos = torch.arange(60 - width, 60).expand_as(b.inputs)  # N = 60, counted from the end
        rows = [
            (i[r], m[r], p[r]) for i, m, p, r in zip(b.inputs, b.positions, pos, real, strict=True)
        ]
    else:
        rows = [
            (
                b.inputs[b.segments == s],
                b.positions[b.segments == s],
                b.position_ids[b.segments == s],
            )
            for s in b.segments.unique().tolist()
            if s
        ]
    return sorted(tuple(tuple(t.int().tolist()) for t in r) for r in rows)  # type: ignore[misc]


def test_packed_cloze_batches_hold_the_same_samples_masks_and_targets() -> None:
    seqs = _seqs(n_users=100, seed=7)
    cfg = ClozeConfig(bucket_batches=1, max_predictions=5)
    plain = ClozeSampler(seqs, max_len=60, cfg=cfg, batch_size=16, seed=3)
    packed = ClozeSampler(
        seqs,
        max_len=60,
        cfg=ClozeConfig(bucket_batches=1, max_predictions=5, pack=True),
        batch_size=16,
        seed=3,
    )
    n_slots = n_plain = 0
    for a, b in zip(plain.epoch(0), packed.epoch(0), strict=True):
        assert _cloze_samples(a) == _cloze_samples(b)
        assert b.size == a.size == a.inputs.shape[0] and b.inputs.shape[0] <= b.size
        assert sorted(a.targets.tolist()) == sorted(b.targets.tolist())
        # targets in row-major order of the masked slots: the items hidden under [MASK]
        assert b.segments is not None
        assert (b.inputs[b.positions] == seqs.n_items + 1).all()
        n_slots += b.inputs.numel()
        n_plain += a.inputs.numel()
    assert n_slots < 0.8 * n_plain


def test_packed_cloze_negatives_avoid_their_own_sample() -> None:
    rng = np.random.default_rng(4)
    lists = [
        list(rng.integers(10 * u + 1, 10 * u + 11, size=int(rng.integers(2, 40))))
        for u in range(10)
    ]
    seqs = Sequences.from_lists(lists, n_items=100)
    cfg = ClozeConfig(bucket_batches=1, pack=True)
    for b in ClozeSampler(seqs, max_len=40, cfg=cfg, batch_size=4, seed=5, n_negatives=7).epoch(0):
        assert b.negatives is not None and b.negatives.shape == (len(b.targets), 7)
        user = (b.targets - 1) // 10  # every item tells whose sequence it is
        for u, negs in zip(user.tolist(), b.negatives.tolist(), strict=True):
            assert not set(negs) & set(lists[u])


def test_popularity_negatives_follow_the_weights_and_skip_seen_and_weightless_items() -> None:
    rng = np.random.default_rng(0)
    weights = np.array([0.0, 1.0, 2.0, 0.0, 4.0, 1.0])  # item 3 has no weight: never drawn
    cdf = np.cumsum(weights) / weights.sum()
    seqs = np.array([[0, 1], [0, 0]])  # sample 0 holds item 1; sample 1 holds nothing
    n = 40_000  # rows per sample: frequencies within ~0.002 (one standard deviation)
    rows = np.array([0] * n + [1] * n)
    out = draw_negatives(rng, seqs, rows, 5, 5, cdf)
    assert not (out[:n] == 1).any() and not (out == 3).any() and not (out == 0).any()
    # sample 1: items 1, 2, 4, 5 in proportion 1 : 2 : 4 : 1; sample 0: 2, 4, 5 as 2 : 4 : 1
    freq1 = np.bincount(out[n:].ravel(), minlength=6)[[1, 2, 4, 5]] / out[n:].size
    assert np.allclose(freq1, [1 / 8, 2 / 8, 4 / 8, 1 / 8], atol=0.01)
    freq0 = np.bincount(out[:n].ravel(), minlength=6)[[2, 4, 5]] / out[:n].size
    assert np.allclose(freq0, [2 / 7, 4 / 7, 1 / 7], atol=0.01)
    # a sequence holding every item with weight: refused, not an endless redraw
    with pytest.raises(ValueError, match="holds every item"):
        draw_negatives(rng, np.array([[1, 2, 4, 5]]), np.array([0]), 1, 5, cdf)


def test_shared_negatives_are_distinct_and_each_item_drawn_k_in_v_times() -> None:
    rng = np.random.default_rng(0)
    draws = np.stack([draw_shared_negatives(rng, 3, 6) for _ in range(3000)])  # (3000, 3)
    assert draws.min() >= 1 and draws.max() <= 6
    assert all(len(set(row)) == 3 for row in draws.tolist())  # without replacement
    share = np.bincount(draws.ravel(), minlength=7)[1:] / len(draws)  # P(item in the sample)
    assert np.allclose(share, 3 / 6, atol=0.03)  # q = k / V, the logQ correction's
    with pytest.raises(ValueError, match="catalogue has 6 items"):
        draw_shared_negatives(rng, 7, 6)
    # by weight: an item of weight 0 is never drawn
    cdf = np.cumsum([0.0, 1.0, 0.0, 1.0]) / 2.0
    assert set(draw_shared_negatives(rng, 50, 3, cdf).tolist()) == {1, 3}


@pytest.mark.parametrize("task", ["cloze", "next_item"])
def test_per_batch_negatives_one_seeded_set_per_batch(task: str) -> None:
    seqs = _seqs(40, seed=6)

    def sampler() -> ClozeSampler | NextItemSampler:
        if task == "cloze":
            return ClozeSampler(
                seqs, max_len=20, batch_size=8, seed=3, n_negatives=5, negatives_per="batch"
            )
        return NextItemSampler(
            seqs, max_len=20, batch_size=8, seed=3, n_negatives=5, negatives_per="batch"
        )

    a, b = list(sampler().epoch(0)), list(sampler().epoch(0))
    assert all(torch.equal(x.negatives, y.negatives) for x, y in zip(a, b, strict=True))
    for batch in a:
        assert batch.negatives.shape == (5,) and len(set(batch.negatives.tolist())) == 5
        assert int(batch.negatives.min()) >= 1 and int(batch.negatives.max()) <= seqs.n_items
    assert len({tuple(x.negatives.tolist()) for x in a}) > 1  # a fresh set per batch
    with pytest.raises(ValueError, match="position or batch"):
        ClozeSampler(seqs, max_len=20, n_negatives=5, negatives_per="sequence")
