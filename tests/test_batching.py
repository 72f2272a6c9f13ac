"""Dynamic micro-batching (seqrec.serving.batching): concurrent one-history requests are scored in
few calls, each gets its own answer, different k or exclude_seen never share a call, a full queue
is refused at once, and a request past its deadline is not scored."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from seqrec.serving.batching import MicroBatcher, Overloaded


class FakeModel:
    """Scores a history as its items' sum; records every call's (size, k, exclude_seen)."""

    def __init__(self, delay: float = 0.05) -> None:
        self.calls: list[tuple[int, int, bool]] = []
        self.delay = delay

    def __call__(
        self,
        histories: list[np.ndarray],
        k: int,
        exclude_seen: bool,
        users: list[int],
        times: Any = None,
        at: Any = None,
    ) -> list[list[tuple[Any, float]]]:
        self.calls.append((len(histories), k, exclude_seen))
        time.sleep(self.delay)  # the model is busy: the next requests queue up
        return [[(int(h.sum()) + u, float(k))] for h, u in zip(histories, users, strict=True)]


async def _ask(b: MicroBatcher, n: int, k: int = 10, exclude_seen: bool = True) -> Any:
    return await b.recommend(np.array([n, n]), k, exclude_seen, -1, None)


def test_concurrent_requests_share_calls_and_get_their_own_answers() -> None:
    model = FakeModel()
    b = MicroBatcher(model, max_size=8, wait=0.001)

    async def main() -> list[Any]:
        return await asyncio.gather(*(_ask(b, n) for n in range(20)))

    got = asyncio.run(main())
    b.close()
    assert got == [[(2 * n - 1, 10.0)] for n in range(20)]
    sizes = [size for size, _, _ in model.calls]
    assert sum(sizes) == 20 and max(sizes) <= 8 and len(sizes) <= 4  # 20 requests, <= 4 calls
    assert (b.batches, b.requests) == (len(sizes), 20)
    # each call slept 0.05 s on the scoring thread: the stats count that time, and only that
    stats = b.stats()
    assert (stats["batches"], stats["requests"]) == (len(sizes), 20)
    assert 0.05 * len(sizes) <= stats["scoring_s"] < 0.05 * len(sizes) + 0.5


def test_requests_with_other_k_or_exclude_seen_are_scored_apart() -> None:
    model = FakeModel()
    b = MicroBatcher(model, max_size=16, wait=0.01)

    async def main() -> list[Any]:
        asks = [_ask(b, 1, k=5), _ask(b, 2, k=10), _ask(b, 3, k=5, exclude_seen=False)]
        return await asyncio.gather(*asks)

    got = asyncio.run(main())
    b.close()
    assert got == [[(1, 5.0)], [(3, 10.0)], [(5, 5.0)]]
    assert sorted(model.calls) == [(1, 5, False), (1, 5, True), (1, 10, True)]


def test_a_full_queue_is_refused_and_a_late_request_is_not_scored() -> None:
    model = FakeModel(delay=0.2)
    b = MicroBatcher(model, max_size=1, wait=0.0, max_queue=2)

    async def main() -> list[Any]:
        first = asyncio.ensure_future(_ask(b, 1))  # taken by the scorer, which then is busy
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(b.recommend(np.array([7]), 10, True, -1, time.monotonic()))
        queued = asyncio.ensure_future(_ask(b, 2))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):  # two are waiting: a third is refused at once
            await _ask(b, 3)
        return await asyncio.gather(first, late, queued, return_exceptions=True)

    first, late, queued = asyncio.run(main())
    b.close()
    assert first == [(1, 10.0)] and queued == [(3, 10.0)]
    assert isinstance(late, TimeoutError)
    assert [size for size, _, _ in model.calls] == [1, 1]  # the late one never reached it


def test_bad_settings_are_refused() -> None:
    for bad in ({"max_size": 0}, {"max_queue": 0}, {"wait": -1.0}):
        with pytest.raises(ValueError):
            MicroBatcher(FakeModel(), **bad)  # type: ignore[arg-type]
