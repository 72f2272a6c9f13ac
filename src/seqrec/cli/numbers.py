"""Every number the command line takes has an upper bound: one table, applied to every numeric
option of every subcommand when the parser is built (`bound_numbers`). A value above its bound,
or a float that is not finite, is one line before anything runs; a count of a billion never
reaches an allocation (`--draws`, `--ef-search`, `--m`: the seeds, the graph's links and its
candidate lists are built from them). Lower bounds stay with the commands, which say what a
small value means.

A numeric option missing from the table stops the parser's construction: a new option gets its
bound the day it is added (tests/test_limits.py walks them all)."""

from __future__ import annotations

import argparse
import math

from seqrec.data.prepared import MAX_DRAWS

__all__ = ["NUMBER_BOUNDS", "Bounded", "bound_numbers"]

_BILLION = 10**9

# option (as typed) -> the largest value it takes
NUMBER_BOUNDS: dict[str, float] = {
    # data
    "--min-user-interactions": _BILLION,
    "--min-item-interactions": _BILLION,
    # evaluation and analyses
    "--draws": MAX_DRAWS,  # candidate draws, each a whole evaluation
    "--last": 65536,  # positions from the end (attention)
    "--users": 10_000,  # users listed in a report
    "--epochs": 100_000,  # an experiment's epochs
    # recommending
    "-k": 1_000_000,  # and at most the catalogue, checked with the run
    "--at": 253_402_300_799,  # a time, seconds since the epoch: up to 9999-12-31
    # the item index (faiss and usearch allocate candidate lists and links by these)
    "--nlist": 1 << 20,
    "--nprobe": 1 << 20,
    "--target": 1.0,
    "--m": 512,
    "--ef-construction": 65536,
    "--ef-search": 65536,
    "--sample": 1_000_000,
    # the service
    "--port": 65535,
    "--workers": 256,
    "--search-breadth": 65536,
    "--max-history": 1_000_000,
    "--max-batch": 100_000,
    "--max-body": 1 << 31,
    "--timeout": 86_400.0,
    "--max-connections": 1_000_000,
    "--header-timeout": 86_400.0,
    "--keep-alive": 86_400.0,
    "--max-requests-per-connection": _BILLION,
    "--micro-batch": 65536,
    "--batch-wait-ms": 60_000.0,
    "--max-queue": 1_000_000,
    "--threads": 4096,
}


class Bounded:
    """An argparse type: a number of `kind` (int or float) no larger than `high`, finite."""

    def __init__(self, high: float, kind: type = int) -> None:
        self.high, self.kind = high, kind
        self.__name__ = kind.__name__  # argparse names the type by it in its messages

    def __call__(self, text: str) -> int | float:
        value = self.kind(text)  # a ValueError: argparse's "invalid int value: 'x'"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
        if value > self.high:
            shown = f"{self.high:,}" if self.kind is int else f"{self.high:g}"
            raise argparse.ArgumentTypeError(f"expected <= {shown}, got {text}")
        return value

    def __repr__(self) -> str:
        return f"Bounded({self.high!r}, {self.kind.__name__})"


def bound_numbers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every int or float option of `parser` and its subcommands typed `Bounded` by
    `NUMBER_BOUNDS`; a numeric option the table lacks is a RuntimeError (a developer's)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                bound_numbers(sub)
        elif action.type in (int, float):
            option = max(action.option_strings, key=len) if action.option_strings else action.dest
            if option not in NUMBER_BOUNDS:
                raise RuntimeError(f"{option}: a numeric option without a bound in NUMBER_BOUNDS")
            action.type = Bounded(NUMBER_BOUNDS[option], action.type)
    return parser
