"""Look before reading: every file seqrec loads (run files, prepared datasets, configs, specs,
items tables) is `lstat`-ed first and refused in one line, before a byte is read, when it is a
symlink that leaves its directory, not a regular file (a device, a FIFO, a socket, a directory),
or larger than the bound for its kind. What passes is opened once, checked again on the open
descriptor (a file swapped in between is caught), and read from that descriptor only.

The bounds (bytes; each `SEQREC_MAX_<KIND>_BYTES` in the environment replaces its default):

    config      1 MiB     config.json, TOML configs and experiment specs, a prepared manifest
    manifest    1 MiB     sha256.json
    metrics     64 MiB    metrics.json, stats.json
    vocab       2 GiB     vocab.json (10^7 string ids fit several times over)
    log         256 MiB   log.jsonl, code.diff
    items       1 GiB     an items file read for titles
    prepared    16 GiB    a prepared dataset's sequences.parquet and negatives.npz

Weight files have no fixed bound: `seqrec.training.rundir` gives the one the run's config implies
(`seqrec.training.sizes`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from seqrec.errors import ConfigError, SeqrecError

__all__ = [
    "BOUNDS",
    "bound",
    "check_name",
    "checked_open",
    "env_bytes",
    "hash_file",
    "identity",
    "json_object",
    "read_checked",
    "read_hashed",
    "size_checked",
    "write_failed",
]

BOUNDS: dict[str, int] = {
    "config": 1 << 20,
    "manifest": 1 << 20,
    "metrics": 64 << 20,
    "vocab": 2 << 30,
    "log": 256 << 20,
    "items": 1 << 30,
    "item_features": 4 << 30,
    "index": 64 << 30,  # 10^7 items: about 5 GB
    "prepared": 16 << 30,
}
_CHUNK = 1 << 20


def bound(kind: str) -> int:
    """The size bound of files of `kind` (BOUNDS), or $SEQREC_MAX_<KIND>_BYTES."""
    return env_bytes(f"SEQREC_MAX_{kind.upper()}_BYTES", BOUNDS[kind])


def env_bytes(name: str, default: int) -> int:
    """A number of bytes from the environment variable `name` (positive), or `default` when it
    is unset; one ConfigError line naming the variable otherwise."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"${name}={text!r}: expected a number of bytes") from None
    if value < 1:
        raise ConfigError(f"${name}={text!r}: expected a positive number of bytes")
    return value


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def size_checked(
    path: Path,
    limit: int,
    *,
    root: Path | None = None,
    error: type[SeqrecError] = ConfigError,
    hint: str = "",
) -> Path:
    """The path to open for `path`, after an `lstat`: a regular file of at most `limit` bytes, or
    a symlink to one inside `root` (the seqrec directory it belongs to: a run, a prepared
    dataset). Without a `root` (a file the user named: a config, a spec, an items table) a
    symlink is followed wherever it leads, and what it leads to is checked the same way. One
    `error` line naming the file otherwise; nothing is read. `hint` ends the size line (which
    setting raises the bound)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise error(f"{path}: missing") from None
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror})") from None
    target = path
    if stat.S_ISLNK(st.st_mode):
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise error(f"{path}: a symlink to nothing readable; expected a file") from None
        inside = None if root is None else root.resolve()
        if inside is not None and not target.is_relative_to(inside):
            raise error(
                f"{path}: a symlink out of {inside} (to {target}); expected a file of its own"
            )
        st = target.stat()
    _check_stat(path, st, limit, error, hint)
    return target


def _check_stat(
    path: Path, st: os.stat_result, limit: int, error: type[SeqrecError], hint: str
) -> None:
    """A regular file of at most `limit` bytes, or one `error` line naming `path`."""
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a device, FIFO or socket); expected a file")
    if st.st_size > limit:
        raise error(
            f"{path}: {_mib(st.st_size)}, over the {_mib(limit)} bound for this file"
            + (f" ({hint})" if hint else "")
        )


@contextmanager
def checked_open(
    path: Path,
    limit: int,
    *,
    root: Path | None = None,
    error: type[SeqrecError] = ConfigError,
    hint: str = "",
) -> Iterator[IO[bytes]]:
    """`path` opened for reading after `size_checked`, and checked again on the descriptor (a
    file swapped for another between the look and the open is refused the same way)."""
    target = size_checked(path, limit, root=root, error=error, hint=hint)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror})") from None
    f = os.fdopen(fd, "rb")
    try:
        _check_stat(path, os.fstat(fd), limit, error, hint)
        os.set_blocking(fd, True)
        yield f
    finally:
        f.close()


def read_checked(
    path: Path,
    limit: int,
    *,
    root: Path | None = None,
    error: type[SeqrecError] = ConfigError,
    hint: str = "",
) -> bytes:
    """The bytes of `path`, looked at first (`checked_open`); never more than `limit` of them,
    even when the file grows while it is read."""
    chunks, total = [], 0
    with checked_open(path, limit, root=root, error=error, hint=hint) as f:
        while chunk := f.read(_CHUNK):  # in chunks: a read of `limit` bytes would reserve them
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise error(f"{path}: grew over the {_mib(limit)} bound for this file while read")
    return b"".join(chunks)


def json_object(
    data: bytes, path: Path, error: type[SeqrecError] = ConfigError, advice: str = ""
) -> dict[str, Any]:
    """`data`, the bytes of `path`, as a JSON object; one `error` line naming the file when it
    is not one (`advice` ends the line: what to do)."""
    end = f"; {advice}" if advice else ""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise error(f"{path}: damaged (not JSON){end}") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: damaged (expected a JSON object){end}")
    return obj


def hash_file(f: IO[bytes]) -> str:
    """The sha256 of an open file from its current position to its end, read in 1 MiB chunks
    (never whole in memory); the position is put back where it was."""
    start = f.tell()
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    f.seek(start)
    return h.hexdigest()


def write_failed(err: BaseException, path: Path) -> OSError:
    """A failed write (an OSError, or a library's error wrapping one, such as polars' "IO error:
    No space left on device (os error 28)") as one OSError line naming `path`, the file or
    folder being written: `raise write_failed(err, out) from None`."""
    if isinstance(err, OSError) and err.errno is not None:
        return OSError(err.errno, err.strerror or os.strerror(err.errno), str(path))
    found = re.search(r"os error (\d+)", str(err))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code), str(path))
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return OSError(f"{path}: could not be written ({first})")


def check_name(name: str, what: str) -> str:
    """`name` if it can name a file or folder on its own: not empty, at most 200 characters, no
    path separator or control character, not starting with a dot (so never `.` or `..`).
    One ConfigError line naming `what` (e.g. "spec name") otherwise, before a path is built."""
    bad = (
        not name
        or len(name) > 200
        or name.startswith(".")
        or any(c in name for c in "/\\")
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
    )
    if bad:
        raise ConfigError(
            f"{what} {name[:80]!r} cannot name a file: expected a name without a path "
            "separator or control character, not starting with a dot"
        )
    return name


def read_hashed(
    path: Path,
    limit: int,
    *,
    root: Path | None = None,
    error: type[SeqrecError] = ConfigError,
    hint: str = "",
) -> tuple[bytearray, str]:
    """The bytes of `path` and their sha256, looked at first (`checked_open`), read once into
    one buffer of the file's size and hashed as they are read: a file of gigabytes is never
    held twice. One `error` line when it changes while read."""
    digest = hashlib.sha256()
    with checked_open(path, limit, root=root, error=error, hint=hint) as f:
        size = os.fstat(f.fileno()).st_size
        data, got = bytearray(size), 0
        view = memoryview(data)
        while got < size and (n := f.readinto(view[got : got + (1 << 24)])):  # type: ignore[attr-defined]
            digest.update(view[got : got + n])
            got += n
        if got != size or f.read(1):
            raise error(f"{path}: changed while it was read")
    return data, digest.hexdigest()


def identity(path: Path) -> tuple[int, int, int] | None:
    """What tells a file from the one that replaces it (every seqrec write is a rename: a new
    inode): its inode, modification time and size; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
