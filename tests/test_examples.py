"""The runnable example of the README's "your own data" section runs, on a synthetic log of
string ids, and its save/load check holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "own_data.py"


def test_the_own_data_example_runs(tmp_path: Path) -> None:
    env = {**os.environ, "SEQREC_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "", "3s"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "same after save/load: True" in proc.stdout
    assert "similar" in proc.stdout and "ndcg@10" in proc.stdout
