"""`seqrec report`: one self-contained HTML page of runs (no network), with the numbers of the
runs' own files, rendered by a real browser (headless Chromium) into a non-empty page."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from seqrec.cli import main


def _report(tiny_runs: dict[str, Path], tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / "report.html"
    runs = [str(tiny_runs["sasrec"]), str(tiny_runs["bert4rec"])]
    assert main(["report", *runs, "--out", str(out), "--users", "2"]) == 0
    return out, out.read_text()


def test_the_report_holds_the_runs_numbers_and_needs_no_network(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, page = _report(tiny_runs, tmp_path)
    # self-contained: every image inline, nothing fetched
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 3  # the curves, and an attention map per transformer run
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    for name in ("sasrec", "bert4rec"):
        metrics = json.loads((tiny_runs[name] / "metrics.json").read_text())
        for protocol, values in metrics["test"].items():
            assert f"<td>{values['ndcg@10']:.4f}</td>" in page, (name, protocol)
    assert "Paired tests" in page and page.count("<td>bert4rec</td>") >= 1
    assert page.count("Top-10 of the first users") == 2
    assert "Movie " in page  # titles from the data's movies.dat
    # it never writes over a file without --force
    runs = [str(tiny_runs["sasrec"])]
    assert main(["report", *runs, "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_the_papers_rows_only_on_the_papers_data_and_titles_from_an_items_file(
    tmp_path: Path,
) -> None:
    """A run on a user's own log shows its own metrics and no paper's rows (they are the
    papers' ML-1M numbers); `--items` gives the top-10s the titles of an items file."""
    import polars as pl

    import seqrec
    from seqrec.data.synthetic import synthetic_interactions

    df = synthetic_interactions(n_users=50, n_items=30, min_len=6, max_len=12, seed=2)
    log = df.select(pl.col("user").alias("user_id"), pl.col("item").alias("sku"), "timestamp")
    model = seqrec.SASRec(d_model=16, max_len=10, max_epochs=2, threads=1, loss="bce")
    model.fit(log, user_col="user_id", item_col="sku", time_col="timestamp", progress=False)
    run = model.save(tmp_path / "run")
    items = tmp_path / "movies.dat"
    ids = log["sku"].unique().to_list()
    items.write_text("".join(f"{i}::Film number {i} (1999)::Drama\n" for i in ids))
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(out), "--items", str(items)]) == 0
    page = out.read_text()
    assert "sasrec full" in page and "paper:" not in page  # SASRec+BCE is the paper's label
    assert "Film number " in page
    assert main(["report", str(run), "--out", str(tmp_path / "x.html"), "--items", "nope"]) == 2


def _colours(png: Path) -> int:
    import numpy as np
    from matplotlib import image

    pixels = (image.imread(str(png))[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return len(np.unique(pixels, axis=0))


def test_a_browser_renders_the_report_with_its_charts(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make test installs it with apt where it can)")
    out, _ = _report(tiny_runs, tmp_path)
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,2400",
            f"--screenshot={shot}",
            out.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    # a page of text only has a few dozen colours; the charts' lines and heat-maps add hundreds
    assert _colours(shot) > 300
    # the same page with its images removed: the charts are what made the colours
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<img [^>]+>", "", out.read_text()))
    bare_shot = tmp_path / "bare.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1200,2400", f"--screenshot={bare_shot}", bare.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )  # fmt: skip
    assert _colours(shot) > 2 * _colours(bare_shot)
