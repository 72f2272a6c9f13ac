"""The standing attack suite: what a hostile user or a damaged disk tries, each as a test that
failed before the defence existed. Sizes and types are checked before anything is read or built:
run files that are symlinks to endless devices or sparse giants, configs that describe models
of any size, names that are paths. The slow ones (a memory cap on a child process, big files)
carry the `slow` marker: `make test-slow` runs them, and CI runs both.
docs/design/reliability.md lists each guarantee beside its test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from seqrec.checkpoint import load_run
from seqrec.config import RunConfig, load_config
from seqrec.errors import ConfigError, RunError
from seqrec.sizes import check_memory, memory

ROOT = Path(__file__).resolve().parents[1]


def _run(tiny_runs: dict[str, Path], tmp_path: Path, model: str = "sasrec") -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs[model], run)
    return run


def _forge(run: Path, name: str) -> None:
    """Record `name`'s digest in the manifest, as an editor of the directory would."""
    digests = json.loads((run / "sha256.json").read_text())
    digests[name] = hashlib.sha256((run / name).read_bytes()).hexdigest()
    (run / "sha256.json").write_text(json.dumps(digests))


def _one_line(message: str, *words: str) -> None:
    assert "\n" not in message.strip() and len(message) < 1000, message
    assert "Traceback" not in message, message
    for w in words:
        assert w in message, message


