"""benchmarks/results/: every kept results file traces to a clean commit (or its diff) and its
seeds and is cited by a document; INDEX.md is what benchmarks/results_index.py generates; the
experiment runner and the scripts write one schema (seqrec.experiments.results)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from seqrec.experiments.results import META_KEYS, write_results


def test_the_results_folder_is_traceable_and_its_index_is_current(
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    index = benchmark_script("results_index")
    problems = index.check()
    assert not problems, "\n".join(problems)


def _results(tmp_path: Path, files: dict[str, dict[str, object]]) -> Path:
    results = tmp_path / "benchmarks" / "results"
    for name, data in files.items():
        path = results / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    return results


def test_the_check_names_a_dirty_or_seedless_or_uncited_file_and_a_stale_index(
    tmp_path: Path, benchmark_script: Callable[[str], ModuleType]
) -> None:
    index = benchmark_script("results_index")
    clean = {"evaluated_at": {"commit": "abc", "clean": True, "diff": None}, "seeds": {"train": 0}}
    dirty = {**clean, "evaluated_at": {"commit": "abc", "clean": False, "diff": None}}
    patched = {**clean, "evaluated_at": {"commit": "abc", "clean": False, "diff": "--- a"}}
    seedless = {"evaluated_at": clean["evaluated_at"]}
    run_dirty = {**clean, "run_records": [{"run_dir": "/r/b4r", "trained_at": {"clean": False}}]}
    root = tmp_path
    results = _results(
        root,
        {
            "area/good": clean,
            "area/patched": patched,
            "area/dirty": dirty,
            "area/seedless": seedless,
            "area/run_dirty": run_dirty,
            "area/uncited": clean,
            "archive/old": dirty,  # the archive is the record only: not checked
        },
    )
    (root / "docs").mkdir()
    cites = "".join(f"[x](results/area/{n}.md) " for n in ("good", "patched", "dirty"))
    (root / "docs" / "r.md").write_text(cites + "seedless: area/seedless.json area/run_dirty.png")
    assert index.problems(clean) == [] and index.problems(patched) == []
    found = index.check(results, root)
    assert found == [
        "area/dirty.json: evaluated from an uncommitted tree, diff not stored",
        "area/run_dirty.json: run b4r trained dirty, diff not stored",
        "area/seedless.json: no seeds",
        "area/uncited.json: cited by no document (cite it or archive it)",
        "benchmarks/results/INDEX.md is stale: run python benchmarks/results_index.py",
    ]
    (results / "INDEX.md").write_text(index.render(results, root))
    assert index.check(results, root)[-1].startswith("area/uncited.json")
    text = (results / "INDEX.md").read_text()
    # the archive is listed last; a row names its citers
    assert text.index("## area") < text.index("## archive")
    assert "| `good` |" in text and "docs/r.md" in text


def test_one_schema_for_every_writer(tmp_path: Path) -> None:
    json_path, md_path = write_results(
        tmp_path / "area" / "probe", {"rows": [1]}, "# probe", seeds={}, command="seqrec x"
    )
    data = json.loads(json_path.read_text())
    assert list(data)[: len(META_KEYS)] == list(META_KEYS) and data["rows"] == [1]
    assert data["command"] == "seqrec x" and data["seeds"] == {}
    assert md_path.read_text().startswith("# probe\n\n- command: `seqrec x`")
    assert "- seeds: none" in md_path.read_text()
    with pytest.raises(ValueError, match="repeats the results metadata keys \\['machine'\\]"):
        write_results(tmp_path / "p", {"machine": 1}, "# p", seeds={})


def test_the_recorded_command_runs_again_as_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex
    import sys

    argv = ["bench.py", "--serve", "--threads 1", "--serve", "", "--name", "it's"]
    monkeypatch.setattr(sys, "argv", argv)
    json_path, _ = write_results(tmp_path / "area" / "probe", {}, "# probe", seeds={})
    assert shlex.split(json.loads(json_path.read_text())["command"])[1:] == argv  # quoted


def test_an_experiment_writes_the_same_schema(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    from seqrec.experiments.run import run_experiment
    from seqrec.experiments.spec import load_spec

    base = tmp_path / "base.toml"
    base.write_text(
        'model = "sasrec"\n[sasrec]\nmax_len = 12\nd_model = 8\nattn_dropout = 0.0\n'
        "[train]\nmax_epochs = 1\n"
    )
    spec_path = tmp_path / "sweep.toml"
    spec_path.write_text(
        f'base = "{base}"\nmetric = "test.full.ndcg@10"\naxis = "sasrec.d_model"\nvalues = [8]\n'
    )
    path = run_experiment(load_spec(spec_path), str(tiny_runs["data"]), tmp_path, progress=False)
    data = json.loads(path.read_text())
    assert list(data)[: len(META_KEYS)] == list(META_KEYS)
    assert data["seeds"] == {"train_0": 0, "candidates_0": 42}
    assert set(data["evaluated_at"]) == {"commit", "clean", "diff"}
