"""Evaluate any scorer under the three candidate protocols, from one seeded split.

- `full`:   the target is ranked against every item; the user's other history items (the input
            history) are excluded, as is the padding id 0.
- `uni100`: against 100 negatives drawn uniformly from the items the user has not interacted with
            by the split's target — SASRec §IV-D. Test: every item of the user's sequence is
            excluded. Validation: the items up to and including the validation target; the test
            item, still in the future then, may be drawn (excluding it would leak it).
- `pop100`: the same pool, negatives drawn in proportion to popularity — BERT4Rec §4.2. Popularity
            is counted over the whole dataset, as the original BERT4Rec code does.

Negatives are drawn without replacement (Gumbel top-k), once per split and seed, and stored with
the prepared data so every model is ranked against the same candidates.

Ties: a candidate whose score equals the target's counts as ranked above it (the pessimistic
rank). A constant scorer therefore gets the worst rank, never a lucky one.

Non-finite scores never help the target: a NaN or infinite target score ranks last, and a NaN
rival counts as ranked above the target (as a +inf one does). A diverged model therefore gets the
worst rank under every protocol, never a perfect one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import polars as pl
import torch

from seqrec.data.candidates import (
    N_NEGATIVES,
    PROTOCOLS,
    SAMPLED_PROTOCOLS,
    item_popularity,
    sample_negatives,
)
from seqrec.data.preprocess import Sequences, left_pad, left_pad_times
from seqrec.data.split import EvalSet
from seqrec.errors import DataError
from seqrec.evaluation.blocks import BlockScores
from seqrec.evaluation.metrics import DEFAULT_KS, paired_test, summarize
from seqrec.progress import Progress
from seqrec.provenance import atomic_write

if TYPE_CHECKING:
    from seqrec.data.prepared import PreparedDataset
    from seqrec.data.split import Split

__all__ = [
    "N_NEGATIVES",
    "compare_reports",
    "PROTOCOLS",
    "SAMPLED_PROTOCOLS",
    "BlockScorer",
    "EvalReport",
    "Scorer",
    "evaluate",
    "full_ranks",
    "item_popularity",
    "load_ranks",
    "pad_histories",
    "parse_protocols",
    "sample_negatives",
    "save_ranks",
    "score_plan",
]


class Scorer(Protocol):
    """Anything that scores every item for a batch of histories.

    `max_len`: how many most-recent items the scorer looks at (None: all).
    `score(histories, users)`: histories (B, L) int64, left-padded with 0, most recent item last,
    and users (B,) int64, the internal index of each history's user in the training data (-1: a
    user the scorer never saw), or None when no history has a known user -> scores
    (B, n_items + 1) float; column 0 (padding) is ignored. Scorers without a per-user term
    ignore `users`. A scorer whose `uses_times` is true (HSTU's time bias) is also given
    `times=` (B, L + 1) int64 seconds (`pad_times`).
    """

    @property
    def max_len(self) -> int | None: ...

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor: ...


class BlockScorer(Scorer, Protocol):
    """A scorer that can also give its scores a block of items at a time (`BlockScores`), for
    catalogues whose (rows, catalogue) score matrix would be too large: a model whose score is a
    dot product with its output layer (`SequenceModel.blockwise`)."""

    @property
    def blockwise(self) -> bool: ...

    def block_scores(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> BlockScores: ...


def score_plan(
    scorer: Scorer, n_items: int, batch_size: int, scores_bytes: int | None = None
) -> tuple[int, int | None]:
    """How a batch of histories is scored: (rows per call, items per block, or None when each
    call scores the whole catalogue). Whole rows while at least `BLOCK_ROWS` rows (or the
    batch) fit in `scores_bytes` (default `SCORES_BYTES`); past that, a blockwise scorer keeps
    `batch_size` rows and reads the catalogue in blocks of that many bytes (its output layer is
    then read once per batch, not once per few rows), and any other scorer takes fewer rows."""
    budget = SCORES_BYTES if scores_bytes is None else scores_bytes
    whole = budget // (4 * (n_items + 1))
    if whole >= min(batch_size, BLOCK_ROWS) or not getattr(scorer, "blockwise", False):
        return max(1, min(batch_size, whole)), None
    return batch_size, max(1, budget // (4 * batch_size))


def parse_protocols(text: str | Sequence[str]) -> tuple[str, ...]:
    names = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    bad = [p for p in names if p not in PROTOCOLS]
    if bad or not names:
        raise ValueError(
            f"unknown protocol {', '.join(bad) or '(none)'}; expected {', '.join(PROTOCOLS)}"
        )
    return tuple(dict.fromkeys(names))


def pad_histories(seqs: Sequences, rows: np.ndarray, max_len: int | None = None) -> np.ndarray:
    """(B, L) the last L items of each row's sequence, left-padded with 0 (most recent last).
    L = the longest selected history, capped at max_len."""
    starts, ends = seqs.offsets[rows], seqs.offsets[rows + 1]
    longest = int((ends - starts).max()) if len(rows) else 0
    width = max(1, longest if max_len is None else min(longest, max_len))
    return left_pad(seqs.items, starts, ends, width)


def pad_times(
    seqs: Sequences, rows: np.ndarray, width: int, query: np.ndarray | None
) -> np.ndarray:
    """(B, width + 1) int64: the times of `pad_histories`' items (0 for padding), then each
    row's `query` time, the time its recommendation is for (a model that `uses_times`)."""
    if seqs.times is None or query is None:
        raise ValueError("the model reads when each item happened: these histories have no times")
    return left_pad_times(seqs.times, seqs.offsets[rows], seqs.offsets[rows + 1], width, query)


def times_argument(
    scorer: Scorer, eval_set: EvalSet, rows: np.ndarray, width: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """{"times": `pad_times` of the rows, the target's time the query's} for a scorer that
    `uses_times`, else {}: the keyword argument its `score` takes."""
    if not getattr(scorer, "uses_times", False):
        return {}
    query = None if eval_set.target_times is None else eval_set.target_times[rows]
    at = pad_times(eval_set.histories, rows, width, query)
    return {"times": torch.from_numpy(at).to(device)}


# At most `batch_size` histories are scored per call, and fewer on a large catalogue: so many
# that one call's (rows, n_items + 1) float32 scores stay within this many bytes. A larger block
# is a fresh allocation above glibc's mmap threshold (32 MB at most) on every call, paid again in
# page faults each time (benchmarks/speed.py eval-speed measures a whole validation pass).
SCORES_BYTES = 16 << 20
# Fewer whole-catalogue rows than this per call (a catalogue over 65,535 items), and a blockwise
# scorer reads the catalogue in blocks instead (`score_plan`)
BLOCK_ROWS = 64


@dataclass
class EvalReport:
    split: str
    users: np.ndarray  # (E,) internal user index
    ranks: dict[str, np.ndarray]  # protocol -> (E,) 0-based rank of the target
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # protocol -> name -> value
    # a sampled protocol -> metric -> its value with each candidate draw, the stored draw first
    # (`evaluate(more_negatives=...)`); empty when the stored draw alone was ranked against
    draws: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def over_draws(self) -> dict[str, dict[str, dict[str, float]]]:
        """A sampled protocol -> metric -> {"mean", "std", "min", "max", "draws"} over the
        candidate draws (`draws`); std is the sample standard deviation (0 for one draw)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for protocol, by_metric in self.draws.items():
            out[protocol] = {}
            for metric, values in by_metric.items():
                v = np.asarray(values, dtype=np.float64)
                out[protocol][metric] = {
                    "mean": float(v.mean()),
                    "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                    "min": float(v.min()),
                    "max": float(v.max()),
                    "draws": len(v),
                }
        return out

    def metrics_with_draws(self) -> dict[str, dict[str, float]]:
        """`metrics`, where a sampled protocol was ranked against several candidate draws with
        `<metric>_mean` and `<metric>_std` over them beside each metric (the stored draw's)."""
        spread = self.over_draws()
        out: dict[str, dict[str, float]] = {}
        for protocol, values in self.metrics.items():
            out[protocol] = dict(values)
            for metric, s in spread.get(protocol, {}).items():
                out[protocol][f"{metric}_mean"] = s["mean"]
                out[protocol][f"{metric}_std"] = s["std"]
        return out


def full_ranks(scores: torch.Tensor, t_score: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    """(B,) how many items rank at or above the target (its score `t_score`, (B, 1)) in `scores`
    (B, V), leaving out the padding id 0 and the ids in `excluded` (B, H): the history and the
    target itself, repeats allowed. A rival counts as above when its score is >= the target's or
    NaN, i.e. when it is not below it.

    One pass over the (B, V) scores: every item not below the target is counted, then those of
    the (small) excluded set, each distinct id once, are taken off again. A row's rank is
    therefore the same as masking the excluded items out of the whole row, at a fraction of the
    cost on a large catalogue (validation of a time-budgeted run pays it every few epochs).
    """
    not_below = scores.shape[1] - (scores < t_score).sum(1, dtype=torch.int32)
    ex = torch.cat([torch.zeros_like(excluded[:, :1]), excluded], 1).sort(1).values
    distinct = torch.ones_like(ex, dtype=torch.bool)
    distinct[:, 1:] = ex[:, 1:] != ex[:, :-1]
    return (not_below - (~(scores.gather(1, ex) < t_score) & distinct).sum(1)).long()


def _block_full_ranks(
    blocks: BlockScores, width: int, t_score: torch.Tensor, excluded: torch.Tensor
) -> torch.Tensor:
    """`full_ranks` over scores read a block of items at a time: in each block, the items not
    below the target's score, the excluded ones (and the padding column) left out. The target
    is among the excluded, so its own column never counts, whatever the rounding of the block's
    product against the target's own score."""
    ex = torch.cat([torch.zeros_like(excluded[:, :1]), excluded], 1)
    rank = torch.zeros(ex.shape[0], dtype=torch.int64, device=ex.device)
    for lo, block in blocks.blocks(width):
        c = block.shape[1]
        local = ex - lo
        local = torch.where((local >= 0) & (local < c), local, c)  # outside: a spare column
        out = torch.zeros(block.shape[0], c + 1, dtype=torch.bool, device=block.device)
        out.scatter_(1, local, True)
        rank += (~(block < t_score) & ~out[:, :c]).sum(1)
    return rank


def _check_candidates(
    protocols: Sequence[str],
    eval_set: EvalSet,
    negatives: Mapping[str, np.ndarray] | None,
    more_negatives: Sequence[Mapping[str, np.ndarray]],
) -> None:
    """Every sampled protocol has its candidates, for every user, in `negatives` and in each of
    `more_negatives` (a ValueError line otherwise)."""
    n_eval = len(eval_set.targets)
    for p in protocols:
        if p in SAMPLED_PROTOCOLS and (negatives is None or p not in negatives):
            raise ValueError(
                f"protocol {p} needs the stored negatives of the {eval_set.split} split"
            )
    for i, more in enumerate(more_negatives):
        for p in protocols:
            if p in SAMPLED_PROTOCOLS and (p not in more or more[p].shape[0] != n_eval):
                raise ValueError(
                    f"more_negatives[{i}]: no {p} candidates for each of {n_eval} users"
                )


@torch.no_grad()
def evaluate(
    scorer: Scorer,
    eval_set: EvalSet,
    *,
    protocols: Sequence[str] = PROTOCOLS,
    negatives: Mapping[str, np.ndarray] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool = False,
    more_negatives: Sequence[Mapping[str, np.ndarray]] = (),
) -> EvalReport:
    """Rank every user's target under each protocol; metrics are means over users. The
    histories go to `device`; None: the scorer's own (its `device`, e.g. a model's weights'),
    else the CPU. `more_negatives`: other draws of the sampled protocols' candidates (each like
    `negatives`), ranked against from the same scores; the report's `draws` then holds each
    sampled protocol's metrics with `negatives` and with every one of them."""
    protocols = parse_protocols(protocols)
    device = torch.device(device if device is not None else getattr(scorer, "device", "cpu"))
    _check_candidates(protocols, eval_set, negatives, more_negatives)
    hist = eval_set.histories
    n_eval = len(eval_set.targets)
    sampled = [p for p in protocols if p in SAMPLED_PROTOCOLS]
    ranks = {p: np.zeros(n_eval, dtype=np.int64) for p in protocols}
    # per sampled protocol, the ranks against each further draw
    draw_ranks = {p: [np.zeros(n_eval, dtype=np.int64) for _ in more_negatives] for p in sampled}
    # Group users by history length so each batch pads little; results go back to user order.
    order = np.argsort(hist.lengths, kind="stable")
    bar = Progress(n_eval, f"evaluate {eval_set.split}", unit="user", enabled=progress)
    bar.note(f"evaluate {eval_set.split}: {n_eval:,} users under {', '.join(protocols)}")
    step, width = score_plan(scorer, hist.n_items, batch_size)
    for lo in range(0, n_eval, step):
        rows = order[lo : lo + step]
        inputs = torch.from_numpy(pad_histories(hist, rows, scorer.max_len)).to(device)
        users = torch.from_numpy(eval_set.users[rows]).to(device)
        targets = torch.from_numpy(eval_set.targets[rows]).to(device)
        times = times_argument(scorer, eval_set, rows, inputs.shape[1], device)
        if width is None:
            scores = scorer.score(inputs, users, **times).float()  # (B, V)
            gather: Callable[[torch.Tensor], torch.Tensor] = partial(torch.gather, scores, 1)
        else:
            blocks = cast("BlockScorer", scorer).block_scores(inputs, users, **times)
            gather = blocks.pairs
        t_score = gather(targets[:, None])  # (B, 1)
        # a non-finite target score ranks last: every candidate ties or beats -inf
        t_score = torch.where(torch.isfinite(t_score), t_score, -torch.inf)
        for p in protocols:
            if p == "full":
                seen = torch.from_numpy(pad_histories(hist, rows)).to(device)  # whole history
                excluded = torch.cat([seen, targets[:, None]], 1)
                if width is None:
                    rank = full_ranks(scores, t_score, excluded)
                else:
                    rank = _block_full_ranks(blocks, width, t_score, excluded)
            else:
                assert negatives is not None
                rank = _sampled_ranks(gather, t_score, negatives[p][rows], device)
                for d, more in enumerate(more_negatives):
                    r = _sampled_ranks(gather, t_score, more[p][rows], device)
                    draw_ranks[p][d][rows] = r.cpu().numpy()
            ranks[p][rows] = rank.cpu().numpy()
        bar.update(len(rows))
    bar.close()
    report = EvalReport(split=eval_set.split, users=eval_set.users, ranks=ranks)
    for p in protocols:
        report.metrics[p] = summarize(ranks[p], ks)
    if more_negatives:
        for p in sampled:
            each = [report.metrics[p], *(summarize(r, ks) for r in draw_ranks[p])]
            report.draws[p] = {m: [d[m] for d in each] for m in report.metrics[p]}
    return report


def _sampled_ranks(
    gather: Callable[[torch.Tensor], torch.Tensor],
    t_score: torch.Tensor,
    candidates: np.ndarray,
    device: torch.device,
) -> torch.Tensor:
    """(B,) how many of each row's candidates (B, N) (0: none, padding) score at or above the
    target (its score `t_score`, (B, 1)); `gather` reads the scores of ids (B, N)."""
    negs = torch.from_numpy(candidates).to(device).long()
    return (~(gather(negs) < t_score) & (negs != 0)).sum(1)


def save_ranks(report: EvalReport, path: Path, user_ids: Sequence[Any] | None = None) -> None:
    """Every user's 0-based rank per protocol, as Parquet (columns: user, rank_<protocol>).
    `user` is the external id when `user_ids` is given, else the internal index."""
    users = report.users if user_ids is None else pl.Series(user_ids)[report.users].to_list()
    table = pl.DataFrame({"user": users, **{f"rank_{p}": r for p, r in report.ranks.items()}})
    buf = io.BytesIO()
    table.write_parquet(buf)
    atomic_write(path, lambda f: f.write(buf.getvalue()))


def load_ranks(path: Path) -> dict[str, np.ndarray]:
    """protocol -> (E,) ranks, in the file's user order."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: rank file not found")
    try:
        table = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(
            f"{path}: not a rank file (Parquet from `evaluate --save-ranks`): {first}"
        ) from None
    ranks = {
        c.removeprefix("rank_"): table[c].to_numpy() for c in table.columns if c.startswith("rank_")
    }
    if not ranks:
        raise DataError(f"{path}: no rank_<protocol> column; not a rank file of seqrec evaluate")
    return ranks


def compare_reports(
    reports: Mapping[str, EvalReport], metric: str = "ndcg@10"
) -> dict[str, dict[str, dict[str, float]]]:
    """Each report against the first one, user by user: {name: {protocol: paired_test(first,
    name)}} for every other report and every protocol both hold. The reports must rank the same
    users of the same split."""
    names = list(reports)
    if len(names) < 2:
        raise ValueError("compare needs at least two results")
    base = reports[names[0]]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in names[1:]:
        other = reports[name]
        if other.split != base.split or not np.array_equal(other.users, base.users):
            raise ValueError(f"{name}: not evaluated on the same users as {names[0]}")
        out[name] = {
            p: paired_test(base.ranks[p], other.ranks[p], metric)
            for p in base.ranks
            if p in other.ranks
        }
    return out


def evaluate_split(
    ds: PreparedDataset,
    scorer: Scorer,
    split: Split = "test",
    *,
    protocols: Sequence[str] = PROTOCOLS,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    progress: bool = False,
    sample_users: int = 0,
    seed: int = 42,
    draws: int = 1,
) -> EvalReport:
    """Evaluate a scorer on one split of a prepared dataset against its stored candidates;
    `sample_users`, `seed`: see `PreparedDataset.eval_data`. `draws` > 1: the sampled protocols
    ranked against that many candidate draws as well (`candidate_draws`), the report's `draws` and
    `over_draws()` holding each draw's metrics and their mean and spread."""
    eval_set, negatives = ds.eval_data(split, sample_users, seed)
    more = ds.candidate_draws(split, draws, sample_users, seed)[1:] if draws > 1 else []
    return evaluate(
        scorer,
        eval_set,
        protocols=protocols,
        negatives=negatives,
        ks=ks,
        batch_size=batch_size,
        device=device,
        progress=progress,
        more_negatives=more,
    )
