"""The HTTP service, started for real on 127.0.0.1 and called over HTTP: answers equal the
library's, bad input gets a 4xx saying what was wrong, concurrent requests are served correctly."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from seqrec.recommender import Recommender

uvicorn = pytest.importorskip("uvicorn")  # the `serve` extra (installed by the dev extra)
from seqrec.serve import create_app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", params=["drop", "reject"])
def server(
    request: pytest.FixtureRequest, tiny_runs: dict[str, Path]
) -> Iterator[tuple[str, Recommender]]:
    rec = Recommender.from_run(tiny_runs["sasrec"], unknown=request.param)
    port = _free_port()
    config = uvicorn.Config(
        create_app(rec, max_history=50), host="127.0.0.1", port=port, log_level="error"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield url, rec
    srv.should_exit = True
    thread.join(timeout=10)


def _call(url: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_model_and_docs(server: tuple[str, Recommender]) -> None:
    url, rec = server
    assert _call(url, "/health") == (200, {"status": "ok"})
    status, info = _call(url, "/model")
    assert status == 200 and info["model"] == "sasrec" and info["n_items"] == rec.n_items
    assert "version" in info and "test" in info["metrics"]
    status, spec = _call(url, "/openapi.json")
    assert status == 200 and "/recommend" in spec["paths"] and "/recommend/batch" in spec["paths"]


def test_recommend_equals_the_library(server: tuple[str, Recommender]) -> None:
    url, rec = server
    history = rec.item_ids[:5]
    status, out = _call(url, "/recommend", {"history": history, "k": 4})
    assert status == 200 and out["dropped"] == []
    want = rec.recommend(history, k=4)
    assert [r["item"] for r in out["items"]] == [i for i, _ in want]
    assert [r["score"] for r in out["items"]] == pytest.approx([s for _, s in want], abs=1e-5)
    assert out["items"][0]["title"] == f"Movie {want[0][0]} (2000)"
    status, out = _call(url, "/recommend/batch", {"histories": [history, [], history[:1]], "k": 3})
    assert status == 200 and len(out["results"]) == 3
    assert [r["item"] for r in out["results"][1]["items"]] == [i for i, _ in rec.recommend([], k=3)]


def test_bad_input_gets_a_4xx_that_says_what(server: tuple[str, Recommender]) -> None:
    url, rec = server
    cases = [
        (_call(url, "/recommend", raw=b"{not json"), 422, "JSON"),
        (_call(url, "/recommend", {"history": "1,2,3"}), 422, "history"),
        (_call(url, "/recommend", {"history": [1.5]}), 422, "history"),
        (_call(url, "/recommend", {"history": [], "k": 0}), 422, "k"),
        (_call(url, "/recommend", {"history": [], "k": rec.n_items + 1}), 422, "k"),
        (_call(url, "/recommend", {"history": [], "kk": 3}), 422, "kk"),
        (_call(url, "/recommend", {"history": rec.item_ids[:1] * 51}), 413, "at most 50"),
    ]
    for (status, body), want_status, word in cases:
        assert status == want_status, body
        assert word in json.dumps(body["detail"]), body
    status, body = _call(url, "/recommend", {"history": [rec.item_ids[0], "nope"]})
    if rec.unknown == "reject":
        assert status == 422 and "1 unknown item id(s): nope" in body["detail"]
    else:
        assert status == 200 and body["dropped"] == ["nope"]


def test_concurrent_requests_are_answered_correctly(server: tuple[str, Recommender]) -> None:
    url, rec = server
    histories = [rec.item_ids[i : i + 1 + i % 7] for i in range(40)]
    want = [[i for i, _ in rec.recommend(h, k=5)] for h in histories]

    def ask(h: list[Any]) -> list[Any]:
        status, out = _call(url, "/recommend", {"history": h, "k": 5})
        assert status == 200
        return [r["item"] for r in out["items"]]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, histories * 3))
    assert got == want * 3
