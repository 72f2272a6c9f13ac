"""Shared by the benchmark scripts: every result is written as JSON + Markdown together with the
command, git commit, machine, versions and seed that produced it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
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
    import numpy
    import polars
    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "polars": polars.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
        # results files themselves do not make the code dirty
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
            cwd=Path(__file__).parent.parent,
        ).stdout
        return out + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_results(name: str, payload: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    """Write results/<name>.json and results/<name>.md atomically; return their paths."""
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {**meta, **payload}
    md = (
        f"{markdown.rstrip()}\n\n"
        f"- command: `{meta['command']}`\n- git commit: `{meta['git_commit']}`\n"
        f"- date: {meta['date']}\n- machine: {json.dumps(meta['machine'])}\n"
    )
    paths = (RESULTS / f"{name}.json", RESULTS / f"{name}.md")
    for path, text in zip(paths, (json.dumps(data, indent=2) + "\n", md), strict=True):
        fd, tmp = tempfile.mkstemp(dir=RESULTS, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return paths


def data_dir(arg: str | None) -> Path:
    """The real-data folder: --data-dir, else $SEQREC_DATA_DIR; never a hard-coded path."""
    root = arg or os.environ.get("SEQREC_DATA_DIR")
    if not root or not Path(root).is_dir():
        sys.exit(
            "benchmark: pass --data-dir or set SEQREC_DATA_DIR "
            "to a folder laid out like shared/data"
        )
    return Path(root)
