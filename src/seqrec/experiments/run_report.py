"""`seqrec report RUN [RUN ...] --out report.html`: one self-contained HTML page of trained runs.

What it holds, with no network (figures are inline PNG): the validation curves of every run; its
test metrics under each protocol beside the paper's row where one exists; with two runs or more,
the paired tests of each against the first (on the first run's prepared data); per run, the
recipe (the resolved config, what the short-budget tiers and the data fitting decided), its
provenance (commit, machine, device, epochs, time), an attention heat-map for the transformers
and the top-10 of a few users of its data, with titles when the data has them. Needs matplotlib
(the `bench` extra) for the figures.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqrec.data.ids import same_items
from seqrec.errors import ConfigError, SeqrecError
from seqrec.evaluation.reference import PAPER_ROWS, is_papers_ml1m
from seqrec.evaluation.report import run_label
from seqrec.provenance import VERSION, atomic_write, describe_machine
from seqrec.training.rundir import RunDir

__all__ = ["write_report"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.paper td { color: #666; font-style: italic; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
.note { color: #666; font-size: 0.9em; }
"""
_METRICS = ("hr@1", "hr@5", "hr@10", "ndcg@5", "ndcg@10", "mrr")


def write_report(
    runs: Sequence[str | Path],
    out: Path,
    *,
    users: int = 3,
    trust: bool = False,
    items: str | Path | None = None,
) -> Path:
    """The page of `runs` into `out` (written whole or not at all); `users`: how many users of
    each run's data get their top-10 listed; `items`: an item metadata file (movies.dat) for
    their titles. A paper's rows stand beside a run's metrics only when the run's data is that
    paper's dataset."""
    dirs = [RunDir(r, trust=trust) for r in runs]
    for r, run in zip(runs, dirs, strict=True):
        if not run.finished:
            raise ConfigError(f"{r}: not a finished run (no metrics yet)")
    names = [Path(r).resolve().name for r in runs]
    sections = [_curves(runs, trust), _metrics(names, dirs)]
    if len(runs) > 1:
        sections.append(_paired(names, runs, trust))
    for name, r, run in zip(names, runs, dirs, strict=True):
        sections.append(_run_section(name, r, run, users, trust, items))
    title = "seqrec report: " + ", ".join(names)
    page = (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>"
        f"{_e(title)}</title><style>{_STYLE}</style></head><body>\n<h1>{_e(title)}</h1>\n"
        f"<p class='note'>Written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by seqrec "
        f"{_version()}; every number is read from the runs' own files.</p>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
    data = page.encode()
    atomic_write(out, lambda f: f.write(data))
    return out


def _e(text: Any) -> str:
    return html.escape(str(text))


def _version() -> str:
    return VERSION


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], classes: Sequence[str] = ()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f" class='{classes[i]}'" if i < len(classes) and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


def _curves(runs: Sequence[str | Path], trust: bool) -> str:
    from seqrec.experiments.plots import curves_png

    try:
        png = curves_png(runs, trust=trust)
    except ConfigError as e:  # no validated epoch (a run trained on train+valid)
        return f"<h2>Validation curves</h2><p class='note'>{_e(e)}</p>"
    return "<h2>Validation curves</h2>" + _img(png, "validation curves by epoch and by minutes")


def _metrics(names: Sequence[str], dirs: Sequence[RunDir]) -> str:
    out = ["<h2>Test metrics</h2>"]
    for name, run in zip(names, dirs, strict=True):
        cfg, metrics = run.config(), run.metrics() or {}
        label = run_label(cfg.model, cfg.train.loss)
        rows: list[list[str]] = []
        classes: list[str] = []
        papers = is_papers_ml1m(_data_stats(run, metrics))
        for protocol, values in (metrics.get("test") or {}).items():
            rows.append([f"{label} {protocol}", *(_num(values.get(m)) for m in _METRICS)])
            classes.append("")
            if papers and (label, protocol) in PAPER_ROWS:  # the paper of this model and loss
                source, paper = PAPER_ROWS[(label, protocol)]
                rows.append([f"paper: {source}", *(_num(paper.get(m)) for m in _METRICS)])
                classes.append("paper")
        out.append(f"<h3>{_e(name)}</h3>" + _table(["protocol", *_METRICS], rows, classes))
    return "".join(out)


def _data_stats(run: RunDir, metrics: dict[str, Any]) -> dict[str, Any]:
    """The sizes of a run's data: as its metrics record them, else its prepared data's."""
    if isinstance(metrics.get("data"), dict):
        return metrics["data"]
    from seqrec.data.prepared import load_prepared

    prepared = run.source().get("prepared")
    try:
        return dict(load_prepared(prepared).stats) if prepared else {}
    except (SeqrecError, OSError):
        return {}


def _num(x: Any) -> str:
    return "" if x is None else f"{float(x):.4f}"


