"""Figures of runs: `seqrec plot RUN [RUN ...]` draws their validation curves (the metric each
run selected its state on, by epoch and by training minutes) into one PNG. Needs matplotlib (the
`bench` extra)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqrec.errors import ConfigError
from seqrec.provenance import atomic_write
from seqrec.training.rundir import RunDir

__all__ = ["curves_png", "plot_curves", "pyplot"]


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend; one line when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("figures need matplotlib: pip install 'seqrec[bench]'") from None
    return plt


def validation_curve(run: RunDir) -> tuple[str, list[tuple[int, float, float]]]:
    """(the metric's name, [(epoch, training minutes, value)]) of a run's validated epochs."""
    curve, metric = [], ""
    for line in run.log():
        keys = [k for k in line if k.startswith("valid_")]
        if keys:
            metric = keys[0].removeprefix("valid_").replace("_", " ")
            curve.append((int(line["epoch"]), float(line["elapsed_s"]) / 60, float(line[keys[0]])))
    return metric, curve


def plot_curves(runs: Sequence[str | Path], out: Path, *, trust: bool = False) -> Path:
    """The validation curves of `runs` by epoch (left) and by minutes of training (right)."""
    png = curves_png(runs, trust=trust)
    atomic_write(out, lambda f: f.write(png))
    return out


def curves_png(runs: Sequence[str | Path], *, trust: bool = False) -> bytes:
    """`plot_curves`' figure as PNG bytes."""
    curves = []
    for r in runs:
        run = RunDir(r, trust=trust)
        if not run.started:
            raise ConfigError(f"{r}: not a run directory")
        metric, curve = validation_curve(run)
        if not curve:
            raise ConfigError(f"{r}: no validated epoch in its log yet")
        curves.append((Path(r).name, metric, curve))
    plt = pyplot()
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, metric, curve in curves:
        epochs, minutes, values = zip(*curve, strict=True)
        by_epoch.plot(epochs, values, marker=".", label=f"{name} ({metric})")
        by_time.plot(minutes, values, marker=".", label=name)
    by_epoch.xaxis.get_major_locator().set_params(integer=True)
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("minutes of training")
    by_epoch.set_ylabel(f"validation {curves[0][1]}")
    by_epoch.legend(fontsize=8)
    for ax in (by_epoch, by_time):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
