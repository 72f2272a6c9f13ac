from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own empty cache: nothing leaks into ~/.cache or between tests."""
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "seqrec-home"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real-data folder (laid out like shared/data); tests that need it skip without it."""
    root = os.environ.get("SEQREC_DATA_DIR")
    if not root or not Path(root).is_dir():
        pytest.skip("SEQREC_DATA_DIR not set: real-data checks skipped")
    return Path(root)
