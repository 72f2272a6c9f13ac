"""What docs/deploy.md promises: a run reduced to the files a server reads serves the same
answers, and the Dockerfile's command line is one the CLI accepts (docker itself is not run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seqrec.cli import build_parser
from seqrec.serving.recommender import Recommender

SERVING_FILES = ("config.json", "vocab.json", "model.pt", "metrics.json", "sha256.json")
ROOT = Path(__file__).resolve().parent.parent


def test_a_run_reduced_to_the_serving_files_answers_the_same(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    full = tiny_runs["sasrec"]
    slim = tmp_path / "slim"
    slim.mkdir()
    for name in SERVING_FILES:
        shutil.copy2(full / name, slim / name)
    a, b = Recommender.from_run(full), Recommender.from_run(slim)
    for history in ([], list(a.item_ids[:4]), list(a.item_ids[10:30])):
        assert a.recommend(history, k=10) == b.recommend(history, k=10)
    assert b.info()["metrics"]["test"] == json.loads((full / "metrics.json").read_text())["test"]


def test_the_dockerfile_runs_a_command_the_cli_accepts() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    argv = json.loads(entry.removeprefix("ENTRYPOINT").strip())
    assert argv[0] == "seqrec"
    args = build_parser().parse_args(argv[1:])
    assert args.func.__name__ == "cmd_serve" and args.api_key_env == "SEQREC_API_KEY"
    assert args.host == "0.0.0.0"  # beyond the loopback: hence the token
