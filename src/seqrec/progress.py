"""Progress on long work, readable wherever it goes: tqdm's bar on a terminal and in a Jupyter
notebook (tqdm.auto: a widget where ipywidgets is installed); in a log file or a pipe, one
plain line per report (an epoch, a phase) and never a carriage-return redraw, so a long run's
log holds its epochs, not thousands of bar frames. SEQREC_PROGRESS=bar or lines chooses either
way."""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

__all__ = ["Progress", "in_notebook", "interactive", "val_field"]


def interactive(stream: IO[str] | None = None) -> bool:
    """Whether progress goes to a terminal or a notebook (a bar) or elsewhere (plain lines)."""
    mode = os.environ.get("SEQREC_PROGRESS", "")
    if mode in ("bar", "lines"):
        return mode == "bar"
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)()) or in_notebook()


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and type(get()).__name__ == "ZMQInteractiveShell"


class Progress:
    """A counter to `total` with a description: a tqdm bar, or plain lines (see the module)."""

    def __init__(
        self,
        total: float,
        desc: str,
        *,
        enabled: bool = True,
        initial: float = 0,
        unit: str = "it",
        bar_format: str | None = None,
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.enabled = enabled
        self.started = time.perf_counter() if enabled else 0.0  # no clock read when silent
        self.bar: Any = None
        if enabled and interactive():
            bar = auto_tqdm if in_notebook() else tqdm
            self.bar = bar(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                dynamic_ncols=True,
                bar_format=bar_format,
            )

    def update(self, n: float) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)

    def report(self, **fields: Any) -> None:
        """What an epoch (or a phase) ended with: the bar's postfix, or one line."""
        if self.bar is not None:
            self.bar.set_postfix(**fields)
        elif self.enabled:
            done = f"{self.n:.0f}/{self.total:.0f} {self.unit}"
            if self.total:
                done += f" ({100 * self.n / self.total:.0f}%)"
            parts = [f"{k} {v}" for k, v in fields.items()]
            elapsed = time.perf_counter() - self.started
            print(
                f"{self.desc}: {', '.join(parts)}; {done}, {elapsed:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def note(self, text: str) -> None:
        """A line of its own (a phase that starts), under the bar where there is one."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def val_field(value: float | None, best: dict[str, Any]) -> str:
    """The progress line's validation field: this epoch's value ("-" when the epoch was not
    validated) and the best so far with its epoch: `0.0581 (best 0.0632 @3)`, or
    `0.0632 (best)` when this epoch is the best."""
    now = "-" if value is None else f"{value:.4f}"
    if best["epoch"] < 0:
        return now
    if value is not None and value == best["metric"]:
        return f"{now} (best)"
    return f"{now} (best {best['metric']:.4f} @{best['epoch']})"