def _paired(names: Sequence[str], runs: Sequence[str | Path], trust: bool) -> str:
    """Each run against the first, user by user, on the test split of the first run's data."""
    from seqrec.data.prepared import load_prepared
    from seqrec.evaluation.protocols import compare_reports, evaluate_split
    from seqrec.training.checkpoint import load_run

    loaded = [load_run(r, trust=trust) for r in runs]
    prepared = loaded[0].source.get("prepared")
    if not prepared or not Path(prepared).exists():
        return "<h2>Paired tests</h2><p class='note'>The first run's prepared data is gone.</p>"
    ds = load_prepared(prepared)
    if not all(same_items(r.item_ids, ds.item_ids) for r in loaded):
        return "<h2>Paired tests</h2><p class='note'>The runs were trained on other items.</p>"
    reports = {n: evaluate_split(ds, r.model, "test") for n, r in zip(names, loaded, strict=True)}
    rows = []
    for name, by_protocol in compare_reports(reports, "ndcg@10").items():
        for protocol, t in by_protocol.items():
            gain = -t["diff"]  # the test's diff is base - run
            better = name if gain > 0 else names[0] if gain < 0 else "="
            rows.append(
                [name, protocol, f"{gain:+.4f}", better, f"{t['t_pvalue']:.3g}",
                 f"{t['wilcoxon_pvalue']:.3g}"]
            )  # fmt: skip
    head = ["run", "protocol", f"NDCG@10: run - {names[0]}", "better", "t-test p", "Wilcoxon p"]
    return "<h2>Paired tests (per-user NDCG@10, test split)</h2>" + _table(head, rows)


def _run_section(
    name: str, path: str | Path, run: RunDir, users: int, trust: bool, items: str | Path | None
) -> str:
    cfg, metrics = run.config(), run.metrics() or {}
    machine = metrics.get("machine")
    facts = [
        ["model", run_label(cfg.model, cfg.train.loss)],
        ["trained at commit", metrics.get("git_commit", "?")],
        ["machine", describe_machine(machine) if isinstance(machine, dict) else "?"],
        ["device", metrics.get("device", "?")],
        ["epochs (chosen)", f"{metrics.get('epochs')} ({metrics.get('best_epoch')})"],
        ["stopped by", metrics.get("stopped", "?")],
        ["training minutes", f"{float(metrics.get('train_time_s') or 0) / 60:.1f}"],
        ["sequences/s", f"{float(metrics.get('seq_per_s') or 0):.0f}"],
    ]
    tiers = [t for t in cfg.short_budget if t.applied]
    decided = "; ".join(", ".join(t.set) for t in tiers) or "none applied"
    parts = [
        f"<h2>{_e(name)}</h2>",
        _table(["", ""], facts),
        f"<p>Short-budget tiers: {_e(decided)}.</p>",
        "<details><summary>The resolved config</summary><pre>"
        + _e(json.dumps(cfg.to_dict(), indent=2))
        + "</pre></details>",
        _attention(path, cfg.model, trust),
        _top10(path, users, trust, items),
    ]
    return "\n".join(parts)


def _attention(path: str | Path, model: str, trust: bool) -> str:
    if model not in ("bert4rec", "sasrec"):
        return ""
    import numpy as np
    import torch

    from seqrec.data.prepared import load_prepared
    from seqrec.evaluation.protocols import pad_histories
    from seqrec.experiments.attention import attention_maps, plot_attention
    from seqrec.training.checkpoint import load_run

    run = load_run(path, trust=trust)
    prepared = run.source.get("prepared")
    if not prepared or not Path(prepared).exists():
        return "<p class='note'>Attention: the run's prepared data is gone.</p>"
    test = load_prepared(prepared).split.test
    rows = np.arange(min(512, len(test.users)))
    histories = torch.as_tensor(pad_histories(test.histories, rows, int(run.model.max_len)))
    last = min(10, int(run.model.max_len))
    try:
        maps = attention_maps(run.model, histories, last=last)
    except ValueError as e:  # no input fills the last positions
        return f"<p class='note'>Attention: {_e(e)}</p>"
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "attention.png"
        plot_attention(maps, str(png), title=f"{model}: average attention, last {last} positions")
        data = png.read_bytes()
    return "<h3>Attention (Figure 2)</h3>" + _img(data, "attention heat-maps")


def _top10(path: str | Path, users: int, trust: bool, items: str | Path | None) -> str:
    from seqrec.serving.recommender import Recommender

    rec = Recommender.from_run(path, trust=trust, metadata=items)
    if rec.dataset is None or users < 1:
        return ""
    rows = []
    for user in rec.dataset.user_ids[:users]:
        try:
            recs = rec.recommend_user(user, k=10)
        except SeqrecError as e:
            return f"<p class='note'>Top-10: {_e(e)}</p>"
        for rank, (item, score) in enumerate(recs, 1):
            title = (rec.describe(item) or {}).get("title", "")
            rows.append([user, rank, item, title, f"{score:.3f}"])
    return "<h3>Top-10 of the first users of its data</h3>" + _table(
        ["user", "rank", "item", "title", "score"], rows
    )
