"""Every number a user passes has an upper bound: the walker goes through every numeric option of
every subcommand and every numeric parameter of every model's estimator, gives each a value
past any bound, and expects one line naming it before anything runs."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import seqrec
from seqrec.cli import build_parser, main
from seqrec.cli.numbers import NUMBER_BOUNDS, Bounded, bound_numbers
from seqrec.config import default_config
from seqrec.config.ranges import UNBOUNDED
from seqrec.errors import ConfigError
from seqrec.models.registry import MODELS


def _numeric_options() -> list[tuple[str, str, argparse.Action]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for name, p in sub.choices.items():
        for action in p._actions:
            if isinstance(action.type, Bounded) or action.type in (int, float):
                found.append((name, max(action.option_strings, key=len), action))
    return found


def test_every_numeric_option_has_an_upper_bound() -> None:
    found = _numeric_options()
    assert len(found) >= 30  # the walk reaches the subcommands' options
    unbounded = [(c, o) for c, o, a in found if not isinstance(a.type, Bounded)]
    assert unbounded == []
    used = {o for _, o, _ in found}
    assert set(NUMBER_BOUNDS) == used  # no bound left for an option that is gone


@pytest.mark.parametrize(("command", "option"), [(c, o) for c, o, _ in _numeric_options()])
def test_a_billion_or_more_is_one_line_before_anything_runs(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    high = NUMBER_BOUNDS[option]
    value = str(int(max(high * 10, 10**9) + 1))
    with pytest.raises(SystemExit) as stopped:
        main([command, option, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"argument {option}: expected <= " in err and f"got {value}" in err


def test_a_float_option_must_be_finite_and_a_new_option_needs_a_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for bad in ("inf", "nan"):
        with pytest.raises(SystemExit):
            main(["serve", "run", "--timeout", bad])
        assert f"--timeout: expected a finite number, got {bad}" in capsys.readouterr().err
    # within its bound a value passes as its type
    assert Bounded(1000)("1000") == 1000 and Bounded(2.5, float)("2.5") == 2.5
    parser = argparse.ArgumentParser()
    parser.add_argument("--brand-new", type=int)
    with pytest.raises(RuntimeError, match="--brand-new: a numeric option without a bound"):
        bound_numbers(parser)


def _numeric_fields() -> list[tuple[str, str, str]]:
    """(model, section, field) for every numeric config field a model's estimator takes."""
    found = []
    for model in MODELS:
        cfg = default_config(model)
        sections = [("data", cfg.data), ("eval", cfg.eval), ("items", cfg.items)]
        for section, value in [*sections, ("train", cfg.train), *cfg.sections]:
            for f in dataclasses.fields(value):
                v = getattr(value, f.name)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    found.append((model, section, f.name))
    return found


def test_every_estimator_count_refuses_a_trillion_in_one_line() -> None:
    fields = _numeric_fields()
    assert len(fields) > 100
    tried = 0
    for model, section, name in fields:
        if name in UNBOUNDED:  # rates and scales: a diverging model, not a size
            continue
        estimator = seqrec.Model(model, set=[f"{section}.{name}=1000000000000"])
        with pytest.raises(ConfigError, match=rf"{section}\.{name} must be in .*got 10+") as err:
            estimator.run_config()
        assert "\n" not in str(err.value)
        tried += 1
    assert tried > 100
    # the ones left unbounded are floats, each named on purpose
    floats = {n for _, _, n in fields if n in UNBOUNDED}
    assert floats == UNBOUNDED
