"""A service no client can tie up: `seqrec serve` started for real (its guarded connection layer,
seqrec.serving.guard) against idle, half-sent, chunked and hostile clients on 127.0.0.1, each case
bounded in count and time."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")  # the `serve` extra (installed by the dev extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serve(run: Path, *flags: str) -> Iterator[int]:
    """`seqrec serve RUN` in a process of its own; yields its port once /ready answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqrec", "serve", str(run), "--port", str(port), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError("the server exited") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _post(port: int, path: str, body: bytes, timeout: float = 10) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _idle_connections(port: int, n: int) -> list[socket.socket]:
    """`n` connections: half of them say nothing, half send half a request's headers."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            s.sendall(b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    return socks


def _closed(s: socket.socket, wait: float) -> bool:
    s.settimeout(wait)
    try:
        return s.recv(1024) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# the guard over both of uvicorn's HTTP parsers (seqrec.serving.guard.guarded_protocol)
PARSERS = ["httptools", "h11"] if importlib.util.find_spec("httptools") else ["h11"]


@pytest.mark.parametrize("http", PARSERS)
@pytest.mark.parametrize("cap", [None, "100"])
def test_600_idle_connections_do_not_keep_a_client_waiting(
    cap: str | None, http: str, tiny_runs: dict[str, Path]
) -> None:
    """600 idle and half-sent connections against one worker (with the default cap of 1000,
    and with a cap of 100 that evicts the longest idle): a normal client is served within 1 s."""
    flags = ["--http", http, *(["--max-connections", cap] if cap else [])]
    with _serve(tiny_runs["sasrec"], *flags) as port:
        socks = _idle_connections(port, 600)
        try:
            time.sleep(0.5)  # the server has accepted them all
            body = json.dumps({"history": [1, 2, 3], "k": 5}).encode()
            for _ in range(3):
                start = time.perf_counter()
                status, out = _post(port, "/recommend", body, timeout=5)
                assert status == 200 and len(out["items"]) == 5
                assert time.perf_counter() - start < 1.0
            if cap:  # the oldest idle connections were closed to admit the new ones
                assert _closed(socks[0], 2.0)
        finally:
            for s in socks:
                s.close()


@pytest.mark.parametrize("http", PARSERS)
def test_idle_and_half_sent_connections_are_closed_and_keep_alive_is_limited(
    http: str, tiny_runs: dict[str, Path]
) -> None:
    flags = ["--http", http, "--header-timeout", "1", "--max-requests-per-connection", "3"]
    with _serve(tiny_runs["sasrec"], *flags) as port:
        socks = _idle_connections(port, 40)
        try:
            time.sleep(1.5)
            assert all(_closed(s, 2.0) for s in socks)
        finally:
            for s in socks:
                s.close()
        # a keep-alive connection: 3 requests, then it is closed after the third response
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            for i in range(3):
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while not answer.endswith(b'{"status":"ok"}'):
                    chunk = s.recv(4096)
                    assert chunk, "closed before its third response"
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200")
                # the last response says so, for clients that keep connections open
                assert (b"connection: close" in answer.lower()) == (i == 2)
            assert _closed(s, 2.0)
        finally:
            s.close()


def test_hostile_bodies_are_4xx(tiny_runs: dict[str, Path]) -> None:
    with _serve(tiny_runs["sasrec"], "--max-body", "2000") as port:
        # a lone surrogate is valid JSON but no text: 422, never a 500
        for raw in (
            b'{"history": ["\\ud800"]}',
            b'{"history": [1], "candidates": ["\\udfff"]}',
            b'{"history": [], "user": "\\ud800x"}',
            b'{"histories": [["a", "\\ud83d"]]}',
        ):
            path = "/recommend/batch" if b"histories" in raw else "/recommend"
            status, out = _post(port, path, raw)
            assert status == 422, (raw, status, out)
        # a chunked body over the cap: 413, as an announced one
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            head = b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b'{"history": [' + b"1," * 1500
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            answer = b""
            while b"bytes" not in answer and (chunk := s.recv(4096)):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert b"request body over 2000 bytes" in answer
        finally:
            s.close()


def test_a_server_reachable_from_other_machines_needs_a_token(
    tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from seqrec.cli import main

    for host in ("0.0.0.0", "192.0.2.7", "::", "example.org"):
        assert main(["serve", str(tiny_runs["sasrec"]), "--host", host]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--api-key-env" in err and "--insecure" in err, err
    from seqrec.serving.service import ServeOptions, check_host

    for host in ("127.0.0.1", "localhost", "::1", "127.8.9.10"):
        check_host(host, ServeOptions(), insecure=False)  # the loopback needs none
    check_host("0.0.0.0", ServeOptions(api_key="t"), insecure=False)
    check_host("0.0.0.0", ServeOptions(), insecure=True)


def test_a_timed_out_request_stops_computing(tiny_runs: dict[str, Path]) -> None:
    """A batch that would take 8 s answers 504 after 1 s, and its work stops there: the
    recommender checks the request's deadline between its batches."""
    import threading

    import uvicorn

    from seqrec.serving.recommender import Recommender
    from seqrec.serving.service import ServeOptions, create_app, server_config

    rec = Recommender.from_run(tiny_runs["sasrec"])
    real, calls = rec._scores, []

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        time.sleep(0.2)
        return real(*args, **kwargs)

    options = ServeOptions(timeout=1.0, max_batch=64)
    app = create_app(rec, options)
    rec.batch_size = 1
    rec._scores = slow  # type: ignore[method-assign]
    port = _free_port()
    server = uvicorn.Server(
        server_config(app, options, host="127.0.0.1", port=port, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        body = json.dumps({"histories": [[1, 2]] * 40, "k": 3}).encode()
        start = time.monotonic()
        status, out = _post(port, "/recommend/batch", body)
        assert status == 504 and out == {"detail": "the request took longer than 1 s"}
        time.sleep(1.5)  # what would still be computing behind the answer
        assert len(calls) <= 8  # ~1 s of 0.2 s batches (+1 started at the deadline), not 40
        assert max(calls) - start < 1.6
    finally:
        server.should_exit = True
        thread.join(timeout=10)
