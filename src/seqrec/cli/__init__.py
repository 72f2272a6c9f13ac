"""The `seqrec` command: each subcommand parses its flags, builds a config and makes one library
call. User errors (`SeqrecError`) print one line on stderr and exit with status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from seqrec.cli import data, evaluation, experiments, quickstart, serving, training
from seqrec.cli.common import _say_short_budget
from seqrec.cli.numbers import bound_numbers
from seqrec.errors import SeqrecError

__all__ = ["_say_short_budget", "build_parser", "main"]


def _version() -> str:
    from seqrec import __version__

    return __version__


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (the usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seqrec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"seqrec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (data, training, evaluation, serving, experiments, quickstart):
        group.add_parsers(sub)
    return bound_numbers(parser)  # every number an upper bound (seqrec.cli.numbers)


def _one_line(err: BaseException, width: int = 1000) -> str:
    lines = str(err).strip().splitlines()
    text = " ".join(line.strip() for line in lines) if isinstance(err, SeqrecError) else ""
    text = text or (lines[0] if lines else type(err).__name__)
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SeqrecError, ValueError, OSError) as e:
        # library functions raise ValueError on bad arguments; one line, of a bounded length
        # whatever the input echoed into it
        print(f"seqrec: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130
