"""The one writer of results files: `seqrec experiment` and the benchmark scripts both write
through `write_results`, so every results file has one JSON schema and one Markdown footer.

JSON: the command, the commit that evaluated the numbers (`evaluated_at`: commit, whether the
tree was clean, and the uncommitted diff when it was not), the date, the machine (CPU model,
cores, ISA flags, GPU, versions), every seed the numbers depend on, one `run_records` entry per
training run reported (its resolved config, the commit it was trained at with its diff when
dirty, its seeds, machine and wall times), then the writer's own payload. Markdown: the writer's
text, then one line each for the command, commit, date, machine, seeds and runs.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqrec.provenance import atomic_write, describe_machine, git_commit, git_diff, machine

__all__ = ["META_KEYS", "run_record", "write_results"]

# the keys every results file starts with, in this order
META_KEYS = ("command", "git_commit", "evaluated_at", "date", "machine", "seeds", "run_records")


def run_record(run_dir: Path, *, trust: bool = True) -> dict[str, Any]:
    """What a results file records of one training run, read from its run directory. `trust`:
    runs older than the manifest are read too (the benchmarks' and experiments' own runs)."""
    from seqrec.training.rundir import RunDir

    run = RunDir(run_dir, trust=trust)
    config = run.config_dict()
    source = config.pop("source", {})
    metrics = run.metrics() or {}
    commit = str(metrics.get("git_commit", "unknown"))
    return {
        "run_dir": str(run_dir),
        "config": config,  # resolved: defaults -> file -> overrides, every key
        "source": source,
        "trained_at": {
            "commit": commit.removesuffix("-dirty"),
            "clean": not commit.endswith("-dirty"),
            "diff": run.code_diff(),
        },
        "train_seed": config["train"]["seed"],
        "candidate_seed": config["eval"]["negative_seed"],
        "machine": metrics.get("machine"),
        "device": metrics.get("device"),
        **{
            k: metrics.get(k)
            for k in ("wall_time_s", "train_time_s", "epochs", "best_epoch", "stopped", "seq_per_s")
        },
    }


def write_results(
    stem: Path,
    payload: Mapping[str, Any],
    markdown: str,
    *,
    seeds: Mapping[str, Any],
    runs: Sequence[Path] = (),
    command: str | None = None,
) -> tuple[Path, Path]:
    """Write `stem`.json and `stem`.md atomically (creating the folder); return their paths.

    `seeds`: every seed the numbers depend on (e.g. {"train": 0, "candidates": 42}; {} where
    nothing is random); `runs`: the run directories whose numbers the file reports; `command`:
    what produced it (default: this process's command line)."""
    commit = git_commit()
    meta: dict[str, Any] = {
        "command": command or shlex.join([Path(sys.executable).name, *sys.argv]),
        "git_commit": commit,
        "evaluated_at": {
            "commit": commit.removesuffix("-dirty"),
            "clean": not commit.endswith("-dirty"),
            "diff": git_diff(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "seeds": dict(seeds),
        "run_records": [run_record(r) for r in runs],
    }
    clash = set(meta) & set(payload)
    if clash:
        raise ValueError(f"the payload repeats the results metadata keys {sorted(clash)}")
    lines = _footer(meta)
    md = f"{markdown.rstrip()}\n\n" + "\n".join(lines) + "\n"
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = (stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md"))
    texts = (json.dumps({**meta, **payload}, indent=2) + "\n", md)
    for path, text in zip(paths, texts, strict=True):
        _write_text(path, text)
    return paths


def _write_text(path: Path, text: str) -> None:
    data = text.encode()
    atomic_write(path, lambda f: f.write(data))


def _footer(meta: Mapping[str, Any]) -> list[str]:
    m = meta["machine"]
    lines = [
        f"- command: `{meta['command']}`",
        f"- evaluated at commit `{meta['git_commit']}`"
        + ("" if meta["evaluated_at"]["clean"] else " (uncommitted diff stored in the JSON)"),
        f"- date: {meta['date']}",
        f"- machine: {describe_machine(m)}",
        f"- seeds: {', '.join(f'{k} {v}' for k, v in meta['seeds'].items()) or 'none'}",
    ]
    for r in meta["run_records"]:
        t = r["trained_at"]
        wall = f"{r['wall_time_s'] / 60:.1f} min" if r["wall_time_s"] else "unfinished"
        # a run trained elsewhere (a lent GPU) says where: the machine line above is this one
        elsewhere = r["machine"] and describe_machine(r["machine"]) != describe_machine(m)
        lines.append(
            f"- run `{Path(r['run_dir']).name}`: trained at `{t['commit']}`"
            f"{'' if t['clean'] else ' (dirty, diff stored)'}, seed {r['train_seed']}, "
            f"candidates seed {r['candidate_seed']}, {wall}"
            + (f", on {describe_machine(r['machine'])} ({r['device']})" if elsewhere else "")
            + "; resolved config in the JSON"
        )
    return lines
