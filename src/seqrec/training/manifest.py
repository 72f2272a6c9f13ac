"""A run's manifest (sha256.json): the digest of every file a loader reads, by file name, and
those being replaced (pending). RunDir records digests before it moves a file into place and
checks a file's digest before it reads it (seqrec.training.rundir); weights are hashed as they
are written (`save_hashed`) and read with PyTorch's restricted unpickler (`load_tensors`)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import IO, Any

import torch

from seqrec.errors import RunError
from seqrec.files import bound, read_checked
from seqrec.outputs import DIGESTS, PENDING

__all__ = ["covered", "digest_map", "load_tensors", "read_digests", "save_hashed", "verify"]


def verify(root: Path, name: str, digest: str, digests: dict[str, Any] | None) -> None:
    """`digest` must be the sha256 the manifest (`digests`, read before the file) records,
    or holds pending, for `name`."""
    path = root / name
    digests = digests or {}
    pending: dict[str, str] = digests.get(PENDING) or {}
    if name not in digests and name not in pending:
        raise RunError(
            f"{path}: not recorded in {DIGESTS} (the run was stopped while writing it, and "
            "--resume writes it again; or it was put there by hand)"
        )
    if digest not in (digests.get(name), pending.get(name)):
        raise RunError(
            f"{path}: its sha256 is not one this run recorded for it ({DIGESTS}): "
            "damaged, truncated, edited or replaced"
        )


def read_digests(root: Path, *, trust: bool) -> dict[str, Any] | None:
    """The manifest {file name: sha256} (and its pending changes); None when there is none
    and `trust` is set (a RunError otherwise)."""
    path = root / DIGESTS
    if not path.exists() and not path.is_symlink():
        if trust:
            return None
        raise RunError(
            f"{path}: missing, so the run's files cannot be checked; a run made by hand "
            "loads with --trust"
        )
    text = read_checked(path, bound("manifest"), root=root, error=RunError)
    try:
        data = json.loads(text)
    except ValueError:
        raise RunError(f"{path}: damaged (not JSON); the run's files cannot be checked") from None
    if not isinstance(data, dict) or not digest_map(data.get(PENDING, {})):
        raise RunError(f"{path}: damaged (expected {{file name: sha256}})")
    if not digest_map({k: v for k, v in data.items() if k != PENDING}):
        raise RunError(f"{path}: damaged (expected {{file name: sha256}})")
    return data


def covered(digests: dict[str, Any] | None, name: str, trust: bool) -> bool:
    """Whether the manifest covers `name`: always, but for a trusted run without a manifest or
    whose (older) manifest names only the weight files."""
    if digests is None:
        return False
    pending: dict[str, str] = digests.get(PENDING) or {}
    return not (trust and name not in digests and name not in pending)


def digest_map(data: Any) -> bool:
    return isinstance(data, dict) and all(
        isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in data.items()
    )


class _HashedFile:
    """The file `torch.save` writes through: its many small writes gathered into pieces of up
    to `PIECE` bytes, each written, then hashed."""

    PIECE = 1 << 22

    def __init__(self, f: IO[bytes], digest: Any) -> None:
        self.f, self.digest = f, digest
        self.pending = bytearray()
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        n = len(data)
        if len(self.pending) + n < self.PIECE:
            self.pending += data
            return n
        self._out(self.pending)
        self.pending = bytearray()
        self._out(data)  # a large piece (a tensor's bytes) as it is, not copied
        return n

    def _out(self, data: Any) -> None:
        try:
            self.f.write(data)
        except OSError as err:  # kept: torch may pass it on as its own RuntimeError
            self.error = err
            raise
        self.digest.update(data)

    def flush(self) -> None:
        self._out(self.pending)
        self.pending = bytearray()
        if hasattr(self.f, "flush"):
            self.f.flush()


def save_hashed(obj: Any, f: IO[bytes], digest: Any) -> None:
    """torch.save(obj) into `f`, its bytes hashed into `digest`; a failed write is its
    OSError (a full disk names the file, as any other write)."""
    out = _HashedFile(f, digest)
    try:
        torch.save(obj, out)  # type: ignore[arg-type]
        out.flush()
    except RuntimeError:
        if out.error is not None:
            raise out.error from None
        raise


def load_tensors(path: Path, data: bytes | IO[bytes] | None = None) -> Any:
    """A file written by RunDir (or its bytes or open file, `data`, already looked at and
    verified), read with PyTorch's restricted unpickler (`weights_only=True`): tensors, numbers,
    strings and plain containers only. A file that holds anything else (a pickled object whose
    loading would run code) or is damaged is refused with a one-line error naming it; nothing
    in it runs."""
    try:
        source: Any = io.BytesIO(data) if isinstance(data, bytes) else data or path
        return torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # UnpicklingError, RuntimeError, EOFError, ...: all one answer
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RunError(
            f"{path}: refused, not a tensors-only seqrec file or damaged ({first})"
        ) from None
