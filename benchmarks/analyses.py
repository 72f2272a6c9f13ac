"""Analyses of trained runs and of logs.

    python benchmarks/analyses.py SUBCOMMAND [--help] [ARGS]

Subcommands (each a module of benchmarks/suite; its docstring says what it measures and how):

    probes                 probe runs of one base config side by side
    candidate-draws        a sampled protocol's number under other candidate draws
    target-counts          how often the held-out items were seen in training
    hidden-collapse        whether a trained run still tells histories apart
    speed-options-quality  whether the speed options change quality
    same-runs              whether runs before and after a change are the same run
    item-features          item features: warm quality, the cold-item protocol
"""

from __future__ import annotations

from _common import run_suite

COMMANDS = {
    "probes": "probes",
    "candidate-draws": "candidate_draws",
    "target-counts": "target_counts",
    "hidden-collapse": "hidden_collapse",
    "speed-options-quality": "speed_options_quality",
    "same-runs": "same_runs",
    "item-features": "item_features",
}

if __name__ == "__main__":
    run_suite(__doc__, COMMANDS)
