"""Shared by the benchmark scripts: the one way a result is written and a run is reused.

Every result is written as JSON + Markdown together with the command, the commit that evaluated
it (and whether the tree was clean; the uncommitted diff when it was not), the machine (CPU model,
cores, ISA flags, GPU, versions), the seeds, and for every training run it reports: its fully
resolved config, the commit it was trained at (its diff when dirty), its training and candidate
seeds, its machine and its wall times (`run_record`). A finished run is reused only when its
config equals the requested one (`train_or_reuse`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqrec.provenance import atomic_write, describe_machine, git_commit, git_diff, machine

RESULTS = Path(__file__).parent / "results"


def run_record(run_dir: Path) -> dict[str, Any]:
    """What a results file records of one training run, read from its run directory."""
    from seqrec.rundir import RunDir

    run = RunDir(run_dir, trust=True)  # the benchmarks' own runs, some older than the manifest
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
            for k in (
                "wall_time_s",
                "train_time_s",
                "epochs",
                "best_epoch",
                "stopped",
                "seq_per_s",
            )
        },
    }


def write_results(
    name: str,
    payload: dict[str, Any],
    markdown: str,
    *,
    seeds: Mapping[str, int | None],
    runs: Sequence[Path] = (),
) -> tuple[Path, Path]:
    """Write results/<name>.json and results/<name>.md atomically; return their paths.

    `seeds`: every seed the numbers depend on (e.g. {"train": 0, "candidates": 42}); `runs`: the
    run directories whose numbers the file reports."""
    commit = git_commit()
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
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
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {**meta, **payload}
    m = meta["machine"]
    lines = [
        f"- command: `{meta['command']}`",
        f"- evaluated at commit `{commit}`"
        + ("" if meta["evaluated_at"]["clean"] else " (uncommitted diff stored in the JSON)"),
        f"- date: {meta['date']}",
        f"- machine: {describe_machine(m)}",
        f"- seeds: {', '.join(f'{k} {v}' for k, v in meta['seeds'].items())}",
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
    md = f"{markdown.rstrip()}\n\n" + "\n".join(lines) + "\n"
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


def paper_beauty(arg: str | None) -> Path:
    """The BERT4Rec authors' Beauty file under the real-data folder (see `data_dir`)."""
    return data_dir(arg) / "bert4rec-paper" / "beauty.txt.gz"


def runs_dir(arg: str | None) -> Path:
    """Where benchmark runs live: --runs-dir, else $SEQREC_HOME/runs."""
    from seqrec.data import download

    return Path(arg) if arg else download.cache_dir() / "runs"


def train_or_reuse(
    ds: Any, cfg: Any, out: Path, src: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run in `out`: a finished one is reported as it was trained, an interrupted one is
    resumed, else it is trained; a run whose config differs from `cfg` is refused (one line
    naming the differing keys). Returns its metrics and its per-epoch log."""
    from seqrec.errors import ConfigError
    from seqrec.rundir import RunDir
    from seqrec.train import train_or_reuse as reuse

    try:
        metrics = reuse(out, cfg, ds, source={"data": str(src)}, trust=True)  # its own runs
    except ConfigError as e:
        sys.exit(str(e))
    return metrics, RunDir(out).log()


def budgeted_row(spec: str) -> tuple[str, str, str, Any]:
    """A results row given as NAME=CONFIG:BUDGET[:KEY=VALUE,...] (e.g.
    "bert4rec=beauty-bert4rec:30m", "bpr-mf-pop=ml-1m-bpr-mf:5m:train.negative_sampling=popularity")
    -> (name, config with its overrides as written, budget, the config's RunConfig with those
    overrides and that budget)."""
    from seqrec.config import RunConfig, load_config

    name, _, rest = spec.partition("=")
    config, _, rest = rest.partition(":")
    budget, _, sets = rest.partition(":")
    overrides = [s for s in sets.split(",") if s]
    cfg = load_config(RunConfig, config, [*overrides, f"train.time_budget={json.dumps(budget)}"])
    return name, " ".join([config, *overrides]), budget, cfg
