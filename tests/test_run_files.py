"""Every file a loader reads is checked before use (seqrec.training.checkpoint): its digest bound
to its name in the manifest, the config's values against their ranges, the model's size against
a bound and the weights' shapes against the config, before the model is allocated. Each
malformed or edited file is one line naming it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.errors import ConfigError, RunError, SeqrecError
from seqrec.training.checkpoint import load_run


def _copy(tiny_runs: dict[str, Path], tmp_path: Path, model: str = "sasrec") -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs[model], run)
    return run


def _forge(run: Path, name: str) -> None:
    """Record the file's digest as if seqrec had written it (what an editor of the directory who
    also rewrites the manifest does: the range and shape checks must still hold)."""
    digests = json.loads((run / "sha256.json").read_text())
    digests[name] = hashlib.sha256((run / name).read_bytes()).hexdigest()
    (run / "sha256.json").write_text(json.dumps(digests))


def _edit_json(run: Path, name: str, change: dict[str, object], forge: bool = True) -> None:
    data = json.loads((run / name).read_text())
    for dotted, value in change.items():
        node = data
        *path, key = dotted.split(".")
        for p in path:
            node = node[p]
        node[key] = value
    (run / name).write_text(json.dumps(data))
    if forge:
        _forge(run, name)


def _one_line(err: pytest.ExceptionInfo[SeqrecError], *words: str) -> None:
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    for w in words:
        assert w in message, message


def test_an_edited_config_or_vocab_is_refused_by_its_digest(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy(tiny_runs, tmp_path)
    _edit_json(run, "config.json", {"sasrec.d_model": 4000}, forge=False)
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(err, "config.json", "not one this run recorded")
    run2 = tmp_path / "run2"
    shutil.copytree(tiny_runs["sasrec"], run2)
    _edit_json(run2, "vocab.json", {"items": list(range(2_000_000))}, forge=False)
    with pytest.raises(RunError) as err:
        load_run(run2)
    _one_line(err, "vocab.json", "not one this run recorded")


def test_a_swapped_weight_file_is_refused_digests_are_bound_to_names(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy(tiny_runs, tmp_path)
    shutil.copyfile(run / "checkpoint.prev.pt", run / "model.pt")  # its digest is recorded too
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(err, "model.pt", "not one this run recorded for it")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"sasrec.n_heads": 0}, ["sasrec.n_heads must be in [1, 1024], got 0"]),
        ({"sasrec.max_len": -3}, ["sasrec.max_len must be in [1, 65536], got -3"]),
        ({"sasrec.max_len": 0}, ["sasrec.max_len must be in [1, 65536], got 0"]),
        ({"sasrec.dropout": float("nan")}, ["sasrec.dropout must be a finite number"]),
        ({"train.batch_size": -8}, ["train.batch_size must be in [1, 1048576], got -8"]),
        ({"sasrec.n_heads": 3}, ["d_model (16) must be a multiple of n_heads (3)"]),
        ({"sasrec.d_model": "wide"}, ["sasrec.d_model"]),
    ],
)
def test_config_values_are_range_checked_on_load(
    change: dict[str, object], words: list[str], tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy(tiny_runs, tmp_path)
    _edit_json(run, "config.json", change)
    with pytest.raises(ConfigError) as err:
        load_run(run)
    _one_line(err, "config.json", *words)


def test_a_model_over_the_size_bound_is_refused_before_allocation(
    tiny_runs: dict[str, Path], tmp_path: Path, memory_cap: Callable[[], None]
) -> None:
    """d_model 40,000 describes a 59.6 GiB model: refused from its numbers (seqrec.training.sizes)
    in a process capped at 1 GiB over what importing seqrec takes (building it would die there)."""
    run = _copy(tiny_runs, tmp_path)
    _edit_json(run, "config.json", {"sasrec.d_model": 40_000, "sasrec.n_heads": 1})
    code = "import sys; from seqrec.training.checkpoint import load_run; load_run(sys.argv[1])"

    proc = subprocess.run(
        [sys.executable, "-c", code, str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=memory_cap,
    )
    assert proc.returncode != 0
    assert "sasrec asks for 59.6 GiB (its parameters at 60 items)" in proc.stderr
    assert "over the 8.0 GiB bound; smaller sizes, or $SEQREC_MAX_MODEL_BYTES" in proc.stderr
    assert "MemoryError" not in proc.stderr


def test_weights_that_do_not_fit_the_config_are_one_line(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    # a larger catalogue in the vocab than the weights hold (2 million items: 64 MB on meta only)
    run = _copy(tiny_runs, tmp_path)
    _edit_json(run, "vocab.json", {"items": list(range(2_000_000)), "popularity": None})
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(err, "model.pt", "the weights do not fit the run's config", "expected")
    # a wider model in the config than in the weights
    run2 = tmp_path / "run2"
    shutil.copytree(tiny_runs["sasrec"], run2)
    _edit_json(run2, "config.json", {"sasrec.d_model": 32})
    with pytest.raises(RunError) as err:
        load_run(run2)
    _one_line(err, "model.pt", "do not fit")


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("sha256.json", "[1, 2]", ["sha256.json", "damaged"]),
        ("sha256.json", "{not json", ["sha256.json", "not JSON"]),
        ("config.json", "{not json", ["config.json", "not JSON"]),
        ("config.json", "[]", ["config.json", "expected a JSON object"]),
        ("vocab.json", '{"popularity": [1]}', ["vocab.json", "'items'"]),
        ("vocab.json", '{"items": [1, 2], "n_users": -1}', ["vocab.json", "n_users"]),
        ("model.pt", "not a zip", ["model.pt", "refused"]),
    ],
)
def test_every_malformed_run_file_is_one_line_naming_it(
    name: str, content: str, words: list[str], tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = _copy(tiny_runs, tmp_path)
    (run / name).write_text(content)
    if name != "sha256.json":
        _forge(run, name)
    with pytest.raises(SeqrecError) as err:
        load_run(run)
    _one_line(err, *words)


def test_a_missing_manifest_is_an_error_unless_trusted(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tiny_runs, tmp_path)
    (run / "sha256.json").unlink()
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(err, "sha256.json: missing", "--trust")
    assert load_run(run, trust=True).model is not None  # a hand-made run, loaded on purpose
    argv = ["recommend", str(run), "--history", "1,2,3", "--json"]
    assert main(argv) == 2
    assert "--trust" in capsys.readouterr().err
    assert main([*argv, "--trust"]) == 0
    assert len(json.loads(capsys.readouterr().out)["items"]) == 10


def test_weights_written_but_not_recorded_say_resume_and_resume_repairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed between writing model.pt and recording its digest (and before metrics.json):
    the load names --resume, and --resume finishes the run so that it loads."""
    from seqrec.data.synthetic import synthetic_interactions

    df = synthetic_interactions(n_users=60, n_items=40, seed=4)
    data = tmp_path / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    data.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    run = tmp_path / "run"
    sets = ["sasrec.max_len=12", "sasrec.d_model=16", "train.max_epochs=2", "train.threads=1"]
    argv = ["train", "sasrec", "--data", str(data), "--out", str(run), "--quiet"]
    argv += [x for s in sets for x in ("--set", s)]
    assert main(argv) == 0
    digests = json.loads((run / "sha256.json").read_text())
    del digests["model.pt"], digests["metrics.json"]
    (run / "sha256.json").write_text(json.dumps(digests))
    (run / "metrics.json").unlink()
    with pytest.raises(RunError) as err:
        load_run(run)
    _one_line(err, "model.pt", "not recorded", "--resume")
    capsys.readouterr()
    resume = ["train", "sasrec", "--data", str(data), "--out", str(run), "--resume", "--quiet"]
    assert main(resume) == 0
    assert load_run(run).metrics is not None


