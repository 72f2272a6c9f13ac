"""Fetch the papers' datasets from their official sources into a local cache.

Cache: `$SEQREC_HOME` or `~/.cache/seqrec`; archives under `downloads/`, extracted data files under
`datasets/<name>/`. Every file is written to a temporary name beside its destination and renamed
only once complete and verified, so a crash or a dropped connection never leaves a half file.

Checksums: GroupLens publishes an MD5 for each MovieLens archive (`<archive>.md5` beside it); we
pin those. The Amazon (2014, McAuley lab) and Steam (Kang & McAuley) files have no published
checksum; their size and sha256 are printed after download and recorded in `<file>.sha256`.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from seqrec.errors import DownloadError
from seqrec.progress import Progress
from seqrec.provenance import atomic_write

__all__ = ["DATASETS", "DatasetSource", "cache_dir", "dataset_path", "download_file", "fetch"]


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset comes from and which file of it the readers take."""

    name: str
    url: str
    archive: str  # the downloaded file's name
    data_file: str  # the interactions file, inside the zip (a member path) or the file itself
    format: str  # reader name in seqrec.data.io.FORMATS
    md5: str | None = None
    sha256: str | None = None
    size: int | None = None
    citation: str = ""

    @property
    def is_zip(self) -> bool:
        return self.archive.endswith(".zip")


DATASETS: dict[str, DatasetSource] = {
    "ml-1m": DatasetSource(
        name="ml-1m",
        url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        archive="ml-1m.zip",
        data_file="ml-1m/ratings.dat",
        format="movielens-dat",
        md5="c4d9eecfca2ab87c1945afe126590906",
        citation="Harper & Konstan 2015, cited as [8] in BERT4Rec; SASRec §IV-A",
    ),
    "ml-20m": DatasetSource(
        name="ml-20m",
        url="https://files.grouplens.org/datasets/movielens/ml-20m.zip",
        archive="ml-20m.zip",
        data_file="ml-20m/ratings.csv",
        format="movielens-csv",
        md5="cd245b17a1ae2cc31bb14903e1204af3",
        citation="BERT4Rec footnote 6",
    ),
    "beauty": DatasetSource(
        name="beauty",
        url="http://snap.stanford.edu/data/amazon/productGraph/categoryFiles/ratings_Beauty.csv",
        archive="ratings_Beauty.csv",
        data_file="ratings_Beauty.csv",
        format="amazon-csv",
        citation="McAuley et al. 2015 (BERT4Rec footnote 3, SASRec [46])",
    ),
    "steam": DatasetSource(
        name="steam",
        url="http://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz",
        archive="steam_reviews.json.gz",
        data_file="steam_reviews.json.gz",
        format="steam",
        citation="Kang & McAuley 2018 (BERT4Rec footnote 4, SASRec §IV-A)",
    ),
}


class _VerificationError(DownloadError):
    """The whole file arrived but is not the expected one."""


def cache_dir() -> Path:
    return Path(os.environ.get("SEQREC_HOME") or Path.home() / ".cache" / "seqrec")


def dataset_path(source: DatasetSource, root: Path | None = None) -> Path:
    """Where the dataset's interactions file lives once fetched."""
    return (root or cache_dir()) / "datasets" / source.name / source.data_file


def _hint(source: DatasetSource, root: Path) -> str:
    return (
        f"download {source.url} by hand and put it at {root / 'downloads' / source.archive} "
        f"(or its {Path(source.data_file).name} at {dataset_path(source, root)})"
    )


