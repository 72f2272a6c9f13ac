"""Use a trained run: top-k items for any history, including one the model never saw.

    rec = Recommender.from_run("runs/sasrec")
    rec.recommend([1193, 661, 914], k=10)            # [(item, score), ...], external ids
    rec.recommend_batch([[1193, 661], [], [914]])     # vectorised
    rec.recommend_user(42)                            # a user of the training data

Policies (each tested):
- unknown item ids in a history are dropped and counted (`unknown="drop"`), or raise
  `UnknownItemsError` (`unknown="reject"`);
- an empty (or all-unknown) history gets the popularity ranking of the training split; its
  scores are the training interaction counts, on another scale than a model's, so an answer
  marks it (`POPULARITY`: the Python frames' `scored_by`, the service's `scored_by`);
- a history longer than the model reads keeps its most recent items (`max_len`);
- the model decides how a history is read: BERT4Rec appends [MASK], SASRec reads the last
  position. The scores are exactly those evaluation ranks by (`model.score`);
- `exclude_seen` removes the history's items; `candidates` restricts the ranking to a set;
  `exclude` removes a set (ids the model does not know are ignored: nothing to remove), and so
  does `Recommender.exclude_items` for every call (items out of stock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from seqrec.data.ids import IdCodec
from seqrec.data.prepared import PreparedDataset
from seqrec.data.preprocess import left_pad
from seqrec.errors import ConfigError, SeqrecError
from seqrec.evaluation.protocols import SCORES_BYTES, score_plan
from seqrec.progress import Progress
from seqrec.serving.files import run_data
from seqrec.serving.index import ItemIndex, csr, masked_top, run_index
from seqrec.serving.scoring import (
    Clock,
    block_top,
    clock,
    history_inputs,
    index_top,
    seconds,
)
from seqrec.training.checkpoint import Run, load_run
from seqrec.training.rundir import RunDir

__all__ = [
    "Encoded",
    "Recommender",
    "UnknownItemsError",
]

Unknown = Literal["drop", "reject"]
# how an answer was scored: by the model, or (an empty history) by the training popularity
MODEL, POPULARITY = "model", "popularity"


class UnknownItemsError(SeqrecError, ValueError):
    """A history holds item ids the model does not know, under `unknown="reject"`."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)
        shown = ", ".join(map(str, self.items[:10])) + (" ..." if len(self.items) > 10 else "")
        super().__init__(f"{len(self.items)} unknown item id(s): {shown}")


@dataclass
class Encoded:
    """A history in internal ids (most recent last) and the external ids that were dropped."""

    ids: np.ndarray  # (n,) int64 in 1..n_items
    unknown: list[Any]
    kept: np.ndarray | None = None  # (len(history),) bool: the items kept, where some were not


