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

from seqrec.config import RunConfig, load_config
from seqrec.errors import ConfigError, RunError
from seqrec.training.checkpoint import load_run
from seqrec.training.sizes import check_memory, memory

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
    "load_run": (
        "import sys; from seqrec.training.checkpoint import load_run; load_run(sys.argv[1])"
    ),
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
def test_weights_are_held_once_when_loaded(tmp_path: Path) -> None:
    """A run whose weights take 400 MB: loading it raises the process's peak resident memory
    by at most 1.4 times that (measured: 1.2; read whole, hashed, then copied into a freshly
    built model, the weights took 2.2 times their size)."""
    import torch

    from seqrec.training.checkpoint import build_model
    from seqrec.training.rundir import RunDir

    cfg = load_config(
        RunConfig, None, ['model="bpr-mf"', "bpr_mf.d_model=500", 'train.device="cpu"']
    )
    n_items, n_users = 200_000, 0
    assert 390e6 < memory(cfg, n_items, n_users).parameters < 410e6
    run = RunDir(tmp_path / "big")
    items = [str(i) for i in range(1, n_items + 1)]
    run.start({**cfg.to_dict(), "source": {}}, {"items": items, "n_users": n_users}, None)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in build_model(cfg, n_items, n_users).state_dict().items()}
    run.save_model({k: torch.zeros(s) for k, s in shapes.items()})
    size = (run.path / "model.pt").stat().st_size
    code = (
        "import resource, sys\n"
        "from seqrec.training.checkpoint import load_run\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "r = load_run(sys.argv[1])\n"
        "print(sum(p.numel() for p in r.model.parameters()))\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run.path)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    params, grew = (int(x) for x in proc.stdout.split())
    assert params == sum(torch.Size(s).numel() for s in shapes.values())
    assert grew <= 1.4 * size, f"{grew / size:.2f} times the weights"


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
    from seqrec.experiments.spec import load_spec

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
    (embedding + 2 blocks) and two 200 x 200 attention maps a layer and head; its BCE loss
    gathers one negative's embedding a position (values and gradients) and two logits."""
    cfg = _cfg('model="sasrec"', "train.batch_size=128")
    assert (cfg.train.loss, cfg.train.n_negatives, cfg.train.negatives_per) == (
        "bce",
        1,
        "position",
    )
    mem = memory(cfg, 3416)
    assert mem.parameters == 4 * 206_850
    assert mem.training == 3 * mem.parameters
    positions = 128 * 200
    loss = 2 * (positions * 1 * 2 * 50 + positions * 2)
    assert mem.activations == 4 * (positions * 50 * 3 * 16 + 2 * 128 * 1 * 200 * 200 * 2 + loss)


def test_the_sampled_losses_negatives_are_weighed() -> None:
    """Caser with 16,384 negatives a position (what the property test below first found: a
    397 MB gather of negative embeddings under a 128 MiB bound): 50 x 61 positions, each with
    its negatives' 13-wide embeddings gathered and their logits, values and gradients."""
    cfg = _cfg(
        'model="caser"',
        "caser.d_model=13",
        "caser.max_len=61",
        "train.batch_size=50",
        "train.n_negatives=16384",
        'train.loss="bce"',
    )
    positions, k = 50 * 61, 16384
    loss = 2 * (positions * k * 2 * 13 + positions * (k + 1))
    hidden = positions * 13 * 2 * 16  # the embedding layer and one more: caser has no n_layers
    assert memory(cfg, 25).activations == 4 * (hidden + loss)
    with pytest.raises(ConfigError, match="caser asks for 10.1 GiB"):
        check_memory(cfg, 25, training=True)


@pytest.mark.parametrize(
    ("config", "batch", "gib"),
    [("ml-1m-bert4rec", 2048, 7.15), ("ml-1m-bert4rec", 128, 0.46), ("ml-1m-sasrec-ce", 512, 1.49)],
)
def test_the_estimates_the_docs_quote(config: str, batch: int, gib: float) -> None:
    """docs/design/reliability.md sets these beside the GPU memory the recipes took."""
    cfg = load_config(RunConfig, config, [f"train.batch_size={batch}"])
    assert round(memory(cfg, 3416, 6040).total / 2**30, 2) == gib


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


def test_an_estimator_over_the_memory_bound_prepares_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory its layers ask for is weighed before `fit` prepares the data."""
    import polars as pl

    import seqrec

    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    df = pl.DataFrame({"user": [1, 1, 2, 2, 3, 3], "item": [1, 2, 3, 1, 2, 3]})
    with pytest.raises(ConfigError) as err:
        seqrec.SASRec(d_model=60000, n_heads=1).fit(df, time_col=None, progress=False)
    _one_line(str(err.value), "sasrec asks for", "over the 8.0 GiB bound")
    assert not (tmp_path / "home").exists()


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
    from seqrec.data.tables import read_table
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


# ------------------------------------------------------------ any config: a step, or one line

# Run in a child with the memory bound at 64 MiB: every drawn config must either train its
# first step, weighed within the bound, its peak resident memory no more than twice the bound
# (and 192 MiB of slack: torch's own buffers) above a first tiny training's, or be refused
# with one SeqrecError line before anything is written; a traceback or a MemoryError fails.
# (The child's address space is capped too, at 3 GiB over an import of seqrec: a safety net.)
_PROPERTY = r"""
import json, resource, shutil, sys, tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from seqrec.config import RunConfig, load_config
from seqrec.data.prepare import prepare_frame
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import SeqrecError
from seqrec.models.registry import MODELS
from seqrec.training.sizes import check_memory
from seqrec.training.fit import fit

root = Path(sys.argv[1])
ds = prepare_frame(
    synthetic_interactions(n_users=40, n_items=25, min_len=5, max_len=12, seed=1),
    root / "prepared", name="toy", progress=False,
)
BOUND = 64 << 20
WIDTH = {"ncf": "factors", "gru4rec": "hidden"}


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


warm = ['model="sasrec"', "train.max_steps=1", "sasrec.max_len=8", "sasrec.d_model=8",
        "train.batch_size=8", "train.threads=1"]
fit(ds, load_config(RunConfig, None, warm), root / "warm", progress=False)
baseline = peak()
wild = st.one_of(
    st.integers(-2, 70),
    st.sampled_from([2**k for k in range(27)]),
    st.integers(0, 2**20),
)
tame = st.integers(1, 24)  # sizes that train
seen = {"trained": 0, "refused": 0}


@settings(
    max_examples=int(sys.argv[2]), deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)
@given(model=st.sampled_from(sorted(MODELS)), extreme=st.integers(-1, 5), data=st.data())
def one(model, extreme, data):
    # every size tame but one (`extreme`: its index; -1 none), drawn from anywhere: each size's
    # own bounds are what a draw finds, not the first of six to be out of range
    width, layers, heads, length, batch, negatives = (
        data.draw(wild if i == extreme else tame) for i in range(6)
    )
    section = MODELS[model].sections
    own = next(iter(section))
    sets = [f"model={json.dumps(model)}", "train.max_steps=1", "train.max_epochs=1",
            "train.threads=1", 'train.device="cpu"', "train.eval_every=1",
            f"{own}.{WIDTH.get(model, 'd_model')}={width}", f"train.batch_size={batch}",
            f"train.n_negatives={negatives}"]
    fields = {f for f in section[own].__dataclass_fields__}
    sets += [f"{own}.{k}={v}" for k, v in
             (("n_layers", layers), ("n_heads", heads), ("max_len", length))
             if k in fields]
    out = Path(tempfile.mkdtemp(dir=root)) / "run"
    try:
        cfg = load_config(RunConfig, None, sets)
        fit(ds, cfg, out, progress=False)
        check_memory(cfg, ds.n_items, ds.n_users, training=True)  # it was within the bound
        grew = peak() - baseline
        assert grew <= 2 * BOUND + (192 << 20), (sets, f"{grew / 2**20:.0f} MiB")
        seen["trained"] += 1
    except SeqrecError as err:
        assert "\n" not in str(err).strip() and len(str(err)) < 1000, str(err)
        assert not out.exists() or not any(out.iterdir()), sets  # nothing left behind
        seen["refused"] += 1
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


one()
print(json.dumps({**seen, "grew_mib": round((peak() - baseline) / 2**20)}))
"""


@pytest.mark.slow
def test_any_config_trains_a_step_within_the_bound_or_is_one_line(
    tmp_path: Path, wide_memory_cap: Callable[[], None]
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SEQREC_MAX_MODEL_BYTES": str(64 << 20)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROPERTY, str(tmp_path), "200"],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=wide_memory_cap,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["trained"] >= 5 and seen["refused"] >= 5, seen  # both sides were drawn


# ---------------------------------------------------------- the catalogue's files and numbers


@pytest.mark.slow
def test_the_catalogue_size_cases_are_one_line_under_a_memory_cap(
    tmp_path: Path, memory_cap: Callable[[], None]
) -> None:
    """Each once allocated gigabytes or died in a library: a 60 GB sparse index.bin (read
    whole), a 3 GB sparse items table (polars' panic), `--draws` 10^9 (a list of 10^9 seeds),
    `--ef-search` 10^9 (faiss' bad_alloc). Under the cap: exit 2, one line, quickly, nothing
    left behind; the run with the bad index still serves."""
    pytest.importorskip("faiss")
    import time

    import polars as pl

    from planted import feature_config, planted_log
    from seqrec.data.prepare import prepare
    from seqrec.training.fit import fit

    log, items = planted_log()
    table = tmp_path / "items.csv"
    items.filter(pl.col("item") <= 40).write_csv(table)
    ds = prepare(log, out=tmp_path / "prepared", name="planted", progress=False)
    run = tmp_path / "run"
    fit(ds, feature_config("sasrec", table, "train.max_epochs=1"), run, progress=False)
    huge = tmp_path / "new.csv"
    with open(huge, "wb") as f:
        f.truncate(3 << 30)
    before = sorted(p.name for p in run.iterdir())
    cli = "import sys; from seqrec.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv, words in (
        (["add-items", str(run), "--items", str(huge)], ["new.csv", "bound"]),
        (["evaluate", str(run), "--draws", str(10**9)], ["--draws", "expected <= 1,000"]),
        (["index", str(run), "--ef-search", str(10**9)], ["--ef-search", "expected <= 65,536"]),
    ):
        start = time.monotonic()
        proc = _capped(cli, *argv, cap=memory_cap)
        assert proc.returncode == 2, proc.stderr
        assert time.monotonic() - start < 60
        _one_line(proc.stderr.strip(), *words)
    with open(run / "index.bin", "wb") as f:
        f.truncate(60 << 30)
    before.append("index.bin")
    served = _capped(cli, "recommend", str(run), "--history", "1,5,9", cap=memory_cap)
    assert served.returncode == 0, served.stderr
    assert "index.bin" in served.stderr and "scoring exactly" in served.stderr
    assert served.stdout.strip()
    assert sorted(p.name for p in run.iterdir()) == sorted(before)
