"""The HTTP service, started for real on 127.0.0.1 and called over HTTP: answers equal the
library's, bad input gets a 4xx saying what was wrong, concurrent requests are served correctly."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqrec.serving.recommender import Recommender

uvicorn = pytest.importorskip("uvicorn")  # the `serve` extra (installed by the dev extra)
from seqrec.serving.service import create_app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_up(url: str, tries: int) -> None:
    """Poll `url` every 50 ms until it answers (or `tries` run out)."""
    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.05)


@contextmanager
def _running(app: Any, log_level: str = "error") -> Iterator[str]:
    """Serve `app` on a free local port in a thread; yield its URL once /health answers."""
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(url + "/health", tries=200)
    try:
        yield url
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module", params=["drop", "reject"])
def server(
    request: pytest.FixtureRequest, tiny_runs: dict[str, Path]
) -> Iterator[tuple[str, Recommender]]:
    rec = Recommender.from_run(tiny_runs["sasrec"], unknown=request.param)
    with _running(create_app(rec, max_history=50)) as url:
        yield url, rec


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


def test_model_counts_the_micro_batches(server: tuple[str, Recommender]) -> None:
    url, rec = server
    before = _call(url, "/model")[1]["micro_batching"]
    assert _call(url, "/recommend", {"history": rec.item_ids[:3], "k": 2})[0] == 200
    after = _call(url, "/model")[1]["micro_batching"]
    # one request alone: one batch of one, scored in a positive time
    assert (after["batches"], after["requests"]) == (before["batches"] + 1, before["requests"] + 1)
    assert after["scoring_s"] > before["scoring_s"]


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


def test_the_guards_direct_route_answers_as_the_app_does(server: tuple[str, Recommender]) -> None:
    """POST /recommend is answered by the guard itself (past FastAPI's routing); a request with
    an Origin header goes through the app. Both give the same status and the same body, for
    good and bad requests alike."""
    url, rec = server

    def both(raw: bytes) -> list[tuple[int, Any]]:
        out = []
        for headers in ({}, {"Origin": "https://example.org"}):
            req = urllib.request.Request(
                url + "/recommend",
                data=raw,
                headers={"Content-Type": "application/json", **headers},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    out.append((r.status, json.loads(r.read())))
            except urllib.error.HTTPError as e:
                out.append((e.code, json.loads(e.read())))
        return out

    bodies: list[Any] = [
        {"history": rec.item_ids[:3], "k": 4},
        {"history": [rec.item_ids[0], "nope"], "k": 2},
        {"user": "nobody", "k": 3},
        {"history": "1,2,3"},
        {"history": [], "k": 0},
        {"history": [], "kk": 3},
        {"history": rec.item_ids[:1] * 51},
        {"k": 5},
    ]
    raws = [json.dumps(b).encode() for b in bodies] + [b"{not json", b"[1, 2]", b'{"k": NaN}']
    for raw in raws:
        direct, through_app = both(raw)
        assert direct[0] == through_app[0], raw
        if direct[0] == 200:
            assert direct[1]["dropped"] == through_app[1]["dropped"]
            assert [r["item"] for r in direct[1]["items"]] == [
                r["item"] for r in through_app[1]["items"]
            ]
        else:
            assert direct[1] == through_app[1], raw


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


# ------------------------------------------------------------------ a service that holds

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def guarded(tiny_runs: dict[str, Path]) -> Iterator[tuple[str, Recommender]]:
    """A server with every protection on and small limits; `["slow"]` sleeps 3 s, `["boom"]`
    raises inside the model call."""
    from seqrec.serving.service import ServeOptions

    rec = Recommender.from_run(tiny_runs["sasrec"])
    real = rec.recommend_encoded

    def instrumented(histories: Any, *args: Any, **kwargs: Any) -> Any:
        if histories and list(histories[0][:1]) == [-1]:
            raise RuntimeError("secret internals: /etc/passwd line 3")
        if histories and list(histories[0][:1]) == [-2]:
            time.sleep(3)
        return real(histories, *args, **kwargs)

    rec.recommend_encoded = instrumented  # type: ignore[method-assign]
    real_encode = rec.encode

    def encode(history: Any) -> Any:  # "boom"/"slow" reach the model as the ids -1/-2
        enc = real_encode([h for h in history if h not in ("boom", "slow")])
        marker = [-1] if "boom" in history else [-2] if "slow" in history else []
        enc.ids = np.asarray(marker + list(enc.ids), dtype=np.int64)  # as encode returns it
        return enc

    rec.encode = encode  # type: ignore[method-assign]
    options = ServeOptions(max_history=50, max_batch=4, max_body=2000, timeout=1.0, api_key=TOKEN)
    with _running(create_app(rec, options), log_level="critical") as url:
        yield url, rec


def _auth_call(
    url: str,
    path: str,
    body: Any = None,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any, dict[str, str]]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    h = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=data, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_the_bearer_token_is_required_except_for_the_probes(
    guarded: tuple[str, Recommender],
) -> None:
    url, rec = guarded
    body = {"history": rec.item_ids[:2], "k": 3}
    assert _auth_call(url, "/recommend", body, token=None)[0] == 401
    status, out, headers = _auth_call(url, "/recommend", body, token="wrong")
    assert status == 401 and out == {"detail": "missing or wrong bearer token"}
    assert headers.get("www-authenticate") == "Bearer"
    assert _auth_call(url, "/model", token=None)[0] == 401
    assert _auth_call(url, "/recommend", body)[0] == 200
    assert _auth_call(url, "/health", token=None)[:2] == (200, {"status": "ok"})
    assert _auth_call(url, "/ready", token=None)[:2] == (200, {"status": "ready"})


def test_limits_timeouts_and_failures_are_short_json_answers(
    guarded: tuple[str, Recommender],
) -> None:
    url, rec = guarded
    big = json.dumps({"history": ["x" * 50] * 60}).encode()
    status, out, _ = _auth_call(url, "/recommend", raw=big)
    assert status == 413 and out == {"detail": "request body over 2000 bytes"}
    five = {"histories": [rec.item_ids[:1]] * 5, "k": 2}
    assert _auth_call(url, "/recommend/batch", five)[0] == 422  # over max_batch 4
    status, out, _ = _auth_call(url, "/recommend", {"history": ["boom"]})
    assert status == 500 and out == {"detail": "internal error"}  # no trace, no internals
    start = time.perf_counter()
    status, out, _ = _auth_call(url, "/recommend", {"history": ["slow"]})
    assert status == 504 and out == {"detail": "the request took longer than 1 s"}
    assert time.perf_counter() - start < 2.5
    # the model scores one batch at a time: the slow call holds it for its 3 s; what waits
    # behind it past its own deadline gets its 504 too, and is then not scored
    status, out, _ = _auth_call(url, "/recommend", {"history": rec.item_ids[:2]})
    assert status == 504
    time.sleep(max(0.0, 3.5 - (time.perf_counter() - start)))
    assert _auth_call(url, "/recommend", {"history": rec.item_ids[:2]})[0] == 200


def test_cors_is_closed_by_default(guarded: tuple[str, Recommender]) -> None:
    url, rec = guarded
    _, _, headers = _auth_call(
        url, "/recommend", {"history": []}, headers={"Origin": "https://evil.example"}
    )
    assert not any(k.lower().startswith("access-control-") for k in headers)


def test_a_slow_client_does_not_block_the_others(guarded: tuple[str, Recommender]) -> None:
    url, rec = guarded
    host, port = url.removeprefix("http://").split(":")
    slow = socket.create_connection((host, int(port)))
    slow.sendall(
        b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"history": ['
    )  # ... and never the rest
    try:
        start = time.perf_counter()
        for _ in range(20):
            assert _auth_call(url, "/recommend", {"history": rec.item_ids[:3], "k": 2})[0] == 200
        assert time.perf_counter() - start < 5
        slow.settimeout(10)
        answer = slow.recv(4096)  # the stalled request is answered by the timeout
        assert b" 504 " in answer.split(b"\r\n")[0]
    finally:
        slow.close()


def test_fuzzed_json_gets_only_2xx_or_4xx(guarded: tuple[str, Recommender]) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    url, rec = guarded
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=5),
        st.sampled_from(rec.item_ids[:5]),
    )
    value = st.recursive(
        leaf,
        lambda c: st.one_of(
            st.lists(c, max_size=4), st.dictionaries(st.text(max_size=5), c, max_size=3)
        ),
        max_leaves=12,
    )
    body = st.one_of(
        value,
        st.fixed_dictionaries(
            {"history": value}, optional={"k": value, "exclude_seen": value, "candidates": value}
        ),
        st.fixed_dictionaries({"histories": value}, optional={"k": value}),
    )

    @settings(
        max_examples=int(__import__("os").environ.get("SEQREC_FUZZ_EXAMPLES", "60")),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(path=st.sampled_from(["/recommend", "/recommend/batch"]), body=body)
    def check(path: str, body: Any) -> None:
        status, out, _ = _auth_call(url, path, raw=json.dumps(body).encode())
        assert 200 <= status < 500, (status, out)
        assert "Traceback" not in json.dumps(out)

    check()


SIGTERM_SERVER = r"""
import sys, time
import uvicorn
from seqrec.serving.recommender import Recommender
from seqrec.serving.service import create_app

rec = Recommender.from_run(sys.argv[1])
real = rec.recommend_encoded

def slow(*args, **kwargs):
    time.sleep(1.5)
    return real(*args, **kwargs)

rec.recommend_encoded = slow
uvicorn.run(create_app(rec), host="127.0.0.1", port=int(sys.argv[2]), log_level="error")
"""


def test_sigterm_finishes_the_requests_in_flight(tiny_runs: dict[str, Path]) -> None:
    import signal
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SERVER, str(tiny_runs["sasrec"]), str(port)]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url + "/ready", tries=400)
        with ThreadPoolExecutor(2) as pool:
            pending = pool.submit(_call, url, "/recommend", {"history": [], "k": 2})
            time.sleep(0.5)  # the request is inside the model call now
            proc.send_signal(signal.SIGTERM)
            status, out = pending.result(timeout=30)
        assert status == 200 and len(out["items"]) == 2
        # uvicorn exits after the graceful shutdown, re-raising the signal it caught
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_body_of_infinity_or_nan_is_a_422_not_a_500(server: tuple[str, Recommender]) -> None:
    url, _ = server
    for raw in (b"Infinity", b"NaN", b'{"history": [1], "k": Infinity}'):
        status, out = _call(url, "/recommend", raw=raw)
        assert status == 422, (raw, status, out)
        assert all(set(e) <= {"loc", "msg", "type"} for e in out["detail"])


def test_a_known_user_changes_a_per_user_model_and_an_unknown_one_is_anonymous(
    tiny_runs: dict[str, Path],
) -> None:
    rec = Recommender.from_run(tiny_runs["caser"])
    assert rec.dataset is not None
    user, history = rec.dataset.user_ids[3], rec.item_ids[:5]
    with _running(create_app(rec)) as url:
        assert _call(url, "/model")[1]["per_user_term"] is True
        status, mine = _call(url, "/recommend", {"history": history, "k": 4, "user": user})
        want = rec.recommend_encoded([rec.encode(history).ids], 4, users=[3])[0]
        assert status == 200 and mine["user_known"] is True
        assert [r["item"] for r in mine["items"]] == [i for i, _ in want]
        status, anon = _call(url, "/recommend", {"history": history, "k": 4, "user": "nobody"})
        assert status == 200 and anon["user_known"] is False
        assert [r["item"] for r in anon["items"]] == [i for i, _ in rec.recommend(history, k=4)]
        assert [r["score"] for r in anon["items"]] != [r["score"] for r in mine["items"]]
        _, plain = _call(url, "/recommend", {"history": history, "k": 4})
        assert "user_known" not in plain and plain["items"] == anon["items"]


def test_a_known_user_is_asked_for_by_id_alone(tiny_runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(tiny_runs["sasrec"])
    assert rec.dataset is not None
    user = rec.dataset.user_ids[5]
    with _running(create_app(rec)) as url:
        status, out = _call(url, "/recommend", {"user": user, "k": 5})
        assert status == 200 and out["user_known"] is True
        assert [r["item"] for r in out["items"]] == [i for i, _ in rec.recommend_user(user, k=5)]
        status, err = _call(url, "/recommend", {"user": "nobody", "k": 5})
        assert status == 422
        assert err["detail"].startswith('user "nobody" is not a user of the training data')
        assert _call(url, "/recommend", {"k": 5})[0] == 422


def test_the_openapi_schema_types_the_answers_with_examples(
    server: tuple[str, Recommender],
) -> None:
    url, _ = server
    status, schema = _call(url, "/openapi.json")
    assert status == 200
    ok = schema["paths"]["/recommend"]["post"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/Recommendations")
    answer = schema["components"]["schemas"]["Recommendations"]
    assert set(answer["properties"]) == {"items", "dropped", "user_known", "scored_by"}
    assert "example" in answer and answer["example"]["items"][0]["score"] == 3.21
    batch = schema["paths"]["/recommend/batch"]["post"]["responses"]["200"]["content"]
    assert batch["application/json"]["schema"]["$ref"].endswith("/BatchRecommendations")


def _post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    """POST exactly these bytes and headers (urllib adds a form Content-Type of its own)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_both_http_paths_answer_every_request_alike(server: tuple[str, Recommender]) -> None:
    """POST /recommend is answered by the guard's fast route or, for a cross-origin request,
    by FastAPI's: the same checks (content type, body shape, sizes), the same status and body.
    `Content-Type: text/plain` once answered 200 on the fast route and 422 on FastAPI's."""
    url, rec = server
    good = json.dumps({"history": rec.item_ids[:3], "k": 2}).encode()
    cases: list[tuple[bytes, str | None, int | None]] = [
        (good, "text/plain", 422),
        (good, "application/x-www-form-urlencoded", 422),
        (good, "multipart/form-data; boundary=x", 422),
        (good, "application/xml", 422),
        (good, None, None),  # no Content-Type: FastAPI's to read (strictly: 422, from 0.132)
        (good, "application/json; charset=utf-8", 200),
        (good, "application/vnd.api+json", 200),
        (b"{not json", "application/json", 422),
        (b"", "application/json", 422),
        (b"[]", "application/json", 422),
        (b'{"history": [], "k": 0}', "application/json", 422),
        (b'{"history": [], "k": 1e400}', "application/json", 422),
        (b'{"history": [], "k": NaN}', "application/json", 422),
        (b'{"history": "1,2"}', "application/json", 422),
        (b'{"history": [], "extra": 1}', "application/json", 422),
        (b'{"history": ["\\ud800"]}', "application/json", 422),
        (b'{"history": [], "candidates": []}', "application/json", None),
        (b'{"user": "nobody-at-all"}', "application/json", None),
        (json.dumps({"history": rec.item_ids[:1] * 51}).encode(), "application/json", 413),
        (json.dumps({"history": ["no-such-item"]}).encode(), "application/json", None),
    ]
    for body, kind, status in cases:
        headers = {} if kind is None else {"Content-Type": kind}
        fast = _post(url, "/recommend", body, headers)
        app = _post(url, "/recommend", body, {**headers, "Origin": "http://elsewhere.example"})
        assert fast == app, (body[:60], kind)
        if status is not None:
            assert fast[0] == status, (body[:60], kind, fast)


def test_exclusions_per_request_and_for_every_request(tiny_runs: dict[str, Path]) -> None:
    """`exclude` per request (single and batch) beside the allow-list, `exclude_items` for
    every request (items out of stock); an empty history's answer is marked as popularity."""
    from seqrec.serving.service import ServeOptions

    rec = Recommender.from_run(tiny_runs["sasrec"])
    history = rec.item_ids[:4]
    top = [i for i, _ in rec.recommend(history, k=6)]
    gone = top[0]
    with _running(create_app(rec, ServeOptions(exclude_items=(gone, "not-an-item")))) as url:
        status, out = _call(url, "/recommend", {"history": history, "k": 5})
        assert status == 200 and [r["item"] for r in out["items"]] == top[1:6]
        assert out["scored_by"] == "model"
        body = {"history": history, "k": 3, "exclude": [top[1], "unknown-id"]}
        status, out = _call(url, "/recommend", body)
        assert status == 200 and [r["item"] for r in out["items"]] == top[2:5]
        body = {"histories": [history, []], "k": 3, "exclude": [top[1]]}
        status, out = _call(url, "/recommend/batch", body)
        assert status == 200 and [r["item"] for r in out["results"][0]["items"]] == top[2:5]
        assert [r["scored_by"] for r in out["results"]] == ["model", "popularity"]
        assert gone not in [r["item"] for r in out["results"][1]["items"]]


def test_the_docs_page_is_served_by_the_app_with_no_cdn(server: tuple[str, Recommender]) -> None:
    """/docs loads Swagger UI's script and style from the app itself: it works offline."""
    url, _ = server
    with urllib.request.urlopen(url + "/docs", timeout=10) as r:
        page = r.read().decode()
    assert "cdn" not in page.lower() and "https://" not in page
    assets = [a for a in ("swagger-ui-bundle.js", "swagger-ui.css") if f"/docs/assets/{a}" in page]
    assert len(assets) == 2
    for asset in assets:
        with urllib.request.urlopen(f"{url}/docs/assets/{asset}", timeout=10) as r:
            assert r.status == 200 and len(r.read()) > 10_000
    assert _call(url, "/redoc")[0] == 404  # ReDoc would load from a CDN: not served
