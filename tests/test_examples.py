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


def test_the_item_features_example_adds_and_recommends_a_new_item(tmp_path: Path) -> None:
    env = {**os.environ, "SEQREC_HOME": str(tmp_path / "home")}
    example = EXAMPLE.parent / "item_features.py"
    proc = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the new tea item (sku-0123) reaches the top 20 of a history of tea
    assert "added 6 new items; in the top 20 of a tea history: ['sku-0123']" in proc.stdout
