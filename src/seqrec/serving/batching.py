"""Dynamic micro-batching for the HTTP service: one-history requests that arrive while the
model is busy, or within `wait` seconds of each other, are scored as one batch.

Scoring one history of a transformer costs about as much as scoring a few dozen (the work is
per-call overhead and small matrix products), so under concurrent load the service answers many
requests for the price of one forward pass. The endpoint puts each request's encoded history on
a bounded queue and awaits its answer; one task takes what is queued (at most `max_size`),
scores it on one dedicated thread (the model is never run twice at once), and hands each
request its own top-k. Requests with different `k` or `exclude_seen` are scored in separate
groups of the same batch, so every answer is the one the request would get alone (up to the
last bits of the floating-point sums). A full queue is refused at once (`Overloaded`, a 503),
and a request whose deadline passed while it waited is not scored.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MicroBatcher", "Overloaded"]

Scored = list[tuple[Any, float]]
# histories, k, exclude_seen, users, times, at -> one top-k list per history
# (Recommender.recommend_encoded); times and at None but for a model of time (`uses_times`)
ScoreFn = Callable[
    [list[np.ndarray], int, bool, list[int], list[np.ndarray] | None, list[int] | None],
    list[Scored],
]
# a history's items' times and the time its recommendation is for, seconds (a model of time)
Clock = tuple[np.ndarray, int]


class Overloaded(Exception):
    """The queue is full: the request is refused rather than left to time out."""


@dataclass
class _Request:
    ids: np.ndarray
    k: int
    exclude_seen: bool
    user: int  # the user's row in the training data, -1: anonymous
    deadline: float | None  # time.monotonic()
    future: asyncio.Future[Scored]
    clock: Clock | None = None


class MicroBatcher:
    """Batches one-history requests for `score`. Create it inside the server's event loop's
    lifetime (the queue and the task start with the first request); `close` stops the task and
    the scoring thread."""

    def __init__(
        self, score: ScoreFn, *, max_size: int = 64, wait: float = 0.001, max_queue: int = 512
    ) -> None:
        if max_size < 1 or max_queue < 1 or wait < 0:
            raise ValueError("max_size and max_queue must be >= 1 and wait >= 0")
        self._score, self.max_size, self.wait, self.max_queue = score, max_size, wait, max_queue
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="seqrec-score")
        self._queue: asyncio.Queue[_Request] | None = None
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # scored so far, how many requests they held, and the seconds the
        self.requests = 0  # scoring thread spent on them (GET /model: `stats`)
        self.scoring_s = 0.0

    async def recommend(
        self,
        ids: np.ndarray,
        k: int,
        exclude_seen: bool,
        user: int,
        deadline: float | None,
        clock: Clock | None = None,
    ) -> Scored:
        """The top-k of one history, scored in a batch with whatever else is waiting (`clock`:
        with those that have times too, or those without)."""
        if self._queue is None:
            self._queue = asyncio.Queue(self.max_queue)
            self._task = asyncio.get_running_loop().create_task(self._loop())
        future: asyncio.Future[Scored] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Request(ids, k, exclude_seen, user, deadline, future, clock))
        except asyncio.QueueFull:
            raise Overloaded(f"{self.max_queue} requests are waiting to be scored") from None
        return await future

    async def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on the scoring thread (requests that are not batched: candidates, batches)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def _loop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            if self.wait > 0:
                await asyncio.sleep(self.wait)  # let the requests of the next moments join
            while len(batch) < self.max_size and not queue.empty():
                batch.append(queue.get_nowait())
            await self._answer(batch)

    async def _answer(self, batch: list[_Request]) -> None:
        now = time.monotonic()
        groups: dict[tuple[int, bool, bool], list[_Request]] = {}
        for r in batch:
            if r.future.done():  # its client went away, or it was answered with a 504
                continue
            if r.deadline is not None and now > r.deadline:
                r.future.set_exception(TimeoutError("the request waited past its deadline"))
                continue
            groups.setdefault((r.k, r.exclude_seen, r.clock is None), []).append(r)
        for (k, exclude_seen, untimed), rs in groups.items():
            histories, users = [r.ids for r in rs], [r.user for r in rs]
            clocks = [r.clock for r in rs if r.clock is not None]
            times = None if untimed else [c[0] for c in clocks]
            at = None if untimed else [c[1] for c in clocks]
            call = functools.partial(self._timed, histories, k, exclude_seen, users, times, at)
            try:
                answers = await self.run(call)
            except Exception as e:  # every request of the group learns it
                for r in rs:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            self.batches += 1
            self.requests += len(rs)
            for r, answer in zip(rs, answers, strict=True):
                if not r.future.done():
                    r.future.set_result(answer)

    def _timed(
        self,
        histories: list[np.ndarray],
        k: int,
        exclude_seen: bool,
        users: list[int],
        times: list[np.ndarray] | None = None,
        at: list[int] | None = None,
    ) -> list[Scored]:
        start = time.perf_counter()
        try:
            return self._score(histories, k, exclude_seen, users, times, at)
        finally:  # on the scoring thread, one batch at a time
            self.scoring_s += time.perf_counter() - start

    def stats(self) -> dict[str, float]:
        """Batches scored so far, the requests they held and the scoring thread's seconds on
        them: a mean batch size and how busy the model is (the rest of a request's time is the
        HTTP work around it)."""
        return {"batches": self.batches, "requests": self.requests, "scoring_s": self.scoring_s}

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