def test_the_manifest_protects_the_files_it_names(tiny_runs: dict[str, Path]) -> None:
    """What the check covers, as the README says: every file a loader reads."""
    digests = json.loads((tiny_runs["sasrec"] / "sha256.json").read_text())
    for name in ("config.json", "vocab.json", "metrics.json", "model.pt", "checkpoint.pt"):
        assert name in digests
        digest = hashlib.sha256((tiny_runs["sasrec"] / name).read_bytes()).hexdigest()
        assert digests[name] == digest, name


def test_a_finished_run_keeps_its_last_checkpoint_only_unless_told(tmp_path: Path) -> None:
    from seqrec.data.synthetic import synthetic_interactions

    df = synthetic_interactions(n_users=50, n_items=30, seed=7)
    data = tmp_path / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    data.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    sets = ["sasrec.max_len=8", "sasrec.d_model=8", "train.max_epochs=3", "train.threads=1"]
    base = ["train", "sasrec", "--data", str(data), "--quiet"]
    base += [x for s in sets for x in ("--set", s)]
    for keep, want in (
        ([], {"checkpoint.pt"}),
        (["--keep-checkpoints"], {"checkpoint.pt", "checkpoint.prev.pt"}),
    ):
        out = tmp_path / f"run{len(keep)}"
        assert main([*base, "--out", str(out), *keep]) == 0
        assert {p.name for p in out.glob("checkpoint*.pt")} == want
        digests = json.loads((out / "sha256.json").read_text())
        assert {n for n in digests if n.startswith("checkpoint")} == want
        assert load_run(out).metrics is not None


def test_weights_stream_to_their_file_and_their_digest_is_the_file_s(tmp_path: Path) -> None:
    """A checkpoint was built whole in memory, and copied, before it was written: at ten
    million items (weights and Adam's moments, 9.6 GiB) that was the difference between
    fitting and being killed."""
    import tracemalloc

    import torch

    from seqrec.training.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    state = {"w": torch.arange(10_000_000, dtype=torch.float32)}  # 40 MB
    tracemalloc.start()
    run.save_model(state)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20  # Python-side buffers: the chunks, not the whole file
    data = (run.path / "model.pt").read_bytes()
    digests = json.loads((run.path / "sha256.json").read_text())
    assert digests["model.pt"] == hashlib.sha256(data).hexdigest()
    assert torch.equal(torch.load(run.path / "model.pt")["w"], state["w"])