def download_file(
    url: str,
    dest: Path,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    size: int | None = None,
    retries: int = 2,
    timeout: float = 30.0,
    progress: bool = True,
) -> Path:
    """Stream `url` to `dest`, verifying length, size and checksums; atomic; retried on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    last: DownloadError | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(2.0**attempt, 10.0) * 0.1)
        try:
            _download_once(
                url, dest, md5=md5, sha256=sha256, size=size, timeout=timeout, progress=progress
            )
            return dest
        except _VerificationError as e:
            raise DownloadError(str(e)) from None  # complete but wrong: retrying will not help
        except DownloadError as e:
            last = e
    assert last is not None
    raise last


def _download_once(
    url: str,
    dest: Path,
    *,
    md5: str | None,
    sha256: str | None,
    size: int | None,
    timeout: float,
    progress: bool,
) -> None:
    h_md5, h_sha = hashlib.md5(), hashlib.sha256()
    received = 0

    def fetch(out: IO[bytes]) -> None:
        """Stream the body into `out`, then check it; any failure is one DownloadError (and
        atomic_write leaves no partial file)."""
        nonlocal received
        try:
            req = urllib.request.Request(url, headers={"User-Agent": "seqrec"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                bar = Progress(total or 0, dest.name, enabled=progress, unit="B")
                try:
                    while chunk := resp.read(1 << 20):
                        out.write(chunk)
                        h_md5.update(chunk)
                        h_sha.update(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                finally:
                    bar.close()
        except urllib.error.HTTPError as e:
            raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise DownloadError(f"{url}: cannot connect ({e.reason})") from None
        except TimeoutError:
            raise DownloadError(f"{url}: timed out after {received} bytes") from None
        except (OSError, http.client.HTTPException) as e:  # reset, IncompleteRead, ...
            raise DownloadError(
                f"{url}: connection dropped after {received} bytes ({e!r})"
            ) from None
        if total is not None and received != total:
            raise DownloadError(f"{url}: connection dropped after {received} of {total} bytes")
        if size is not None and received != size:
            raise _VerificationError(f"{url}: size {received} bytes, expected {size}")
        if md5 is not None and h_md5.hexdigest() != md5:
            raise _VerificationError(f"{url}: md5 checksum {h_md5.hexdigest()}, expected {md5}")
        if sha256 is not None and h_sha.hexdigest() != sha256:
            raise _VerificationError(
                f"{url}: sha256 checksum {h_sha.hexdigest()}, expected {sha256}"
            )

    try:
        atomic_write(dest, fetch)
    except OSError as e:  # the local disk (the network's errors are DownloadErrors above)
        raise DownloadError(f"{dest}: could not be written ({e.strerror})") from None
    record = f"{h_sha.hexdigest()}  {dest.name}\n".encode()
    atomic_write(dest.with_name(dest.name + ".sha256"), lambda f: f.write(record))


def _verify(path: Path, source: DatasetSource) -> None:
    """Check an archive already on disk (e.g. put there by hand) against the pinned checksums."""
    for algo, want in (("md5", source.md5), ("sha256", source.sha256)):
        if want is None:
            continue
        h = hashlib.new(algo)
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if h.hexdigest() != want:
            raise DownloadError(
                f"{path}: {algo} checksum {h.hexdigest()}, expected {want}; "
                "delete it and fetch again"
            )


def _extract(source: DatasetSource, archive: Path, root: Path) -> None:
    """Extract the zip's members under `root` (atomically, member by member)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            if source.data_file not in names:
                raise DownloadError(
                    f"{archive}: has no {source.data_file}; is it the right archive?"
                )
            for member in names:
                if member.endswith("/"):
                    continue
                dest = root / member
                if not dest.resolve().is_relative_to(root.resolve()):
                    raise DownloadError(f"{archive}: member {member!r} escapes the dataset folder")
                with zf.open(member) as src:

                    def copy(out: IO[bytes], src: IO[bytes] = src) -> None:
                        shutil.copyfileobj(src, out)

                    atomic_write(dest, copy)
    except zipfile.BadZipFile:
        raise DownloadError(
            f"{archive}: not a valid zip archive; delete it and download again"
        ) from None


def fetch(
    name_or_source: str | DatasetSource,
    *,
    root: Path | None = None,
    force: bool = False,
    progress: bool = True,
    retries: int = 2,
    timeout: float = 30.0,
) -> Path:
    """The dataset's interactions file: from the cache, else downloaded, verified and extracted."""
    if isinstance(name_or_source, DatasetSource):
        source = name_or_source
    elif name_or_source in DATASETS:
        source = DATASETS[name_or_source]
    else:
        raise DownloadError(
            f"unknown dataset {name_or_source!r}; expected one of {', '.join(DATASETS)}"
        )
    root = root or cache_dir()
    target = dataset_path(source, root)
    if target.exists() and not force:
        return target
    archive = root / "downloads" / source.archive
    if not force and archive.exists():
        _verify(archive, source)
    else:
        try:
            download_file(
                source.url,
                archive,
                md5=source.md5,
                sha256=source.sha256,
                size=source.size,
                retries=retries,
                timeout=timeout,
                progress=progress,
            )
        except DownloadError as e:
            raise DownloadError(f"{e}; {_hint(source, root)}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_zip:
        _extract(source, archive, root / "datasets" / source.name)
    else:
        with archive.open("rb") as src:
            atomic_write(target, lambda out: shutil.copyfileobj(src, out))
    return target
