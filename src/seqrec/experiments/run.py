"""Running an experiment spec: each point trained (or a finished run reused), the rows gathered,
summarised over seeds, and written as one results file (JSON + Markdown, a plot)."""

from __future__ import annotations

import io
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.errors import ConfigError
from seqrec.experiments.results import write_results
from seqrec.experiments.spec import ENSEMBLE, ExperimentSpec, _slug
from seqrec.provenance import atomic_write, git_commit
from seqrec.training.rundir import RunDir

__all__ = ["run_experiment"]


def _value(metrics: dict[str, Any], key: str) -> float:
    split, protocol, name = key.split(".")
    if split not in metrics:  # a train+valid run has no validation metrics
        raise ConfigError(
            f"metric {key}: a run with train.train_on = {metrics.get('train_on')!r} has no "
            f"{split} metrics"
        )
    return float(metrics[split][protocol][name])


def run_experiment(
    spec: ExperimentSpec,
    data: str,
    runs_dir: Path,
    *,
    progress: bool = True,
    command: str = "",
    trust: bool = False,
) -> Path:
    """Train (or reuse) every point x seed; rewrite the results after each; return the JSON.
    `trust`: reuse finished points without a manifest (runs of an older seqrec)."""
    from seqrec.training.fit import train_or_reuse

    root = runs_dir / spec.name
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for point in spec.points:
        for seed in spec.seeds:
            cfg = spec.config(point, seed)
            out = root / f"{_slug(point.label)}-s{seed}"
            metrics = train_or_reuse(
                out,
                cfg,
                partial(prepare, data, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=progress),
                source={"data": str(data)},
                progress=progress,
                trust=trust,
            )
            recorded = RunDir(out, trust=trust).config_dict()
            rows.append(
                {
                    "label": point.label,
                    "overrides": list(point.overrides),
                    "seed": seed,
                    "value": _value(metrics, spec.metric),
                    "columns": {c: _value(metrics, c) for c in spec.columns},
                    "test": metrics["test"],
                    "epochs": metrics["epochs"],
                    "best_epoch": metrics.get("best_epoch"),
                    "budget": _budget(recorded, metrics),
                    "seq_per_s": metrics["seq_per_s"],
                    "train_time_s": metrics["train_time_s"],
                    "cpu_util": metrics.get("cpu_util"),
                    "trained_at": metrics.get("git_commit"),
                    "config": recorded,
                    "run_dir": str(out),
                }
            )
            _write(spec, rows, root, command)
            if progress:
                total = len(spec.points) * len(spec.seeds)
                print(
                    f"{spec.name}: {point.label} seed {seed}: "
                    f"{spec.metric} {rows[-1]['value']:.4f} ({len(rows)}/{total} points done)",
                    file=sys.stderr,
                    flush=True,
                )
    if spec.ensemble:
        cfg = spec.config(spec.points[0], spec.seeds[0])
        ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=progress)
        for seed in spec.seeds:
            rows.append(_ensemble_row(spec, [r for r in rows if r["seed"] == seed], ds, trust))
            _write(spec, rows, root, command)
            if progress:
                print(
                    f"{spec.name}: {ENSEMBLE} seed {seed}: weights "
                    + ", ".join(f"{w:.2f}" for w in rows[-1]["weights"])
                    + f", {spec.metric} {rows[-1]['value']:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
    return root / f"{spec.name}.json"


def _budget(config: dict[str, Any], metrics: dict[str, Any]) -> str:
    """A run's budget as a table cell: its time budget (e.g. "20m") or, without a clock, its
    epochs; with what ended it where that came first ("20m, 200 epochs first", "20m, early
    stop")."""
    train = config.get("train", {})
    n, clock = train.get("max_epochs"), train.get("time_budget")
    epochs = f"{n} epoch{'' if n == 1 else 's'}"
    ends = {
        "early_stopping": "early stop",
        "max_steps": f"{train.get('max_steps')} steps first",
        "max_epochs": f"{epochs} first" if clock else None,  # without a clock: the budget itself
    }
    end = ends.get(str(metrics.get("stopped")))
    return (clock or epochs) + (f", {end}" if end else "")


def _ensemble_row(
    spec: ExperimentSpec, members: list[dict[str, Any]], ds: PreparedDataset, trust: bool
) -> dict[str, Any]:
    """The row of one seed's members ranked together
    (`seqrec.experiments.ensemble.evaluate_runs`)."""
    from seqrec.experiments.ensemble import evaluate_runs

    scored = evaluate_runs([r["run_dir"] for r in members], ds, trust=trust)
    metrics = {"valid": scored["valid"], "test": scored["test"]}
    return {
        "label": ENSEMBLE,
        "overrides": [],
        "seed": members[0]["seed"],
        "value": _value(metrics, spec.metric),
        "columns": {c: _value(metrics, c) for c in spec.columns},
        "valid": scored["valid"],
        "test": scored["test"],
        "members": [r["label"] for r in members],
        "weights": scored["weights"],
        "grid": scored["grid"],
        "choice": scored["choice"],
        "epochs": None,  # not trained: its members' runs were
        "best_epoch": None,
        "budget": None,
        "seq_per_s": None,
        "train_time_s": 0.0,
        "members_train_time_s": sum(r["train_time_s"] for r in members),
        "cpu_util": None,
        "trained_at": None,
        "config": None,
        "run_dir": None,
    }


def _mean(values: list[Any]) -> float | None:
    """The mean of the values that are numbers (an ensemble row has no epochs), else None."""
    xs = [v for v in values if v is not None]
    return statistics.mean(xs) if xs else None


def _summary(spec: ExperimentSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        group = [r for r in rows if r["label"] == label]
        values = [r["value"] for r in group]
        out.append(
            {
                "label": label,
                "series": next((p.series for p in spec.points if p.label == label), None),
                "seeds": len(group),
                "mean": statistics.mean(values),
                "std": statistics.stdev(values) if len(values) > 1 else None,
                "full_ndcg@10": statistics.mean(r["test"]["full"]["ndcg@10"] for r in group),
                "seq_per_s": _mean([r["seq_per_s"] for r in group]),
                "epochs": _mean([r["epochs"] for r in group]),
                "best_epoch": _mean([r.get("best_epoch") for r in group]),
                "budget": " / ".join(dict.fromkeys(r["budget"] for r in group if r.get("budget")))
                or None,
                "train_time_s": sum(r["train_time_s"] for r in group),
                "cpu_util": min((r["cpu_util"] for r in group if r.get("cpu_util")), default=None),
                "paper": spec.paper_value(label, spec.metric),
                "columns": {
                    c: {
                        "mean": statistics.mean(r["columns"][c] for r in group),
                        "paper": spec.paper_value(label, c),
                    }
                    for c in spec.columns
                },
            }
        )
    return out


def _best(summary: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each series' point with the highest metric (mean over seeds), e.g. the d a validation sweep
    chooses for each model; ties go to the earlier point."""
    best: dict[str, dict[str, Any]] = {}
    for s in summary:
        if s["series"] and (s["series"] not in best or s["mean"] > best[s["series"]]["value"]):
            best[s["series"]] = {"label": s["label"], "value": s["mean"]}
    return best


def _write(spec: ExperimentSpec, rows: list[dict[str, Any]], root: Path, command: str) -> None:
    """The experiment's results file: its table and notes (Markdown) and every row (JSON)."""
    summary = _summary(spec, rows)
    best = _best(summary)
    lines = _table(spec, summary) + _notes(spec, rows, best)
    total = sum(r["train_time_s"] for r in rows)
    payload = {
        "spec": {
            "name": spec.name,
            "title": spec.title,
            "base": spec.base,
            "budget": spec.budget,
            "epochs": spec.epochs,
            "seeds": list(spec.seeds),
            "metric": spec.metric,
            "points": [
                {"label": p.label, "set": list(p.overrides), "base": p.base, "budget": p.budget}
                for p in spec.points
            ],
            "columns": list(spec.columns),
            "paper": spec.paper,
            "ensemble": spec.ensemble,
        },
        "summary": summary,
        "best": best,
        "total_train_time_s": total,
        "runs": rows,
    }
    seeds = {f"train_{i}": s for i, s in enumerate(spec.seeds)}
    negatives = sorted({r["config"]["eval"]["negative_seed"] for r in rows if r["config"]})
    seeds.update({f"candidates_{i}": s for i, s in enumerate(negatives)})
    write_results(root / spec.name, payload, "\n".join(lines), seeds=seeds, command=command)
    _plot(spec, summary, root / f"{spec.name}.png")


def _table(spec: ExperimentSpec, summary: list[dict[str, Any]]) -> list[str]:
    """The Markdown title, the settings line and the table of the points' mean results."""
    lines = [
        f"# {spec.title}",
        "",
        f"Base config `{spec.base}`; "
        + (  # else the budget column says each point's
            f"{spec.epochs} epochs a point (no time budget); "
            if spec.epochs
            else f"{spec.budget} a point; "
            if spec.budget and not any(p.budget for p in spec.points)
            else ""
        )
        + f"seeds {list(spec.seeds)}; {spec.metric} of the state chosen on validation.",
        "",
        "| point | seeds | budget | epochs | best epoch | training seq/s | CPU use "
        + f"| {spec.metric} "
        + "".join(f"| {c} (paper) " for c in spec.columns)
        + "| test full NDCG@10 | paper |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(spec.columns) + "---|---|",
    ]
    for s in summary:
        std = "" if s["std"] is None else f" ± {s['std']:.4f}"
        paper = "" if s["paper"] is None else f"{s['paper']:.4f}"
        cpu = "" if s["cpu_util"] is None else f"{s['cpu_util']:.2f}"
        epochs = "—" if s["epochs"] is None else f"{s['epochs']:.0f}"
        # counted from 1: the state after that many epochs
        chosen = "—" if s.get("best_epoch") is None else f"{s['best_epoch'] + 1:.0f}"
        budget = s.get("budget") or "—"
        speed = "—" if s["seq_per_s"] is None else f"{s['seq_per_s']:.0f}"
        extra = "".join(
            f"| {v['mean']:.4f}" + ("" if v["paper"] is None else f" ({v['paper']:.4f})") + " "
            for v in s["columns"].values()
        )
        lines.append(
            f"| {s['label']} | {s['seeds']} | {budget} | {epochs} | {chosen} | {speed} | {cpu} "
            f"| {s['mean']:.4f}{std} {extra}| {s['full_ndcg@10']:.4f} | {paper} |"
        )
    return lines


def _notes(
    spec: ExperimentSpec, rows: list[dict[str, Any]], best: dict[str, dict[str, Any]]
) -> list[str]:
    """The lines under the table: the ensembles' weights, the best point per series, what the
    columns mean, and the training time (with the reused runs' commits)."""
    lines: list[str] = []
    commit = git_commit()
    total = sum(r["train_time_s"] for r in rows)
    trained = sum(1 for r in rows if r["run_dir"])  # an ensemble's row is not a run
    # a reused run was trained by the code of its own commit: say which, point by point
    older = [
        f"{r['label']} (seed {r['seed']}) `{str(r['trained_at'])[:7]}`"
        for r in rows
        if r.get("trained_at") and r["trained_at"] != commit
    ]
    ensembles = [r for r in rows if r["label"] == ENSEMBLE]
    if ensembles:
        lines += [
            "",
            f"The {ENSEMBLE} row ranks by its members' runs together (the weighted sum of their "
            "log-softmax scores), the weights chosen on "
            f"{ensembles[0]['choice']} over a grid of step 0.1: "
            + "; ".join(
                f"seed {r['seed']}: "
                + ", ".join(f"{m} {w:.2f}" for m, w in zip(r["members"], r["weights"], strict=True))
                + f" (valid {r['valid']['full']['ndcg@10']:.4f})"
                for r in ensembles
            )
            + ".",
        ]
    if best:
        lines += [
            "",
            f"Highest {spec.metric} per series: "
            + "; ".join(f"{k}: {v['label']} ({v['value']:.4f})" for k, v in best.items())
            + ".",
        ]
    lines += [
        "",
        "Budget: what ended a point's training (its time budget, or its epoch limit where that "
        "came first); best epoch: the epoch, counted from 1, whose state validation chose (the "
        "mean over seeds).",
        "",
        "CPU use: the training process's CPU seconds per wall second per thread (the lowest of "
        "a point's seeds); well below 1 means another job shared the cores and the point "
        "trained less than its budget could buy.",
        "",
        f"Total training time: {total / 60:.1f} min over {trained} run(s)"
        + (f"; runs trained at another commit and reused: {', '.join(older)}" if older else "")
        + ".",
    ]
    return lines


def _plot(spec: ExperimentSpec, summary: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return  # the figure needs the bench extra; the JSON and the table are written regardless
    xs = list(range(len(summary)))
    means, stds = [s["mean"] for s in summary], [s["std"] or 0 for s in summary]
    paper = [(x, s["paper"]) for x, s in zip(xs, summary, strict=True) if s["paper"] is not None]
    lines = list(dict.fromkeys(s["series"] for s in summary if s["series"]))
    fig, ax = plt.subplots(figsize=(6 if lines else max(6, 0.9 * len(xs)), 3.6))
    if lines:  # one line per series over the shared values
        for name in lines:
            group = [s for s in summary if s["series"] == name]
            ax.errorbar(
                [s["label"].removeprefix(f"{name} ") for s in group],
                [s["mean"] for s in group],
                yerr=[s["std"] or 0 for s in group],
                marker="o",
                label=name,
            )
        ax.set_xlabel(spec.x_label)
    elif spec.plot == "bar":  # seqrec's bar and the paper's beside it
        ax.bar([x - 0.2 for x in xs], means, 0.4, yerr=stds, label="seqrec")
        if paper:
            px, pv = zip(*paper, strict=True)
            ax.bar([x + 0.2 for x in px], pv, 0.4, label="paper", hatch="//", alpha=0.7)
        ax.set_xticks(xs, [s["label"] for s in summary])
    else:
        ax.errorbar(xs, means, yerr=stds, marker="o", label="seqrec")
        if paper:
            ax.plot(*zip(*paper, strict=True), marker="s", linestyle="--", label="paper")
        ax.set_xticks(xs, [s["label"] for s in summary])
    ax.set_ylabel(spec.metric)
    ax.set_title(spec.title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, lambda f: f.write(buf.getvalue()))
