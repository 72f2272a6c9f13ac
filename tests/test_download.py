from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from seqrec.data.download import DatasetSource, fetch
from seqrec.errors import DownloadError

RATINGS = b"1::10::5::100\n1::20::4::101\n"


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ml-tiny/ratings.dat", RATINGS)
        zf.writestr("ml-tiny/README", b"tiny")
    return buf.getvalue()


GOOD = _zip()
CORRUPT = GOOD[:100] + bytes([GOOD[100] ^ 0xFF]) + GOOD[101:]


class Handler(BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Handler.hits[self.path] = Handler.hits.get(self.path, 0) + 1
        if self.path == "/good.zip":
            body = GOOD
        elif self.path == "/corrupt.zip":
            body = CORRUPT
        elif self.path == "/drop.zip":
            # promise the whole archive, send half, hang up
            self.send_response(200)
            self.send_header("Content-Length", str(len(GOOD)))
            self.end_headers()
            self.wfile.write(GOOD[: len(GOOD) // 2])
            self.wfile.flush()
            self.connection.close()
            return
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.hits = {}
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _source(url: str) -> DatasetSource:
    return DatasetSource(
        name="ml-tiny",
        url=url,
        archive="ml-tiny.zip",
        data_file="ml-tiny/ratings.dat",
        format="movielens-dat",
        md5=hashlib.md5(GOOD).hexdigest(),
        sha256=hashlib.sha256(GOOD).hexdigest(),
        size=len(GOOD),
    )


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_download_verifies_and_extracts(server: str, tmp_path: Path) -> None:
    path = fetch(_source(server + "/good.zip"), root=tmp_path, progress=False)
    assert path == tmp_path / "datasets" / "ml-tiny" / "ml-tiny" / "ratings.dat"
    assert path.read_bytes() == RATINGS
    sha = (tmp_path / "downloads" / "ml-tiny.zip.sha256").read_text().split()[0]
    assert sha == hashlib.sha256(GOOD).hexdigest()
    # second call: served from the cache, no new request
    fetch(_source(server + "/good.zip"), root=tmp_path, progress=False)
    assert Handler.hits["/good.zip"] == 1


def test_corrupted_archive_is_rejected_and_not_kept(server: str, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"md5 checksum .*expected .*download .* by hand"):
        fetch(_source(server + "/corrupt.zip"), root=tmp_path, progress=False)
    assert _files(tmp_path) == []
    assert Handler.hits["/corrupt.zip"] == 1  # a complete-but-wrong file is not retried


def test_dropped_connection_is_retried_then_reported(server: str, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="connection dropped"):
        fetch(_source(server + "/drop.zip"), root=tmp_path, progress=False, retries=1)
    assert Handler.hits["/drop.zip"] == 2
    assert _files(tmp_path) == []  # no half-written archive


def test_offline_error_is_one_line_with_where_to_put_the_file(tmp_path: Path) -> None:
    with pytest.raises(DownloadError) as info:
        fetch(
            _source("http://127.0.0.1:9/ml-tiny.zip"),
            root=tmp_path,
            progress=False,
            retries=0,
            timeout=2,
        )
    msg = str(info.value)
    assert "\n" not in msg
    assert "cannot connect" in msg
    assert str(tmp_path / "downloads" / "ml-tiny.zip") in msg


def test_archive_put_by_hand_is_verified_and_used(tmp_path: Path) -> None:
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "ml-tiny.zip").write_bytes(GOOD)
    path = fetch(_source("http://127.0.0.1:9/unused"), root=tmp_path, progress=False)
    assert path.read_bytes() == RATINGS
    # a corrupt archive put by hand (for a dataset not yet extracted) is caught by its checksum
    other = tmp_path / "other"
    (other / "downloads").mkdir(parents=True)
    (other / "downloads" / "ml-tiny.zip").write_bytes(CORRUPT)
    with pytest.raises(DownloadError, match="md5 checksum .*delete it and fetch again"):
        fetch(_source("http://127.0.0.1:9/unused"), root=other, progress=False)


def test_unknown_dataset_name() -> None:
    with pytest.raises(DownloadError, match="unknown dataset 'ml-3m'"):
        fetch("ml-3m")
