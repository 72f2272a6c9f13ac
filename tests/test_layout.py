"""The shape of the code, checked: no module over 500 lines, no function over 80, and every
import that the README and the docs show working as written. The layers themselves are
import-linter's contract (.importlinter, run by `make lint`)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "seqrec"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(SRC)}:{node.name}"] = n
    assert long == {}


def test_the_size_checks_see_a_long_function() -> None:
    # the walk above finds nested functions and methods too
    body = "\n".join(f"      x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"class A:\n  def f(self):\n    def g():\n{body}\n    return g\n")
    lengths = {
        n.name: n.end_lineno - n.lineno + 1  # type: ignore[operator]
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
    }
    assert lengths["g"] == MAX_FUNCTION_LINES + 1 > MAX_FUNCTION_LINES


def _shown_imports() -> list[tuple[str, str]]:
    """(where, import statement) of every seqrec import in a Python block of the README, the
    docs and the examples."""
    found = []
    blocks = re.compile(r"```python\n(.*?)```", re.S)
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    sources = [(f, b) for f in files for b in blocks.findall(f.read_text())]
    sources += [(f, f.read_text()) for f in sorted((ROOT / "examples").glob("*.py"))]
    for f, code in sources:
        try:
            tree = ast.parse(code)
        except SyntaxError:  # a fragment: its import lines alone
            lines = code.splitlines()
            tree = ast.parse("\n".join(x for x in lines if x.startswith(("from ", "import "))))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [a.name for a in getattr(node, "names", [])]
                if any(n == "seqrec" or n.startswith("seqrec.") for n in names):
                    found.append((str(f.relative_to(ROOT)), ast.unparse(node)))
    return sorted(set(found))


def test_the_docs_show_imports() -> None:
    shown = _shown_imports()
    assert len(shown) >= 5 and any(w == "README.md" for w, _ in shown)


@pytest.mark.parametrize(("where", "statement"), _shown_imports())
def test_every_import_the_docs_show_works(where: str, statement: str) -> None:
    tree = ast.parse(statement).body[0]
    if isinstance(tree, ast.ImportFrom):
        module = importlib.import_module(tree.module or "")
        for alias in tree.names:
            if not hasattr(module, alias.name):  # a submodule
                importlib.import_module(f"{tree.module}.{alias.name}")
    else:
        for alias in tree.names:  # type: ignore[attr-defined]
            importlib.import_module(alias.name)


def test_benchmarks_are_a_few_programs_and_every_measurement_is_reachable() -> None:
    """benchmarks/ keeps at most 15 programs; each measurement of benchmarks/suite is a
    subcommand of one of them (`COMMANDS`), so every results file's command still runs."""
    bench = ROOT / "benchmarks"
    programs = sorted(p.name for p in [*bench.glob("*.py"), *bench.glob("*.sh")])
    assert len(programs) <= 15, programs
    reachable = set()
    for program in bench.glob("*.py"):
        for node in ast.parse(program.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMANDS":
                reachable |= set(ast.literal_eval(node.value).values())
    modules = {p.stem for p in (bench / "suite").glob("*.py") if p.stem != "__init__"}
    assert modules and modules == reachable
