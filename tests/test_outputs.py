"""No command deletes or overwrites what seqrec did not create (seqrec.outputs): every command
with an output directory or file, tried on a user's folder, the data's own folder, a run
directory and a seqrec directory of another kind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError
from seqrec.outputs import dir_kind


def _log(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    df = synthetic_interactions(n_users=60, n_items=40, seed=2)
    p = folder / "ratings.dat"
    rows = df.select("user", "item", "timestamp").iter_rows()
    p.write_text("".join(f"{u}::{i}::4::{t}\n" for u, i, t in rows))
    return p


def _precious(folder: Path) -> dict[Path, bytes]:
    """A user's folder with a file in it; returns what must survive."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "thesis.txt").write_text("thesis\n")
    return _snapshot(folder)


def _snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("seqrec: error: "), err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("command", ["prepare", "stats"])
def test_prepare_and_stats_never_replace_a_users_folder(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    precious = tmp_path / "precious"
    before = _precious(precious)
    argv = [command, "--data", str(src), "--out", str(precious), "--quiet"]
    _refused(argv, capsys, str(precious), "did not write")
    assert _snapshot(precious) == before
    _refused([*argv, "--force"], capsys, "did not write")  # --force replaces only seqrec's own
    assert _snapshot(precious) == before
    # the data's own folder, or the data file itself: refused, the source intact
    data_before = _snapshot(src.parent)
    for out in (src.parent, src, tmp_path):
        _refused([command, "--data", str(src), "--out", str(out), "--quiet"], capsys, "reads")
    assert _snapshot(src.parent) == data_before


def test_a_prepared_out_is_reused_and_replaced_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    out = tmp_path / "prepared"
    out.mkdir()  # an empty folder is fine
    assert main(["prepare", "--data", str(src), "--out", str(out), "--quiet"]) == 0
    assert dir_kind(out) == "prepared"
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert main(["prepare", "--data", str(src), "--out", str(out), "--quiet"]) == 0
    assert (out / "manifest.json").stat().st_mtime_ns == stamp  # unchanged: reused
    other = ["prepare", "--data", str(src), "--out", str(out), "--quiet"]
    other += ["--min-user-interactions", "6"]
    _refused(other, capsys, "another source or settings", "--force")
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    assert main([*other, "--force"]) == 0
    assert '"min_user_interactions": 6' in (out / "manifest.json").read_text()
    # a user's file dropped into a prepared folder makes it the user's: never replaced
    (out / "notes.txt").write_text("mine")
    _refused([*other, "--force"], capsys, "did not write")
    assert (out / "notes.txt").read_text() == "mine"


def test_evaluate_and_attention_never_write_over_a_run(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["bert4rec"], run)
    data = str(tiny_runs["data"])
    before = _snapshot(run)
    for argv in (
        ["evaluate", str(run), "--data", data, "--out", str(run)],
        ["evaluate", str(run), "--data", data, "--out", str(tmp_path)],  # contains the run
        ["attention", str(run), "--data", data, "--out", str(run)],
    ):
        _refused([*argv, "--quiet"], capsys, "reads")
        assert _snapshot(run) == before
    # a run directory is not a prepared one, whichever command is given it
    other = tmp_path / "other-run"
    shutil.copytree(tiny_runs["sasrec"], other)
    _refused(
        ["evaluate", str(run), "--data", data, "--out", str(other), "--force", "--quiet"],
        capsys,
        "seqrec run directory",
    )
    assert dir_kind(other) == "run"
    # output files: never a run's own file, never an existing file without --force
    for figure in (run / "config.png", run / "vocab.png"):  # its JSON would be config.json
        _refused(
            ["attention", str(run), "--data", data, "--figure", str(figure), "--quiet"],
            capsys,
            "seqrec run directory",
        )
    assert _snapshot(run) == before
    mine = tmp_path / "mine.parquet"
    mine.write_text("mine")
    argv = ["evaluate", str(run), "--data", data, "--save-ranks", str(mine), "--quiet"]
    _refused(argv, capsys, "exists", "--force")
    assert mine.read_text() == "mine"


def test_train_and_refit_never_take_a_folder_they_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    precious = tmp_path / "precious"
    before = _precious(precious)
    argv = ["train", "sasrec", "--data", str(src), "--quiet", "--set", "train.max_epochs=1"]
    _refused([*argv, "--out", str(precious)], capsys, "did not write")
    assert _snapshot(precious) == before
    _refused([*argv, "--out", str(src.parent)], capsys, "reads")
    _refused(["refit", str(precious), "--out", str(tmp_path / "r"), "--quiet"], capsys)
    assert _snapshot(precious) == before and not (tmp_path / "r").exists()


def test_export_and_recommend_replace_only_with_force(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["sasrec"], run)
    before = _snapshot(run)
    for name in ("model.pt", "config.json", "checkpoint.pt"):
        argv = ["export", str(run), "--format", "torchscript", "--out", str(run / name)]
        _refused([*argv, "--force"], capsys, "seqrec run directory")
    assert _snapshot(run) == before
    mine = tmp_path / "model.ts"
    mine.write_text("mine")
    _refused(["export", str(run), "--format", "torchscript", "--out", str(mine)], capsys, "exists")
    assert mine.read_text() == "mine"
    argv = ["export", str(run), "--format", "torchscript", "--out", str(mine), "--force"]
    assert main(argv) == 0 and mine.read_bytes() != b"mine"
    # the default file inside the run is seqrec's own: written again without --force
    for _ in range(2):
        assert main(["export", str(run), "--format", "torchscript"]) == 0
    capsys.readouterr()
    recs = tmp_path / "recs.csv"
    recs.write_text("mine")
    argv = ["recommend", str(run), "--input", str(tiny_runs["data"]), "--output", str(recs)]
    _refused([*argv, "--quiet"], capsys, "exists", "--force")
    assert recs.read_text() == "mine"
    _refused(
        [
            "recommend",
            str(run),
            "--input",
            str(tiny_runs["data"]),
            "--output",
            str(tiny_runs["data"]),
        ],
        capsys,
        "reads",
    )


def test_a_full_disk_during_export_is_one_line_naming_the_file(
    tiny_runs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """TorchScript's own file writer aborted the process on ENOSPC and left `.model.ts.tmp`:
    the export is serialised in memory and written by atomic_write, whose failure names the
    file and leaves nothing behind."""
    import errno

    from seqrec import provenance
    from seqrec.serving import export

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["sasrec"], run)
    real = provenance.atomic_write

    def full_disk(path: Path, write: object) -> None:
        def failing(f: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        real(path, failing)

    monkeypatch.setattr(export, "atomic_write", full_disk)
    for fmt in ("torchscript", "onnx"):
        err = _refused(["export", str(run), "--format", fmt], capsys, "No space left on device")
        assert str(run / ("model.ts" if fmt == "torchscript" else "model.onnx")) in err
    assert not [p.name for p in run.iterdir() if p.name.startswith(".model")]


def test_significance_on_a_file_that_is_not_a_rank_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "ranks.parquet"
    text.write_text("user,rank\n1,2\n")
    _refused(["significance", str(text), str(text)], capsys, "ranks.parquet", "not a rank file")


def test_an_error_line_echoing_a_huge_field_stays_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.csv"
    log.write_text("user,item,timestamp\n1,2," + "9" * 900_000 + "x\n")
    err = _refused(["prepare", "--data", str(log), "--quiet"], capsys, "log.csv:2")
    assert len(err) < 400


@pytest.mark.parametrize(
    "bad",
    [
        "cloze.mask_prob=1.5",
        "bert4rec.n_heads=0",
        "bert4rec.dropout=nan",
        "train.batch_size=0",
        "train.decay_start=1.0",
        "eval.batch_size=-1",
        "data.min_user_interactions=0",
    ],
)
def test_an_invalid_value_leaves_no_directory_and_the_same_out_then_works(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    out = tmp_path / "run"
    argv = ["train", "bert4rec", "--data", str(src), "--out", str(out), "--quiet"]
    tiny = [
        "--set",
        "bert4rec.max_len=8",
        "--set",
        "bert4rec.d_model=8",
        "--set",
        "train.max_epochs=1",
    ]
    _refused([*argv, *tiny, "--set", bad], capsys, bad.split("=")[0].split(".")[-1])
    assert not out.exists()
    assert main([*argv, *tiny]) == 0 and (out / "model.pt").exists()


@pytest.mark.parametrize(
    ("model", "bad"),
    [
        ("caser", "next_item.pack=true"),  # a whole-row model cannot pack rows
        ("bert4rec", 'train.val_metric="ndcg@20"'),
        ("gru4rec", 'train.decay="budget"'),  # a budget decay needs a time budget
    ],
)
def test_an_incompatible_setting_leaves_no_directory(
    model: str, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _log(tmp_path / "data")
    out = tmp_path / "run"
    argv = ["train", model, "--data", str(src), "--out", str(out), "--quiet", "--set", bad]
    _refused(argv, capsys, bad.split("=")[0].split(".")[-1])
    assert not out.exists()


def test_a_run_killed_before_its_config_is_taken_over_a_users_manifest_is_not(
    tmp_path: Path,
) -> None:
    """A training killed halfway through its first writes leaves its lock, a temporary file and
    perhaps the manifest with the config pending: the next training there starts (it once said
    the folder held files seqrec did not write). A folder whose `sha256.json` is not a seqrec
    manifest stays the user's."""
    from seqrec.outputs import check_out_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("123 456 host")
    (out / ".sha256.json.k3j2h1").write_text('{"config.js')
    assert check_out_dir(out, "run") is False
    (out / "sha256.json").write_text('{".pending": {"config.json": "' + "0" * 64 + '"}}')
    assert check_out_dir(out, "run") is False
    (out / "sha256.json").write_text('{"photos.zip": "' + "0" * 64 + '"}')
    with pytest.raises(ConfigError, match="holds files seqrec did not write"):
        check_out_dir(out, "run")
