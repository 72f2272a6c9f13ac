"""`seqrec experiment` and `reproduce`: declarative sweeps and the papers' tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from seqrec.data import download
from seqrec.errors import ConfigError

REPRODUCIBLE = ("bert4rec-table2", "sasrec-table3")  # `seqrec reproduce` names: shipped specs


def cmd_experiment(args: argparse.Namespace) -> int:
    """A declarative sweep (seqrec.experiments.spec): each point a run dir, results after each.
    `reproduce` is the same with a paper's table as the spec (and an optional budget per row)."""
    from seqrec.experiments.run import run_experiment
    from seqrec.experiments.spec import load_spec

    spec = load_spec(args.spec)
    if getattr(args, "time_budget", None):
        spec = spec.with_budget(args.time_budget)
    if getattr(args, "epochs", None) is not None:
        spec = spec.with_epochs(args.epochs)
    if getattr(args, "seeds", None):
        spec = spec.with_seeds(_seeds(args.seeds))
    if getattr(args, "set", None):
        spec = spec.with_overrides(args.set)
        for point in spec.points:  # every point's config checked before anything trains
            spec.config(point, spec.seeds[0])
    if args.dry_run:
        for point in spec.points:
            for seed in spec.seeds:
                cfg = spec.config(point, seed)
                budget = cfg.train.time_budget or (
                    f"{spec.epochs} epochs" if spec.epochs else "the config's own stopping rule"
                )
                print(
                    f"{point.label} seed {seed}: {' '.join(point.overrides) or '(the base)'} "
                    f"[{point.base or spec.base}, {budget}]"
                )
        return 0
    runs = Path(args.runs_dir) if args.runs_dir else download.cache_dir() / "runs"
    command = "seqrec " + " ".join(sys.argv[1:]) if sys.argv else ""
    path = run_experiment(
        spec, args.data, runs, progress=not args.quiet, command=command, trust=args.trust
    )
    print(path.with_suffix(".md").read_text())
    print(f"-> {path} (and .md, .png)")
    return 0


def _seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds: expected comma-separated integers, got {text!r}") from None


def _add_reuse_flags(p: argparse.ArgumentParser) -> None:
    """The flags `experiment` and `reproduce` share, and the command they run."""
    p.add_argument(
        "--trust",
        action="store_true",
        help="reuse finished runs that have no manifest (sha256.json): an older seqrec's",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_experiment)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "experiment", help="a declarative sweep: each point a run, results as they finish"
    )
    p.add_argument("spec", help="a spec file or a shipped name (table4-ml1m, fig4-ml1m, ...)")
    p.add_argument("--data", required=True, help="a dataset name or file path")
    p.add_argument("--runs-dir", help="where the points' runs go (default: $SEQREC_HOME/runs)")
    p.add_argument(
        "--epochs",
        type=int,
        help="train every point for this many epochs, no time budget (results: SPEC-<N>ep)",
    )
    p.add_argument(
        "--seeds", help="train these seeds instead of the spec's ('0,1,2'; runs LABEL-s<seed>)"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="an override for every point, after the spec's own (repeatable), e.g. "
        "data.min_item_interactions=1",
    )
    p.add_argument("--dry-run", action="store_true", help="list the points, train nothing")
    _add_reuse_flags(p)

    p = sub.add_parser(
        "reproduce",
        help="train (or reuse) every row of a paper's table and print it beside the paper's",
    )
    p.add_argument("spec", choices=REPRODUCIBLE, metavar="TABLE", help=", ".join(REPRODUCIBLE))
    p.add_argument("--data", required=True, help="a dataset name or file path (ML-1M)")
    p.add_argument("--time-budget", help="one budget for every row (default: each row's own)")
    p.add_argument("--runs-dir", help="where the rows' runs go (default: $SEQREC_HOME/runs)")
    p.add_argument("--dry-run", action="store_true", help="list the rows, train nothing")
    _add_reuse_flags(p)
