"""How far a sampled protocol's number moves with the candidate draw alone: trained runs
evaluated again on the test split with other draws of the 100 negatives (`eval.negative_seed`),
the model fixed. Per run and metric: the number with the run's own draw (the config's seed, 42
by default), the mean ± sample standard deviation and range over the other draws, and, beside a
paper's row, how many draws reach it. What it sizes: whether a gap to a paper's number is larger
than the protocol's own noise (the training seed's share is measured apart, e.g. by
`gpu.py sweep --seeds`).

    python benchmarks/analyses.py candidate-draws LABEL=RUN_DIR [LABEL=RUN_DIR ...] [--draws 20]
        [--table sasrec-table3-ml1m | bert4rec-table2-ml1m | --protocol uni100] [--name NAME]

LABEL names the row, and with --table the paper's row beside it (a model key of the table).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import write_results
from seqrec.cli.common import _source_data
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset, draw_seeds
from seqrec.evaluation.protocols import evaluate_split
from seqrec.evaluation.reference import paper_table
from seqrec.training.checkpoint import load_run

METRICS = ("hr@10", "ndcg@10")


def _runs(specs: list[str]) -> list[tuple[str, Path]]:
    out = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not Path(path).is_dir():
            raise SystemExit(f"candidate_draws: expected LABEL=RUN_DIR (a directory), got {spec!r}")
        out.append((label, Path(path)))
    return out


def _summary(values: list[float], own: float, paper: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "own_draw": own,
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "values": values,
    }
    if paper is not None:
        row["paper"] = paper
        row["draws_at_or_above_paper"] = sum(v >= paper for v in values)
    return row


def run_draws(
    run_dir: Path,
    protocol: str,
    draws: int,
    workdir: Path,
    prepared: dict[tuple[str, str, str], PreparedDataset] | None = None,
) -> dict[str, Any]:
    """One run's test `protocol` HR@10 / NDCG@10 with its own candidate draw and with `draws`
    others (`seqrec.data.prepared.draw_seeds`: the first seeds from 0 that are not its own):
    {"own_seed", "draw_seeds", "own": {metric: value}, "values": {metric: [value per draw]}}.
    `prepared`: datasets already prepared under `workdir`, by (data, data settings), shared
    between runs of the same file."""
    prepared = {} if prepared is None else prepared
    run = load_run(run_dir, device="cpu")
    cfg = run.config
    data = _source_data(run_dir)  # the file the run records, as `seqrec evaluate RUN` reads
    key = (data, repr(cfg.data), repr(cfg.eval))
    if key not in prepared:
        prepared[key] = prepare(
            data,
            data_cfg=cfg.data,
            eval_cfg=cfg.eval,
            out=workdir / f"d{len(prepared)}",
            progress=False,
        )
    ds = prepared[key]
    if list(ds.item_ids) != list(run.item_ids):
        raise SystemExit(f"candidate_draws: {run_dir} was trained on other items")
    report = evaluate_split(
        ds,
        run.model,
        "test",
        protocols=[protocol],
        ks=[10],
        batch_size=cfg.eval.batch_size,
        device="cpu",
        draws=draws + 1,  # its own, then the others
    )
    seeds = draw_seeds(cfg.eval.negative_seed, draws + 1)
    values = report.draws[protocol]
    return {
        "own_seed": seeds[0],
        "draw_seeds": seeds[1:],
        "own": {m: values[m][0] for m in METRICS},
        "values": {m: values[m][1:] for m in METRICS},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    ap.add_argument("--draws", type=int, default=20, help="other candidate draws (seeds 0..N-1)")
    ap.add_argument(
        "--table", help="a paper table of seqrec.evaluation.reference: its protocol and rows"
    )
    ap.add_argument("--protocol", help="uni100 or pop100 (default: the table's)")
    ap.add_argument("--name", default="candidate_draws", help="results file stem")
    args = ap.parse_args(argv)
    if args.draws < 2:
        raise SystemExit("candidate_draws: --draws must be at least 2 (a standard deviation)")
    runs = _runs(args.runs)
    paper = paper_table(args.table) if args.table else {}
    table_protocol = next(iter(next(iter(paper.values())))).split(".")[0] if paper else None
    protocol = args.protocol or table_protocol
    if protocol not in ("uni100", "pop100"):
        raise SystemExit("candidate_draws: give --table or --protocol uni100|pop100")
    if table_protocol and protocol != table_protocol:
        raise SystemExit(
            f"candidate_draws: --table {args.table} reports {table_protocol}, not {protocol}"
        )

    prepared: dict[tuple[str, str, str], PreparedDataset] = {}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, run_dir in runs:
            got = run_draws(run_dir, protocol, args.draws, Path(tmp), prepared)
            p = paper.get(label, {})
            rows[label] = {
                "run": str(run_dir),
                "own_seed": got["own_seed"],
                "draw_seeds": got["draw_seeds"],
                **{
                    m: _summary(got["values"][m], got["own"][m], p.get(f"{protocol}.{m}"))
                    for m in METRICS
                },
            }
            print(label, {m: round(rows[label][m]["mean"], 4) for m in METRICS}, flush=True)

    lines = [
        f"# The candidate draw's own noise, {protocol} (test split)",
        "",
        f"Each trained run evaluated again with {args.draws} other draws of the 100 negatives "
        "(`eval.negative_seed`), the model fixed: its number with its own draw, then the mean ± "
        "sample standard deviation and the range over the other draws"
        + (f", beside the paper's row ({args.table})." if paper else "."),
        "",
        "| run | metric | own draw | mean ± std over draws | range | paper | draws ≥ paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        for m in METRICS:
            s = r[m]
            paper_cells = (
                f"{s['paper']:.4f} | {s['draws_at_or_above_paper']} of {args.draws}"
                if "paper" in s
                else " | "
            )
            lines.append(
                f"| {label} | {m.upper()} | {s['own_draw']:.4f} (seed {r['own_seed']}) | "
                f"{s['mean']:.4f} ± {s['std']:.4f} | {s['min']:.4f}–{s['max']:.4f} | "
                f"{paper_cells} |"
            )
    payload = {
        "protocol": f"leave-one-out test split, {protocol}; the candidate draw varied",
        "table": args.table,
        "draws": args.draws,
        "rows": rows,
    }
    write_results(
        args.name,
        payload,
        "\n".join(lines) + "\n",
        seeds={"candidates": next(iter(rows.values()))["own_seed"]},  # the others: rows
        runs=[run_dir for _, run_dir in runs],
    )
    print("\n".join(lines))
