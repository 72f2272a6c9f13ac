from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own empty cache: nothing leaks into ~/.cache or between tests."""
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "seqrec-home"))


@pytest.fixture
def benchmark_script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Load a program of benchmarks/ or a measurement of benchmarks/suite by name as a module
    (they import _common, and a dataclass looks its module up in sys.modules; both undone after
    the test)."""

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        path = BENCHMARKS / f"{name}.py"
        if not path.exists():
            path = BENCHMARKS / "suite" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real-data folder (laid out like shared/data). Tests that need it skip when
    SEQREC_DATA_DIR is unset, and fail when it is set but names no folder: a mistyped path must
    not pass silently."""
    root = os.environ.get("SEQREC_DATA_DIR")
    if not root:
        pytest.skip("SEQREC_DATA_DIR not set: real-data checks skipped")
    if not Path(root).is_dir():
        pytest.fail(f"SEQREC_DATA_DIR={root} is set but is not a folder")
    return Path(root)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line saying how many real-data (e2e) tests ran, so CI shows whether they did."""
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        reports = terminalreporter.stats.get(outcome, [])
        counts[outcome] = sum(
            1
            for r in reports
            if getattr(r, "when", "call") in ("call", "setup") and "e2e" in r.keywords
        )
    terminalreporter.write_line(
        f"real-data (e2e) tests: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors, {counts['skipped']} skipped"
        + ("" if os.environ.get("SEQREC_DATA_DIR") else " (SEQREC_DATA_DIR not set)")
    )


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small trained run of each model on a synthetic MovieLens-format log that has a
    `movies.dat` beside it (titles "Movie <id>"); shared by the recommender, server and export
    tests. Returns {"data": ratings.dat, "sasrec": run dir, "bert4rec": run dir, "caser": ...}."""
    from seqrec.config import RunConfig, load_config
    from seqrec.data.prepare import prepare
    from seqrec.data.synthetic import synthetic_interactions
    from seqrec.training.fit import fit

    root = tmp_path_factory.mktemp("tiny")
    df = synthetic_interactions(n_users=120, n_items=60, min_len=8, max_len=40, seed=3)
    data = root / "ml" / "ratings.dat"
    data.parent.mkdir()
    rows = df.select("user", "item", "timestamp").iter_rows()
    data.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    items = sorted(set(df.get_column("item").to_list()))
    (data.parent / "movies.dat").write_bytes(
        "".join(f"{i}::Movie {i} (2000)::Drama|Comedy\n" for i in items).encode("latin-1")
    )
    out: dict[str, Path] = {"data": data}
    for model, sets in {
        "sasrec": ["sasrec.max_len=12", "sasrec.d_model=16", "sasrec.attn_dropout=0.0"],
        "bert4rec": ["bert4rec.max_len=12", "bert4rec.d_model=16", "bert4rec.attn_dropout=0.0"],
        "caser": ["caser.max_len=12", "caser.d_model=16"],  # a model with a per-user term
        "bpr-mf": ["bpr_mf.d_model=16"],  # one that reads no history (max_len 1)
        "gru4rec": ["gru4rec.max_len=12", "gru4rec.d_model=16", "gru4rec.hidden=16"],
    }.items():
        cfg = load_config(
            RunConfig, None, [f"model={model!r}", *sets, "train.max_epochs=3", "train.lr=5e-3"]
        )
        ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, out=root / "prepared")
        run = fit(
            ds, cfg, root / model, progress=False, source={"data": str(data)}, keep_checkpoints=True
        )  # the run-file tests use both checkpoints
        out[model] = run.run_dir
    return out


@pytest.fixture(scope="session")
def memory_cap() -> Callable[[], None]:
    """A `preexec_fn` capping a child's address space (as `prlimit --as`) at what a process
    that imported seqrec takes (measured here: torch's builds differ by gigabytes) plus 1 GiB:
    a child that tried to hold a bomb's output or a huge model would die, not pass."""
    return _capped_at(1 << 30)


@pytest.fixture(scope="session")
def wide_memory_cap() -> Callable[[], None]:
    """`memory_cap` at 3 GiB over an import of seqrec: for a child that trains many small
    models in turn (its address space grows with the allocator's arenas, not with any one)."""
    return _capped_at(3 << 30)


def _capped_at(room: int) -> Callable[[], None]:
    import resource
    import subprocess

    probe = (
        "import seqrec.cli, seqrec.training.checkpoint\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize')))"
    )
    base_kib = int(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    )
    cap = base_kib * 1024 + room

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return preexec


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """A folder on a tmpfs of the given size in bytes (as root: `mount -t tmpfs`), for the
    full-disk tests; skipped, with its reason, where mounting is not permitted."""
    import subprocess

    mounted: list[Path] = []

    def make(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"a small disk needs mount -t tmpfs: {done.stderr.strip()[:200]}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
