"""One writer at a time for a run's catalogue: `add_items` in Python, `seqrec add-items` and
POST /items hold the run's lock from reading the catalogue to the files in place, and load the
catalogue again first when another writer changed it. Writers at once, many rounds: every
acknowledged item is in the run, the run loads, its manifest holds no stale digest, and a server
answers with what the others added."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from planted import feature_config, planted_log, post_json
from seqrec.errors import RunError
from seqrec.serving.recommender import Recommender
from seqrec.training.checkpoint import load_run
from seqrec.training.fit import fit
from seqrec.training.rundir import RunDir


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    from seqrec.data.prepare import prepare

    log, items = planted_log()
    table = tmp_path / "items.csv"
    items.filter(pl.col("item") <= 40).write_csv(table)
    ds = prepare(log, out=tmp_path / "prepared", name="planted", progress=False)
    fit(ds, feature_config("sasrec", table, "train.max_epochs=1"), tmp_path / "run", progress=False)
    return tmp_path / "run"


def _row(item: int) -> dict[str, Any]:
    return {"item": item, "genre": f"g{item % 4}", "title": f"film {item} of kind {item % 4}"}


def _check(run: Path, acknowledged: list[int]) -> list[Any]:
    """The run holds every acknowledged item once, loads, and its manifest is settled."""
    items = RunDir(run).vocab()["items"]
    assert sorted(set(acknowledged) - set(items)) == []
    assert len(items) == len(set(items)) == 40 + len(acknowledged)
    manifest = json.loads((run / "sha256.json").read_text())
    assert not manifest.get("pending")
    loaded = load_run(run)
    assert loaded.item_ids == items and loaded.items is not None
    assert loaded.items[1].n_rows == len(items) + 1  # row i for internal item i; 0 unused
    assert not [p.name for p in run.iterdir() if p.name.endswith(".new")]
    return items


def test_a_stale_recommender_adds_after_the_others_items_not_over_them(run: Path) -> None:
    first = Recommender.from_run(run)
    second = Recommender.from_run(run)  # loaded before first's change: stale once it lands
    assert first.add_items(pl.DataFrame([_row(41)])) == [41]
    assert second.add_items(pl.DataFrame([_row(42)])) == [42]  # 41 loaded again first
    assert second.items.lookup(41) is not None and second.n_items == 42
    assert _check(run, [41, 42])[-2:] == [41, 42]
    # the first one sees the second's item when it refreshes; nothing to do after that
    assert first.items.lookup(42) is None
    assert first.refresh() is True and first.items.lookup(42) is not None
    assert first.refresh() is False
    assert first.recommend([42, 41], k=3)  # both scored
    # an item the other writer added meanwhile is refused as a duplicate, not added twice
    with pytest.raises(Exception, match="already in the catalogue"):
        second.add_items(pl.DataFrame([_row(41)]))


def test_writers_in_threads_lose_nothing(run: Path) -> None:
    recs = [Recommender.from_run(run) for _ in range(3)]
    acknowledged: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def write(w: int) -> None:
        try:
            for r in range(6):
                item = 100 * (w + 1) + r
                recs[w].add_items(pl.DataFrame([_row(item)]))
                with guard:
                    acknowledged.append(item)
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(acknowledged) == 18
    _check(run, acknowledged)


def test_a_writer_that_cannot_have_the_lock_is_one_line(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqrec.serving.catalogue as catalogue

    monkeypatch.setattr(catalogue, "CATALOGUE_WAIT", 0.2)
    rec = Recommender.from_run(run)
    before = (run / "vocab.json").read_bytes()
    with RunDir(run).lock():  # a training holds it
        start = time.monotonic()
        with pytest.raises(RunError, match=r"in use by another writer \(pid \d+ on .*try again"):
            rec.add_items(pl.DataFrame([_row(41)]))
        assert time.monotonic() - start >= 0.2  # it waited its turn first
    assert (run / "vocab.json").read_bytes() == before and rec.n_items == 40


def test_a_load_beside_a_writer_reads_one_writers_files(run: Path) -> None:
    """Loads racing a writer never fail on a digest: a load that a change overlapped is made
    again."""
    stop = threading.Event()
    failures: list[str] = []
    loads = [0]

    def load() -> None:
        while not stop.is_set():
            try:
                r = load_run(run)
                assert len(r.item_ids) + 1 == r.items[1].n_rows  # type: ignore[index]
                loads[0] += 1
            except Exception as err:  # noqa: BLE001 (reported below)
                failures.append(str(err))

    reader = threading.Thread(target=load)
    reader.start()
    rec = Recommender.from_run(run)
    try:
        for r in range(8):
            rec.add_items(pl.DataFrame([_row(50 + r)]))
    finally:
        stop.set()
        reader.join(60)
    assert failures == [] and loads[0] > 0
    _check(run, list(range(50, 58)))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_four_writers_twenty_rounds_cli_python_and_two_workers(run: Path, tmp_path: Path) -> None:
    """Two `seqrec add-items` loops, a Python `add_items` loop and POST /items to a server of
    two worker processes, 20 rounds each, all at once."""
    pytest.importorskip("uvicorn")
    rounds = 20
    env = {**os.environ, "SEQREC_PROGRESS": "off"}
    port = _port()
    server = subprocess.Popen(
        [sys.executable, "-m", "seqrec", "serve", str(run), "--port", str(port)]
        + ["--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[int] = []
    guard = threading.Lock()
    errors: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/ready", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no server"
                time.sleep(0.5)

        def acked(item: int) -> None:
            with guard:
                acknowledged.append(item)

        def cli(w: int) -> None:
            for r in range(rounds):
                item = 1000 * w + r
                table = tmp_path / f"new-{w}-{r}.csv"
                pl.DataFrame([_row(item)]).write_csv(table)
                argv = [sys.executable, "-m", "seqrec", "add-items", str(run)]
                argv += ["--items", str(table)]
                p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
                if p.returncode == 0 and "items added" in p.stdout:
                    acked(item)
                else:
                    errors.append(f"cli {w}: {p.returncode} {p.stderr.strip()[-300:]}")

        def python() -> None:
            rec = Recommender.from_run(run)
            for r in range(rounds):
                item = 3000 + r
                try:
                    rec.add_items(pl.DataFrame([_row(item)]))
                    acked(item)
                except Exception as err:  # noqa: BLE001 (reported below)
                    errors.append(f"python: {err}")

        def http() -> None:
            for r in range(rounds):
                item = 4000 + r
                status, body = post_json(url + "/items", {"items": [_row(item)]})
                if status == 200 and body["added"] == [item]:
                    acked(item)
                else:
                    errors.append(f"http: {status} {body}")

        writers = [
            threading.Thread(target=cli, args=(1,)),
            threading.Thread(target=cli, args=(2,)),
            threading.Thread(target=python),
            threading.Thread(target=http),
        ]
        for t in writers:
            t.start()
        for t in writers:
            t.join(900)
        assert errors == []
        assert len(acknowledged) == 4 * rounds
        items = _check(run, acknowledged)
        # both workers answer with every item: none dropped from a history (each checks the
        # run every second)
        time.sleep(3)
        history = sorted(acknowledged)[-40:]
        for _ in range(12):
            status, body = post_json(url + "/recommend", {"history": history, "k": 5})
            assert status == 200 and body["dropped"] == [], body
        assert len(items) == 40 + 4 * rounds
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    RunDir(run).check_items(items)
