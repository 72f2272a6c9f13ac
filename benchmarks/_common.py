"""Shared by the benchmark programs: the one way a result is written and a run is reused, and the
dispatch of a program's subcommands to the measurements of benchmarks/suite (`run_suite`).

Every result is written by `seqrec.experiments.results.write_results` (JSON + Markdown with the
command, the evaluating commit and its diff when dirty, the machine, the seeds and a record of every
training run reported) into benchmarks/results/<area>/. A finished run is reused only when its
config equals the requested one (`train_or_reuse`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seqrec.experiments import results
from seqrec.files import check_name

RESULTS = Path(__file__).parent / "results"


# the measurement running (a module of benchmarks/suite, by its name), set by `run_suite`
CURRENT: str | None = None


def run_suite(doc: str, commands: Mapping[str, str], argv: Sequence[str] | None = None) -> None:
    """`python benchmarks/<program>.py SUBCOMMAND ARGS`: run `main(ARGS)` of the subcommand's
    module in benchmarks/suite; without one (or with --help), the program's docstring."""
    global CURRENT
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        print(doc.strip())
        if args and args[0] not in ("-h", "--help"):
            print(f"\nunknown subcommand {args[0]!r}; one of: {', '.join(commands)}")
            sys.exit(2)
        sys.exit(0 if args else 2)
    CURRENT = commands[args[0]]
    module = importlib.import_module(f"suite.{CURRENT}")
    module.main(args[1:])


# where each measurement's results go (benchmarks/results/<area>/); INDEX.md lists them all
SCRIPT_AREA = {
    "baselines_ml1m": "baselines",
    "beauty": "evaluation",
    "bert4rec_ml1m": "bert4rec",
    "candidate_draws": "evaluation",
    "ce_chunks": "performance",
    "distributed": "performance",
    "gpu_check": "performance",
    "gpu_sweep": "sasrec",
    "ensemble": "recipes",
    "eval_speed": "performance",
    "fuzz_campaign": "reliability",
    "hidden_collapse": "sasrec",
    "inference": "performance",
    "item_features": "features",
    "lrurec_ml1m": "lrurec",
    "peers": "performance",
    "pop_beauty": "evaluation",
    "pop_ml1m": "evaluation",
    "prepare_capped": "performance",
    "prepare_scale": "performance",
    "probes": "bert4rec",
    "quantized": "performance",
    "recipes": "recipes",
    "same_runs": "reliability",
    "sasrec_ml1m": "sasrec",
    "scale": "performance",
    "serve_load": "performance",
    "speed_options_quality": "performance",
    "target_counts": "evaluation",
    "throughput": "performance",
    "time_to_quality": "bert4rec",
}


def results_stem(name: str, area: str | None = None) -> Path:
    """benchmarks/results/<area>/<name>: `area` defaults to the running script's."""
    area = area or SCRIPT_AREA.get(CURRENT or Path(sys.argv[0]).stem)
    if not area:
        raise ValueError(f"no results area for {sys.argv[0]}: pass area=")
    return RESULTS / area / check_name(name, "--name")


def write_results(
    name: str,
    payload: dict[str, Any],
    markdown: str,
    *,
    seeds: Mapping[str, int | None],
    runs: Sequence[Path] = (),
    area: str | None = None,
) -> tuple[Path, Path]:
    """Write results/<area>/<name>.json and .md through `seqrec.experiments.results.write_results`
    (the one writer, shared with `seqrec experiment`); return their paths.

    `seeds`: every seed the numbers depend on (e.g. {"train": 0, "candidates": 42}); `runs`: the
    run directories whose numbers the file reports."""
    stem = results_stem(name, area)
    return results.write_results(stem, payload, markdown, seeds=seeds, runs=runs)


def copy_results(paths: Sequence[Path], out: str | None) -> None:
    """Copy a results file's paths to `out` too (the device tool's $OUT), when one is given."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for p in paths:
            shutil.copy(p, Path(out) / p.name)


def device_info(device: str) -> dict[str, Any]:
    """torch's version and the device; on CUDA the card's name, memory and multiprocessors."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            name=p.name, memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count
        )
    return info


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
    from seqrec.training.fit import train_or_reuse as reuse
    from seqrec.training.rundir import RunDir

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
