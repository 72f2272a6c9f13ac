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

__all__ = [
    "VERSION",
    "atomic_write",
    "cpu_flags",
    "git_commit",
    "git_diff",
    "machine",
    "write_json",
]

VERSION = "0.1.0"  # seqrec's version (pyproject.toml's; `seqrec.__version__`)
_REPO = Path(__file__).resolve().parent.parent.parent  # src/seqrec -> the checkout, if any


# The instruction-set flags that decide which numeric path is fastest here
# (docs/results/performance.md): AVX-512 and its bf16 dot products, and AMX tile units (bf16
# matmuls several times fp32's).
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _cpuinfo() -> tuple[str, set[str]]:
    """(CPU model string, the flags of its first core) from /proc/cpuinfo (Linux), else
    (platform.processor(), no flags)."""
    cpu, flags = platform.processor(), set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu == platform.processor():
                cpu = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return cpu, flags


def cpu_flags() -> list[str]:
    """Which of `ISA_FLAGS` this CPU has (e.g. ["avx2", "avx512f", "avx512_bf16"])."""
    return [f for f in ISA_FLAGS if f in _cpuinfo()[1]]


def describe_machine(m: dict[str, Any]) -> str:
    """One line for a results file: CPU, cores, ISA flags, GPU, torch (of `machine()`)."""
    flags = " ".join(m["cpu_flags"]) or "no AVX-512/AMX"
    return f"{m['cpu']}, {m['cores']} cores, {flags}, GPU {m['gpu'] or 'none'}, torch {m['torch']}"


def machine() -> dict[str, Any]:
    """What a measurement ran on: CPU model, cores, ISA flags, GPU, memory, library versions."""
    import numpy
    import polars
    import torch

    cpu, flags = _cpuinfo()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cpu_flags": [f for f in ISA_FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
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


def git_diff(repo: Path = _REPO) -> str | None:
    """The uncommitted change to tracked code (benchmark result files excepted) as a patch, or
    None when the tree is clean or not a git checkout: stored beside any number measured from a
    dirty tree, so that number can still be traced to the code that produced it."""
    try:
        out = subprocess.run(
            ["git", "diff", "HEAD", "--", ".", ":(exclude)benchmarks/results"],
            capture_output=True,
            text=True,
            cwd=repo,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call write(f) on a temporary file beside `path`, then rename it into place: a reader
    sees the old file or the new one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a lost mount: one line naming the file
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None
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