class Recommender:
    """Top-k recommendation over a trained run. Thread-safe for concurrent calls."""

    def __init__(
        self,
        run: Run,
        popularity: np.ndarray,
        *,
        dataset: PreparedDataset | None = None,
        metadata: dict[str, dict[str, Any]] | None = None,
        unknown: Unknown = "drop",
        device: str | torch.device = "cpu",
        # histories scored at once; on 2 CPU cores 32-128 were fastest for both ML-1M models
        # (length-sorted batches pad less and stay in cache; docs/results/performance.md)
        batch_size: int = 64,
        bf16: bool = False,
    ) -> None:
        if unknown not in ("drop", "reject"):
            raise ConfigError(f"unknown = {unknown!r}: expected drop or reject")
        self.run = run
        self.model = run.model.to(device).eval()
        self.device = torch.device(device)
        self.items = IdCodec(run.item_ids, start=1)  # external <-> internal item ids
        self.item_ids = self.items.ids
        self.n_items = len(self.items)
        self.popularity = np.asarray(popularity, dtype=np.float32)  # (n_items + 1,), [0] unused
        self.dataset = dataset
        self._users: IdCodec | None = None  # the training users, built on first use
        self.metadata = metadata
        self.unknown = unknown
        self.batch_size = batch_size
        self.scores_bytes = SCORES_BYTES  # a batch's (rows, catalogue) scores at most
        # score under bfloat16 autocast (docs/results/performance.md measures its top-10 agreement)
        self.bf16 = bf16
        self.max_len: int | None = getattr(self.model, "max_len", None)
        self._lock = threading.Lock()
        self.dropped = 0  # unknown item ids dropped so far (unknown="drop")
        self.excluded: np.ndarray = np.zeros(0, dtype=np.int64)  # internal ids never recommended
        self.index: ItemIndex | None = None  # approximate top-k (seqrec.serving.index)
        # the catalogue on disk this one was loaded from (RunDir.catalogue_stamp), and how it
        # was loaded: what `refresh` compares and loads again with
        self.stamp: tuple[int, int, int] | None = None
        self.trust = False
        self.exact = False

    # -------------------------------------------------------------------------- loading

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        *,
        device: str | torch.device = "cpu",
        unknown: Unknown = "drop",
        metadata: str | Path | None = None,
        bf16: bool = False,
        trust: bool = False,
        exact: bool = False,
    ) -> Recommender:
        """The single load path (`checkpoint.load_run`) plus what recommending needs: the
        training popularity (stored in the run, else recomputed from its prepared data), the
        prepared data when it still exists (for `recommend_user`), item titles when the
        dataset provides them (ML-1M `movies.dat`) or `metadata` names such a file, and the
        run's item index (`seqrec index`; not with `exact`: every item scored)."""
        stamp = RunDir(run_dir).catalogue_stamp()  # before reading: a later change is seen
        run = load_run(run_dir, device=device, trust=trust)
        dataset, popularity, meta = run_data(run, trust=trust, metadata=metadata)
        rec = cls(
            run,
            popularity,
            dataset=dataset,
            metadata=meta,
            unknown=unknown,
            device=device,
            bf16=bf16,
        )
        rec.stamp, rec.trust, rec.exact = stamp, trust, exact
        if not exact and rec.model.blockwise:
            rec.index = run_index(run_dir, *rec.model.output_weights(), trust=trust)
        return rec

    # ------------------------------------------------------------------------ catalogue

    def add_items(
        self, table: Any, *, save: bool = True, neighbours: int | None = None
    ) -> list[Any]:
        """New items from an items table, scored from their features without retraining
        (seqrec.serving.catalogue.add_items); returns their ids."""
        from seqrec.serving.catalogue import add_items

        return add_items(self, table, save=save, neighbours=neighbours)

    def refresh(self) -> bool:
        """Load the run's catalogue again when another writer changed it since this one was
        loaded (seqrec.serving.catalogue.refresh); whether it did."""
        from seqrec.serving.catalogue import refresh

        return refresh(self)

    def use_catalogue(
        self,
        run: Run,
        popularity: np.ndarray,
        index: ItemIndex | None,
        stamp: tuple[int, int, int] | None,
    ) -> None:
        """Answer from another catalogue of the same run (grown, or loaded again), put in
        place at once: a request scored meanwhile sees the old one or the new one."""
        model = run.model.to(self.device).eval()
        items = IdCodec(run.item_ids, start=1)
        with self._lock:
            self.run, self.model, self.items = run, model, items
            self.item_ids, self.n_items = items.ids, len(items)
            self.popularity = np.asarray(popularity, dtype=np.float32)
            self.index, self.stamp = index, stamp

    def similar_items(self, items: Sequence[Any], k: int = 10) -> list[list[tuple[Any, float]]]:
        """The k items closest to each of `items` by the cosine of the model's output
        embeddings (item-to-item), with their cosines; one line for an unknown item or a k
        outside 1..n_items - 1."""
        weights, _ = self.model.output_weights()  # (n_items, D)
        unit = torch.nn.functional.normalize(weights.detach().float(), dim=1)
        ids, unknown = self.items.encode(items)  # 1-based
        if unknown:
            raise ConfigError(f"similar_items: unknown item(s) {list(unknown)[:5]}")
        if not 1 <= k < self.n_items:
            raise ConfigError(f"k must be in 1..{self.n_items - 1}, got {k}")
        with torch.no_grad():
            sims = unit[torch.as_tensor(ids - 1, device=unit.device)] @ unit.T  # (Q, n_items)
            sims[torch.arange(len(ids)), torch.as_tensor(ids - 1)] = -torch.inf  # not itself
            top = torch.topk(sims, k, dim=1)
        return [
            [(self.items.decode(i + 1), float(v)) for v, i in zip(vs, ix, strict=True)]
            for vs, ix in zip(top.values.cpu().tolist(), top.indices.cpu().tolist(), strict=True)
        ]

    # ------------------------------------------------------------------------- encoding

    def encode(self, history: Iterable[Any]) -> Encoded:
        """External ids -> internal ids under the unknown-item policy."""
        history = list(history)
        ids, unknown = self.items.encode(history)
        if unknown:
            if self.unknown == "reject":
                raise UnknownItemsError(unknown)
            with self._lock:
                self.dropped += len(unknown)
            return Encoded(ids, unknown, self.items.encode_rows(history) != 0)
        return Encoded(ids, unknown)

    def encode_batch(
        self, histories: Sequence[Sequence[Any]], times: Sequence[Sequence[int]] | None = None
    ) -> tuple[list[Encoded], list[np.ndarray] | None]:
        """`encode` of each history, and of its `times` (in its shape) those of the items kept."""
        if times is not None and len(times) != len(histories):
            raise ValueError(f"{len(times)} lists of times for {len(histories)} histories")
        encoded, kept = [], []
        for r, h in enumerate(histories):
            enc = self.encode(h)
            encoded.append(enc)
            if times is not None:
                t = seconds(times[r], f"history {r}'s times")
                if t.shape != (len(enc.ids) + len(enc.unknown),):
                    raise ValueError(f"history {r}: {t.size} times for {len(h)} items")
                kept.append(t if enc.kept is None else t[enc.kept])
        return encoded, None if times is None else kept

    def user_times(self, rows: Sequence[int]) -> list[np.ndarray] | None:
        """The times of the training data's users at `rows` (internal indices), for a model of
        time (`uses_times`) whose data has them; None otherwise."""
        seqs = None if self.dataset is None else self.dataset.sequences
        if not self.model.uses_times or seqs is None or seqs.times is None:
            return None
        return [seqs.times[seqs.offsets[r] : seqs.offsets[r + 1]] for r in rows]

    def internal_ids(self, items: Iterable[Any]) -> np.ndarray:
        return self.encode(items).ids

    def exclude_items(self, items: Iterable[Any]) -> list[Any]:
        """Never recommend `items` (out of stock, withdrawn), in every later call, until the
        next call replaces the set (an empty one clears it). Returns the ids the model does
        not know (nothing to exclude for them)."""
        ids, unknown = self.items.encode(items)
        self.excluded = np.unique(ids)
        return list(unknown)

    # ------------------------------------------------------------------------ recommend

    def recommend(
        self,
        history: Sequence[Any],
        k: int = 10,
        exclude_seen: bool = True,
        candidates: Sequence[Any] | None = None,
        exclude: Sequence[Any] | None = None,
    ) -> list[tuple[Any, float]]:
        """The top-k items for one history (external ids, oldest first) with their scores."""
        return self.recommend_batch([history], k, exclude_seen, candidates, exclude=exclude)[0]

    def recommend_batch(
        self,
        histories: Sequence[Sequence[Any]],
        k: int = 10,
        exclude_seen: bool = True,
        candidates: Sequence[Any] | None = None,
        *,
        exclude: Sequence[Any] | None = None,
        progress: bool = False,
        users: Sequence[Any] | None = None,
        times: Sequence[Sequence[int]] | None = None,
        at: int | Sequence[int] | None = None,
    ) -> list[list[tuple[Any, float]]]:
        """`recommend` for many histories, scored in batches of `batch_size`. `users`: each
        history's user id; those of the training data give the models with a per-user term
        their user (the others, and every history without `users`, are anonymous). `times`,
        `at`: as `recommend_encoded`'s, `times` in the shape of `histories` (the times of
        unknown items dropped with them)."""
        encoded, kept_times = self.encode_batch(histories, times)
        ids = [e.ids for e in encoded]
        rows = None
        if users is not None:
            found = [self.user_index(u) for u in users]
            rows = [-1 if r is None else r for r in found]
        return self.recommend_encoded(
            ids,
            k,
            exclude_seen,
            candidates=candidates,
            exclude=exclude,
            progress=progress,
            users=rows,
            times=kept_times,
            at=at,
        )

    def recommend_user(
        self, user_id: Any, k: int = 10, exclude_seen: bool = True, at: int | None = None
    ) -> list[tuple[Any, float]]:
        """The top-k for a user of the training data, after everything the data holds of them
        (training, validation and test items); `at`: as `recommend_encoded`'s."""
        if self.dataset is None:
            raise ConfigError("recommend_user needs the run's prepared data, which is gone")
        row = self.user_index(user_id)
        if row is None:
            raise SeqrecError(f"user {user_id!r} is not in the training data")
        # the user's index goes with the history: models with a per-user term use it
        (recs,) = self.recommend_encoded(
            [self.dataset.sequences[row]],
            k,
            exclude_seen,
            users=[row],
            times=self.user_times([row]),
            at=at,
        )
        return recs

    def user_rows(self, users: Iterable[Any]) -> list[int]:
        """The internal indices of users of the training data; one not there is a ConfigError
        line naming it."""
        rows = []
        for u in users:
            row = self.user_index(u)
            if row is None:
                raise ConfigError(f"user {u!r} is not in the training data")
            rows.append(row)
        return rows

    def user_index(self, user_id: Any) -> int | None:
        """The internal index of a user of the training data (an int id also matches its string
        form), or None: not there, or the run's prepared data is gone."""
        if self.dataset is None:
            return None
        if self._users is None:
            self._users = IdCodec(self.dataset.user_ids, start=0)
        return self._users.lookup(user_id)

    def recommend_encoded(
        self,
        histories: Sequence[np.ndarray],
        k: int = 10,
        exclude_seen: bool = True,
        *,
        candidates: Sequence[Any] | None = None,
        exclude: Sequence[Any] | None = None,
        progress: bool = False,
        users: Sequence[int] | None = None,
        deadline: float | None = None,
        times: Sequence[np.ndarray] | None = None,
        at: int | Sequence[int] | None = None,
    ) -> list[list[tuple[Any, float]]]:
        """Top-k for histories already in internal ids. `users`: each history's user index in
        the training data (-1: unknown), for the models with a per-user term; without it every
        history is taken as anonymous (those models then leave their user term out).
        `deadline` (time.monotonic()): past it, a TimeoutError before the next batch. `times`,
        `at`: each history's items' times and the time its recommendation is for (one for
        all or one a history; seconds since the epoch; default: now), read by a model that
        `uses_times` (which needs `times`) and ignored by the others."""
        if users is not None and len(users) != len(histories):
            raise ValueError(f"{len(users)} users for {len(histories)} histories")
        clocks = None
        if self.model.uses_times:
            clocks = clock(type(self.model).__name__, histories, times, at)
        if not 1 <= k <= self.n_items:
            raise ValueError(f"k must be in 1..{self.n_items} (the catalogue), got {k}")
        allowed = self._allowed(candidates, exclude)
        out: list[list[tuple[Any, float]]] = [[] for _ in histories]
        # batches of similar lengths pad little; the answers go back to the input order
        order = np.argsort([len(h) for h in histories], kind="stable")
        bar = Progress(len(histories), "recommend", enabled=progress, unit="history")
        # rows a batch, so that its (rows, catalogue) scores stay within evaluation's bound; a
        # catalogue too large for that is read in blocks of items (evaluate.score_plan)
        step, width = score_plan(self.model, self.n_items, self.batch_size, self.scores_bytes)
        for lo in range(0, len(histories), step):
            if deadline is not None and time.monotonic() > deadline:
                bar.close()
                raise TimeoutError(f"stopped after {lo} of {len(histories)} histories")
            rows = order[lo : lo + step]
            items, starts, ends = csr([histories[r] for r in rows])
            user_rows = None if users is None else np.asarray(users, dtype=np.int64)[rows]
            when = None if clocks is None else ([clocks[0][r] for r in rows], clocks[1][rows])
            # every item of the whole history, not only the last max_len
            seen = (
                torch.from_numpy(
                    left_pad(items, starts, ends, max(1, int((ends - starts).max())))
                ).to(self.device)
                if exclude_seen
                else None
            )
            top = None
            if self.index is not None and candidates is None:
                top = index_top(self, items, starts, ends, user_rows, k, seen, allowed, when)
            if top is None and width is None:
                scores = self._scores(items, starts, ends, user_rows, when)  # (B, n + 1)
                top = masked_top(scores, 0, k, seen, allowed)
            elif top is None and width is not None:
                top = block_top(self, items, starts, ends, user_rows, k, width, seen, allowed, when)
            assert top is not None
            values, indices = top[0].cpu().numpy(), top[1].cpu().numpy()
            for r, v_row, i_row in zip(rows, values, indices, strict=True):
                keep = np.isfinite(v_row)  # fewer than k items may remain
                out[r] = [
                    (self.items.decode(i), float(v))
                    for i, v in zip(i_row[keep], v_row[keep], strict=True)
                ]
            bar.update(len(rows))
        bar.close()
        return out

    def _allowed(
        self, candidates: Sequence[Any] | None, exclude: Sequence[Any] | None
    ) -> torch.Tensor | None:
        """The items a call may recommend, a mask over the catalogue (None: every one): the
        `candidates` (unknown ones: the policy's error), less `exclude` (unknown ones ignored)
        and the items excluded for every call."""
        removed = self.excluded
        if exclude is not None:
            removed = np.concatenate([removed, self.items.encode(exclude)[0]])
        if candidates is None and not len(removed):
            return None
        allowed = torch.ones(self.n_items + 1, dtype=torch.bool, device=self.device)
        if candidates is not None:
            allowed[:] = False
            allowed[torch.from_numpy(self.encode(candidates).ids).to(self.device)] = True
        allowed[torch.from_numpy(removed).to(self.device)] = False
        return allowed

    @torch.no_grad()
    def scores(self, histories: Sequence[np.ndarray]) -> torch.Tensor:
        """(B, n_items + 1) scores for internal-id histories; column 0 is -inf. Empty histories
        get the training popularity counts."""
        return self._scores(*csr(histories))

    def _scores(
        self,
        items: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        users: np.ndarray | None = None,
        when: Clock | None = None,
    ) -> torch.Tensor:
        lengths = ends - starts
        inputs, times = history_inputs(self, items, starts, ends, when)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            user_t = None if users is None else torch.from_numpy(users).to(self.device)
            scores = self.model.score(inputs, user_t, times).float()
        empty = torch.from_numpy(lengths == 0).to(self.device)
        if bool(empty.any()):
            pop = torch.from_numpy(self.popularity).to(self.device)
            scores[empty] = pop
            scores[empty, 0] = -torch.inf
        return scores

    # ------------------------------------------------------------------------ metadata

    def describe(self, item: Any) -> dict[str, Any] | None:
        """Title and genres of an item when the dataset provides them, else None."""
        if self.metadata is None:
            return None
        return self.metadata.get(str(item))

    def info(self) -> dict[str, Any]:
        """What is being served: model, dataset, metrics, sizes."""
        cfg = self.run.config
        m = self.run.metrics or {}
        return {
            "model": cfg.model,
            "loss": cfg.train.loss,
            "run_dir": str(self.run.path),
            "dataset": m.get("dataset"),
            "n_items": self.n_items,
            "max_len": self.max_len,
            # whether a known user's id changes the answer (BPR-MF, FPMC, Caser: a per-user term)
            "per_user_term": bool(getattr(self.model, "uses_users", False)),
            "metrics": {"test": m.get("test"), "valid": m.get("valid")},
            "best_epoch": m.get("best_epoch"),
            "git_commit": m.get("git_commit"),
            "unknown_items": self.unknown,
        }
