"""Where a number came from: the machine, the library versions, the git commit; and the atomic
writes every result file goes through (a temporary file in the same folder, then a rename)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "git_commit", "machine", "write_json"]

_REPO = Path(__file__).resolve().parent.parent.parent  # src/seqrec -> the checkout, if any


def machine() -> dict[str, Any]:
    import numpy
    import polars
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "polars": polars.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def git_commit(repo: Path = _REPO) -> str:
    """HEAD of the checkout the code runs from, "-dirty" when tracked code has changed
    (benchmark result files excepted); "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=repo, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)benchmarks/results",
            ],
            capture_output=True,
            text=True,
            cwd=repo,
        ).stdout
        return out + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call write(f) on a temporary file beside `path`, then rename it into place: a reader
    sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> None:
    text = (json.dumps(obj, indent=2) + "\n").encode()
    atomic_write(path, lambda f: f.write(text))
