"""Shared by the benchmark scripts: every result is written as JSON + Markdown together with the
command, git commit, machine, versions and seed that produced it."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqrec.provenance import atomic_write, git_commit, machine

RESULTS = Path(__file__).parent / "results"


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
        atomic_write(path, lambda f, t=text: f.write(t.encode()))
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


def paper_ml1m(arg: str | None) -> Path:
    """The BERT4Rec authors' ML-1M file under the real-data folder (see `data_dir`)."""
    return data_dir(arg) / "bert4rec-paper" / "ml-1m.txt.gz"


def runs_dir(arg: str | None) -> Path:
    """Where benchmark runs live: --runs-dir, else $SEQREC_HOME/runs."""
    from seqrec.data import download

    return Path(arg) if arg else download.cache_dir() / "runs"


def train_or_reuse(
    ds: Any, cfg: Any, out: Path, src: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run in `out`: a finished one is reported as it was trained, an interrupted one is
    resumed, else it is trained. Returns its metrics and its per-epoch log."""
    from seqrec.train import fit

    if (out / "metrics.json").exists():
        metrics = json.loads((out / "metrics.json").read_text())
    else:
        resume = (out / "checkpoint.pt").exists()
        metrics = fit(ds, cfg, out, resume=resume, source={"data": str(src)}).metrics
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return metrics, log
