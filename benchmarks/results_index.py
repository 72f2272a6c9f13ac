"""benchmarks/results/INDEX.md: every results file by area, with what produced it and who cites it.

    python benchmarks/results_index.py            # rewrite INDEX.md
    python benchmarks/results_index.py --check    # exit 1 if INDEX.md is stale or a kept file
                                                  # lacks a clean commit (or its diff) or seeds

A results file is a stem under benchmarks/results/<area>/ (`<stem>.json`, its `.md`, maybe a
`.png`). Files under `archive/` are kept for the record only: superseded, cited by no document,
or measured from an uncommitted tree whose diff was not stored; the documents cite none of them
as current evidence. Every other ("kept") file must record the commit it was evaluated at, clean
or with its diff, and its seeds (`problems`).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"
ARCHIVE = "archive"
# what may cite a results file: the docs, the README, the configs and specs, the scripts
CITERS = ("README.md", "docs/**/*.md", "src/seqrec/**/*.toml", "benchmarks/**/*.toml")


def stems(results: Path = RESULTS) -> list[tuple[str, str]]:
    """(area, stem) of every results file, sorted."""
    return sorted({(p.parent.name, p.stem) for p in results.glob("*/*.json")})


def _citers(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for pattern in CITERS
        for p in sorted(root.glob(pattern))
    }


def cited_by(area: str, stem: str, texts: dict[str, str]) -> list[str]:
    ref = re.compile(rf"(?<![\w-]){re.escape(area)}/{re.escape(stem)}\.(?:json|md|png)\b")
    return [name for name, text in texts.items() if ref.search(text)]


def problems(data: dict[str, Any]) -> list[str]:
    """Why a results file's numbers could not be traced: an evaluating commit that is dirty
    without its diff, a training run trained dirty without its diff, or no seeds."""
    found = []
    evaluated = data.get("evaluated_at")
    if not isinstance(evaluated, dict):
        found.append("no evaluated_at")
    elif not evaluated.get("clean") and not evaluated.get("diff"):
        found.append("evaluated from an uncommitted tree, diff not stored")
    if not isinstance(data.get("seeds"), dict):
        found.append("no seeds")
    for r in data.get("run_records") or []:
        t = r.get("trained_at") or {}
        if not t.get("clean") and not t.get("diff"):
            found.append(f"run {Path(r.get('run_dir', '?')).name} trained dirty, diff not stored")
    return found


# the programs whose subcommands run the measurements of benchmarks/suite
PROGRAMS = ("reproduce", "analyses", "speed", "gpu")


@functools.cache
def _subcommands(root: Path) -> dict[str, str]:
    """{measurement module: "benchmarks/<program>.py <subcommand>"}, read from each program's
    COMMANDS."""
    found = {}
    for program in PROGRAMS:
        path = root / "benchmarks" / f"{program}.py"
        if not path.exists():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMANDS":
                for sub, module in ast.literal_eval(node.value).items():
                    found[module] = f"benchmarks/{program}.py {sub}"
    return found


def current_form(command: str, root: Path = ROOT) -> str:
    """A recorded command as it is run now: a measurement that was a script of its own
    (`benchmarks/throughput.py`) is a program's subcommand (`benchmarks/speed.py throughput`)."""
    subs = _subcommands(root)
    if not subs:
        return command
    pattern = re.compile(r"benchmarks/(" + "|".join(map(re.escape, subs)) + r")\.py\b")
    return pattern.sub(lambda m: subs[m.group(1)], command)


def _short_machine(m: Any) -> str:
    if not isinstance(m, dict):
        return "?"
    cpu = str(m.get("cpu", "?")).replace("(R)", "").replace(" Processor", "")
    flags = m.get("cpu_flags") or []
    isa = "AMX" if any("amx" in f for f in flags) else "AVX-512" if flags else "no AVX-512"
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{cpu}, {m.get('cores', '?')} cores, {isa}{gpu}"


def _row(area: str, stem: str, results: Path, texts: dict[str, str], root: Path) -> str:
    data = json.loads((results / area / f"{stem}.json").read_text())
    command = current_form(str(data.get("command", "?")), root)
    command = re.sub(r"(/[\w.+-]+)+/(?=[\w.+-]+)", "", command)  # paths of one machine
    if len(command) > 90:
        command = command[:87] + "..."
    evaluated = data.get("evaluated_at") or {}
    commit = str(evaluated.get("commit") or data.get("git_commit", "?"))[:7]
    if not evaluated.get("clean", True):
        commit += " (dirty, diff stored)" if evaluated.get("diff") else " (dirty)"
    seeds = data.get("seeds")
    seed_text = (
        "none recorded"
        if not isinstance(seeds, dict)
        else ", ".join(f"{k} {v}" for k, v in seeds.items()) or "none (deterministic)"
    )
    citers = ", ".join(cited_by(area, stem, texts)) or "-"
    return (
        f"| `{stem}` | `{command.replace('|', '/')}` | {commit} "
        f"| {str(data.get('date', '?'))[:10]} | {_short_machine(data.get('machine'))} "
        f"| {seed_text} | {citers} |"
    )


def render(results: Path = RESULTS, root: Path = ROOT) -> str:
    texts = _citers(root)
    lines = [
        "# Results index",
        "",
        "Generated by `python benchmarks/results_index.py` (checked by a test): every results",
        "file, grouped by area, with the command that wrote it (a measurement that was a script",
        "of its own shown as the subcommand that runs it now), the commit that evaluated it,",
        "its machine, its seeds and the documents that cite it. `archive/` holds files kept for",
        "the record only (superseded, cited by nothing, or measured from an uncommitted tree",
        "whose diff was not stored).",
    ]
    areas = sorted({a for a, _ in stems(results)}, key=lambda a: (a == ARCHIVE, a))
    for area in areas:
        lines += [
            "",
            f"## {area}",
            "",
            "| stem | command | commit | date | machine | seeds | cited by |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [_row(a, s, results, texts, root) for a, s in stems(results) if a == area]
    return "\n".join(lines) + "\n"


def check(results: Path = RESULTS, root: Path = ROOT) -> list[str]:
    """Everything wrong with the results folder: kept files that cannot be traced or that no
    document cites, and a stale INDEX.md."""
    found = []
    texts = _citers(root)
    for area, stem in stems(results):
        if area != ARCHIVE:
            data = json.loads((results / area / f"{stem}.json").read_text())
            found += [f"{area}/{stem}.json: {p}" for p in problems(data)]
            if not cited_by(area, stem, texts):
                found.append(f"{area}/{stem}.json: cited by no document (cite it or archive it)")
    index = results / INDEX.name
    if not index.exists() or index.read_text() != render(results, root):
        found.append(f"{index.relative_to(root)} is stale: run python benchmarks/results_index.py")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="check only; write nothing")
    args = ap.parse_args(argv)
    if not args.check:
        INDEX.write_text(render())
    found = check()
    for f in found:
        print(f, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
