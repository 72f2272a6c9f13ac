"""On one CUDA GPU (benchmarks/gpu_check.sh runs `gpu.py check` on a device machine).

    python benchmarks/gpu.py SUBCOMMAND [--help] [ARGS]

Subcommands (each a module of benchmarks/suite; its docstring says what it measures and how):

    check                  the shipped recipes and the CUDA tests on one GPU
    profile                where a training step's time goes on a GPU
    sweep                  probes on one GPU, several at once
"""

from __future__ import annotations

from _common import run_suite

COMMANDS = {
    "check": "gpu_check",
    "profile": "gpu_profile",
    "sweep": "gpu_sweep",
}

if __name__ == "__main__":
    run_suite(__doc__, COMMANDS)