def _capped(code: str, *args: str, cap: Callable[[], None]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=cap,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


# ------------------------------------------------------------------- run files, looked at first

LOADERS = {
    "load_run": "import sys; from seqrec.checkpoint import load_run; load_run(sys.argv[1])",
    "seqrec.load": "import sys, seqrec; seqrec.load(sys.argv[1])",
    "seqrec.load trust": "import sys, seqrec; seqrec.load(sys.argv[1], trust=True)",
    "recommend": (
        "import sys; from seqrec.cli import main; "
        "sys.exit(main(['recommend', sys.argv[1], '--history', '']))"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["config.json", "sha256.json", "vocab.json"])
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_run_file_linked_to_dev_zero_is_refused_unread_under_a_memory_cap(
    name: str,
    loader: str,
    tiny_runs: dict[str, Path],
    tmp_path: Path,
    memory_cap: Callable[[], None],
) -> None:
    """Each loader once read such a file until memory ran out (MemoryError after +3.3 GB)."""
    run = _run(tiny_runs, tmp_path)
    (run / name).unlink()
    (run / name).symlink_to("/dev/zero")
    proc = _capped(LOADERS[loader], str(run), cap=memory_cap)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert "MemoryError" not in proc.stderr
    if loader == "recommend":  # the CLI prints the one line alone
        _one_line(proc.stderr, name, "a symlink out of")
    else:
        assert f"{name}: a symlink out of" in last, proc.stderr


@pytest.mark.slow
def test_a_sparse_50_gb_weight_file_is_refused_from_its_size_under_a_memory_cap(
    tiny_runs: dict[str, Path], tmp_path: Path, memory_cap: Callable[[], None]
) -> None:
    run = _run(tiny_runs, tmp_path)
    with (run / "model.pt").open("r+b") as f:
        f.truncate(50 << 30)  # sparse: no disk used
    proc = _capped(LOADERS["recommend"], str(run), cap=memory_cap)
    assert proc.returncode != 0
    _one_line(proc.stderr, "model.pt: 51,200.0 MiB, over the", "the run's config implies")


def test_run_files_that_are_not_regular_files_are_refused_before_they_are_opened(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _run(tiny_runs, tmp_path)
    (run / "vocab.json").unlink()
    os.mkfifo(run / "vocab.json")  # opening a FIFO for reading would block forever
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(str(err.value), "vocab.json: not a regular file")
    run2 = tmp_path / "run2"
    shutil.copytree(tiny_runs["sasrec"], run2)
    (run2 / "metrics.json").unlink()
    (run2 / "metrics.json").mkdir()
    with pytest.raises(RunError) as err:
        load_run(run2)
    _one_line(str(err.value), "metrics.json: is a directory")


def test_a_symlink_inside_the_run_is_followed_one_leaving_it_is_not(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _run(tiny_runs, tmp_path)
    (run / "models").mkdir()
    (run / "model.pt").rename(run / "models" / "best.pt")
    (run / "model.pt").symlink_to(Path("models") / "best.pt")
    assert load_run(run).model is not None  # inside the run: the same file, the same digest
    outside = tmp_path / "elsewhere.pt"
    (run / "models" / "best.pt").rename(outside)
    (run / "model.pt").unlink()
    (run / "model.pt").symlink_to(outside)
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(str(err.value), "model.pt: a symlink out of")


def test_a_grown_manifest_or_config_is_refused_from_its_size(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tiny_runs, tmp_path)
    with (run / "sha256.json").open("r+b") as f:
        f.truncate(2 << 20)  # over its 1 MiB bound (zeros: would not parse either)
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(str(err.value), "sha256.json: 2.0 MiB, over the 1.0 MiB bound")
    run2 = tmp_path / "run2"
    shutil.copytree(tiny_runs["sasrec"], run2)
    monkeypatch.setenv("SEQREC_MAX_CONFIG_BYTES", "100")  # the bound is a setting
    with pytest.raises(RunError) as err:
        load_run(run2)
    _one_line(str(err.value), "config.json:", "over the 100 bytes bound")


@pytest.mark.slow
def test_weights_are_held_once_when_loaded(tmp_path: Path, memory_cap: Callable[[], None]) -> None:
    """A run whose weights take 400 MB loads in a process capped at 1 GiB over an import of
    seqrec: read whole, hashed and then copied into a built model they took three times that."""
    import torch

    from seqrec.rundir import RunDir

    cfg = load_config(
        RunConfig, None, ['model="bpr-mf"', "bpr_mf.d_model=500", 'train.device="cpu"']
    )
    n_items, n_users = 200_000, 0
    assert 390e6 < memory(cfg, n_items, n_users).parameters < 410e6
    run = RunDir(tmp_path / "big")
    items = [str(i) for i in range(1, n_items + 1)]
    run.start({**cfg.to_dict(), "source": {}}, {"items": items, "n_users": n_users}, None)
    with torch.device("meta"):
        from seqrec.checkpoint import build_model

        shapes = {k: v.shape for k, v in build_model(cfg, n_items, n_users).state_dict().items()}
    run.save_model({k: torch.zeros(s) for k, s in shapes.items()})
    proc = _capped(
        "import sys; from seqrec.checkpoint import load_run; "
        "r = load_run(sys.argv[1]); print(sum(p.numel() for p in r.model.parameters()))",
        str(run.path),
        cap=memory_cap,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == sum(torch.Size(s).numel() for s in shapes.values())


# ----------------------------------------------------------------- every size bounded, by formula


def _cfg(*sets: str) -> RunConfig:
    return load_config(RunConfig, None, list(sets))


def test_layers_beyond_their_bound_are_one_line_before_anything_is_built(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """n_layers 10^6 with a forged digest once built on the meta device for minutes."""
    run = _run(tiny_runs, tmp_path)
    data = json.loads((run / "config.json").read_text())
    data["sasrec"]["n_layers"] = 10**6
    (run / "config.json").write_text(json.dumps(data))
    _forge(run, "config.json")
    with pytest.raises(ConfigError) as err:
        load_run(run)
    _one_line(str(err.value), "sasrec.n_layers must be in [0, 256], got 1000000")


def test_an_experiment_specs_sizes_are_bounded_before_a_layer_is_made() -> None:
    from seqrec.experiment import load_spec

    spec = load_spec("ensemble-ml1m").with_overrides(["lrurec.n_layers=1000000"])
    with pytest.raises(ConfigError, match=r"lrurec\.n_layers must be in \[0, 256\]"):
        spec.config(spec.points[0], 0)
    wide = load_spec("ensemble-ml1m").with_overrides(["lrurec.d_model=60000"])
    with pytest.raises(ConfigError, match=r"lrurec asks for .* over the 8\.0 GiB bound"):
        wide.config(wide.points[0], 0)  # its layers alone, before the data is known


def test_the_memory_a_config_asks_for_is_its_formula() -> None:
    """SASRec d=50, 2 blocks, 200 positions over 3,416 items: (3,417 + 200) x 50 embedding rows
    and 2 x (5 x 50^2 + 9 x 50) in the blocks (W^Q, W^K|V and the FFN's two layers, their
    biases and two LayerNorms), 2 x 50 in the last LayerNorm = 206,850
    parameters; a batch of 128 x 200 positions keeps 16 floats a position and layer for 3 layers
    (embedding + 2 blocks) and two 200 x 200 attention maps a layer and head."""
    cfg = _cfg('model="sasrec"', "train.batch_size=128")
    mem = memory(cfg, 3416)
    assert mem.parameters == 4 * 206_850
    assert mem.training == 3 * mem.parameters
    assert mem.activations == 4 * (128 * 200 * 50 * 3 * 16 + 2 * 128 * 1 * 200 * 200 * 2)


def test_a_training_over_the_memory_bound_is_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _cfg('model="bert4rec"', "bert4rec.d_model=60000")
    with pytest.raises(ConfigError) as err:
        check_memory(cfg, 3416, training=True)
    _one_line(str(err.value), "bert4rec asks for", "over the 8.0 GiB bound", "SEQREC_MAX_MODEL")
    small = _cfg('model="sasrec"')
    check_memory(small, 3416, training=True)  # well within
    monkeypatch.setenv("SEQREC_MAX_MODEL_BYTES", "1000000")
    with pytest.raises(ConfigError, match=r"over the 1\.0 MiB bound"):
        check_memory(small, 3416, training=True)
    with pytest.raises(ConfigError, match=r"2,147,483,648 items, over the 2,147,483,645"):
        check_memory(small, 2**31, training=False)


@pytest.mark.slow
def test_train_with_a_100_million_wide_model_is_one_line_under_a_memory_cap(
    tiny_runs: dict[str, Path], tmp_path: Path, memory_cap: Callable[[], None]
) -> None:
    """`seqrec train bert4rec --set bert4rec.d_model=100000000` was a RuntimeError traceback
    from the allocator (24.8 GB asked); now it is over the width bound, and a width within
    it that asks too much is refused from its formula before a weight is allocated."""
    code = (
        "import sys; from seqrec.cli import main; "
        "sys.exit(main(['train', 'bert4rec', '--data', sys.argv[1], '--out', sys.argv[2], "
        "'--set', sys.argv[3], '--set', 'bert4rec.n_heads=1', '--quiet']))"
    )
    for width, words in [
        ("100000000", "bert4rec.d_model must be in [1, 65536], got 100000000"),
        ("60000", "bert4rec asks for"),
    ]:
        out = tmp_path / f"run-{width}"
        proc = _capped(
            code, str(tiny_runs["data"]), str(out), f"bert4rec.d_model={width}", cap=memory_cap
        )
        assert proc.returncode != 0
        _one_line(proc.stderr, words)
        assert not out.exists()


# ------------------------------------------------------------------------- a full disk, one line


def _fill(disk: Path) -> None:
    """Every free byte of the tmpfs taken: the next write fails with ENOSPC."""
    with (disk / "fill").open("wb") as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * (64 << 10))
            f.flush()


def _leftovers(root: Path) -> list[str]:
    """Locks and temporary files anywhere under `root` (the filler aside)."""
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name != "fill" and p.is_file() and (p.name.startswith(".") or ".tmp" in p.name)
    ]


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seqrec", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )


@pytest.mark.slow
def test_prepare_on_a_full_disk_is_one_line_naming_the_path_and_leaves_nothing(
    tiny_runs: dict[str, Path], small_disk: Callable[[int], Path]
) -> None:
    """It was polars' ComputeError traceback from the Parquet writer."""
    disk = small_disk(256 << 10)
    _fill(disk)
    proc = _cli(
        "prepare", "--data", str(tiny_runs["data"]), "--quiet", env={"SEQREC_HOME": str(disk)}
    )
    assert proc.returncode == 2
    _one_line(proc.stderr, "No space left on device", str(disk / "prepared"))
    assert _leftovers(disk) == []


@pytest.mark.slow
def test_training_on_a_full_disk_names_the_path_and_leaves_no_lock(
    tiny_runs: dict[str, Path], small_disk: Callable[[int], Path], tmp_path: Path
) -> None:
    """It was `[Errno 28]` with no path, and `.lock` left behind (the lock's own write)."""
    home = {"SEQREC_HOME": str(tmp_path / "home")}
    train = ["train", "sasrec", "--data", str(tiny_runs["data"]), "--quiet"]
    small = ["--set", "sasrec.max_len=10", "--set", "sasrec.d_model=16", "--set"]
    disk = small_disk(256 << 10)
    _fill(disk)
    proc = _cli(*train, "--out", str(disk / "run"), *small, "train.max_epochs=2", env=home)
    assert proc.returncode == 2
    _one_line(proc.stderr, str(disk / "run"), "No space left on device")
    assert not (disk / "run").exists()  # a run that could not start leaves no directory
    # room for part of the start, then for the start and not the weights: each named
    for size, words in [(12 << 10, "/run/"), (40 << 10, "/run/checkpoint.pt")]:
        disk = small_disk(size)
        proc = _cli(*train, "--out", str(disk / "run"), *small, "train.max_epochs=2", env=home)
        assert proc.returncode == 2
        _one_line(proc.stderr, words, "No space left on device")
        assert _leftovers(disk) == []
        if words == "/run/":  # the start's own files: a failed start takes back what it wrote
            assert not (disk / "run").exists() or list((disk / "run").iterdir()) == []


@pytest.mark.slow
def test_export_on_a_full_disk_is_one_line_and_leaves_no_temp_file(
    tiny_runs: dict[str, Path], small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(256 << 10)
    _fill(disk)
    out = disk / "model.ts"
    proc = _cli("export", str(tiny_runs["sasrec"]), "--format", "torchscript", "--out", str(out))
    assert proc.returncode == 2
    _one_line(proc.stderr, str(out), "No space left on device")
    assert _leftovers(disk) == [] and not out.exists()


# ------------------------------------------------------------------ odd tables, one DataError line


@pytest.mark.parametrize(
    ("columns", "words"),
    [
        ({"item": [[1, 2], [3], [4], [5]]}, "column 'item' is List(Int64), expected integer or"),
        ({"item": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 1}]}, "column 'item' is Struct("),
        ({"user": [[1], [1], [2], [2]]}, "column 'user' is List(Int64)"),
        ({"item": [1.5, 2.0, 3.0, 1.0]}, "column 'item' is Float64, expected integer or text"),
        ({"item": [True, False, True, True]}, "column 'item' is Boolean"),
        ({"timestamp": [[1], [2], [3], [4]]}, "column 'timestamp' is List(Int64), expected a"),
    ],
)
def test_tables_with_nested_or_mistyped_columns_are_one_data_error(
    columns: dict[str, list[object]], words: str, tmp_path: Path
) -> None:
    """A Parquet file with a list-typed column was polars' InvalidOperationError traceback; a
    struct or float item column was read as ids."""
    import polars as pl

    import seqrec
    from seqrec.data.io import read_table
    from seqrec.errors import DataError

    df = pl.DataFrame({"user": [1, 1, 2, 2], "item": [1, 2, 3, 1], "timestamp": [1, 2, 3, 4]})
    df = df.with_columns(pl.Series(k, v) for k, v in columns.items())
    path = tmp_path / "log.parquet"
    df.write_parquet(path)
    for attempt in (
        lambda: read_table(path),
        lambda: seqrec.prepare(df, out=tmp_path / "prepared", progress=False),
    ):
        with pytest.raises(DataError) as err:
            attempt()
        _one_line(str(err.value), words)
    assert not (tmp_path / "prepared").exists()
    proc = _cli("prepare", "--data", str(path), "--out", str(tmp_path / "p2"), "--quiet")
    assert proc.returncode == 2
    _one_line(proc.stderr, str(path), words)
    assert not (tmp_path / "p2").exists()


# ------------------------------------------------------------------------------ names are names


def test_a_spec_named_dots_is_refused_before_a_run_is_written(tmp_path: Path) -> None:
    """A spec file named `...toml` had the spec name `..`: its runs went outside --runs-dir."""
    spec = tmp_path / "...toml"
    spec.write_text('base = "sasrec-ce"\nbudget = "1m"\n[[points]]\nlabel = "a"\nset = []\n')
    runs = tmp_path / "runs"
    proc = _cli("experiment", str(spec), "--data", "nowhere.csv", "--runs-dir", str(runs))
    assert proc.returncode == 2
    _one_line(proc.stderr, "the spec name '..' cannot name a file")
    assert not runs.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["...toml"]


@pytest.mark.parametrize("name", ["..", ".", "../escape", "a/b", "", ".hidden", "tab\there"])
def test_names_that_are_paths_are_refused(name: str, tmp_path: Path) -> None:
    import polars as pl

    import seqrec
    from seqrec.files import check_name

    with pytest.raises(ConfigError, match="cannot name a file"):
        check_name(name, "name")
    df = pl.DataFrame({"user": [1, 1, 2, 2], "item": [1, 2, 3, 1]})
    with pytest.raises(ConfigError, match="dataset name .* cannot name a file"):
        seqrec.prepare(df, time_col=None, name=name or "/", progress=False)
    assert check_name("ml-1m sasrec+ce 0.5", "name") == "ml-1m sasrec+ce 0.5"
