"""The package as a user installs it: a wheel built from the checkout holds the code, the shipped
configs and experiment specs and the licence, and its CLI runs from the installed copy."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_installs_and_its_cli_runs(tmp_path: Path) -> None:
    dist, target = tmp_path / "dist", tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("seqrec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "seqrec/cli/__init__.py",
        "seqrec/configs/ml-1m-bert4rec.toml",
        "seqrec/experiments/table4-ml1m.toml",
        "seqrec/serving/guard.py",
    ):
        assert needed in names, needed
    assert any(n.endswith("LICENSE") for n in names)
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    code = (
        "import seqrec, sys; from seqrec.cli import main; from seqrec.config import load_config,"
        " RunConfig; assert seqrec.__file__.startswith(sys.argv[1]), seqrec.__file__;"
        " load_config(RunConfig, 'ml-1m-bert4rec'); raise SystemExit(main(['--version']))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith("seqrec ")
