"""`seqrec evaluate`, `significance`, `compare`, `plot`, `attention`: what runs reach."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from seqrec.cli.common import (
    _add_data_flags,
    _add_kcore_flags,
    _add_trust_flag,
    _prepare,
    _run_config,
    _settings_of_the_run,
)
from seqrec.data.ids import check_items
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset, draw_seeds, load_prepared
from seqrec.errors import ConfigError, SeqrecError
from seqrec.evaluation.metrics import metric_names, paired_test
from seqrec.evaluation.protocols import (
    SAMPLED_PROTOCOLS,
    EvalReport,
    Scorer,
    compare_reports,
    evaluate_split,
    load_ranks,
    parse_protocols,
    save_ranks,
)
from seqrec.evaluation.report import metrics_table, run_label
from seqrec.models.baselines import Popularity
from seqrec.outputs import check_out_file
from seqrec.training.checkpoint import Run, load_run
from seqrec.training.setup import resolve_device


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.save_ranks:
        check_out_file(Path(args.save_ranks), replace=args.force, inputs=[args.model, args.data])
    if args.with_runs and args.model == "pop":
        raise ConfigError("--with: an ensemble is of run directories, not 'pop'")
    if args.draws < 1:
        raise ConfigError(f"--draws: expected an integer >= 1, got {args.draws}")
    weights = _weights_arg(args)  # checked before anything is loaded
    protocols_arg = args.protocol
    ks_arg = [int(k) for k in args.k.split(",")] if args.k else None
    scorer: Scorer
    if args.model == "pop":
        if not args.data:
            raise ConfigError("evaluate pop: give --data")
        cfg = _run_config(args)
        ds = _prepare(args, cfg)
        scorer = Popularity.fit(ds.split.train)  # counts the training part only
        name, device = "pop", "cpu"
    elif Path(args.model).is_dir():
        _settings_of_the_run(args, args.model)
        device = str(resolve_device("auto"))
        run = load_run(args.model, device=device, trust=args.trust)
        cfg = run.config
        ds = _prepare(args, cfg, inputs=[args.model])
        check_items(run.item_ids, ds.item_ids, args.model, f"{args.data} gives")
        scorer = run.model
        name = run_label(cfg.model, cfg.train.loss)
        if args.with_runs:
            scorer, name = _ensemble(args, run, ds, device, weights)
    else:
        raise SeqrecError(f"{args.model}: neither 'pop' nor a run directory")
    protocols = parse_protocols(protocols_arg or cfg.eval.protocols)
    if args.draws > 1 and not set(protocols) & set(SAMPLED_PROTOCOLS):
        raise ConfigError(
            f"--draws: the protocols ({', '.join(protocols)}) hold no sampled one "
            f"({', '.join(SAMPLED_PROTOCOLS)}): nothing is drawn"
        )
    report = evaluate_split(
        ds,
        scorer,
        args.split,
        protocols=protocols,
        ks=ks_arg or list(cfg.eval.ks),
        batch_size=cfg.eval.batch_size,
        device=device,
        progress=not args.quiet,
        sample_users=cfg.eval.sample_users,
        seed=cfg.eval.negative_seed,
        draws=args.draws,
    )
    _print_report(args, report, name, ds)
    return 0


def _weights_arg(args: argparse.Namespace) -> list[float] | None:
    """--weights checked before anything is loaded: None for "valid" (or no ensemble)."""
    if args.weights is not None and not args.with_runs:
        raise ConfigError("--weights: give the other runs of the ensemble with --with")
    if args.weights in (None, "valid"):
        return None
    try:
        weights = [float(x) for x in args.weights.split(",")]
    except ValueError:
        raise ConfigError(
            f"--weights: expected 'valid' or one number per run, got {args.weights!r}"
        ) from None
    if len(weights) != 1 + len(args.with_runs):
        raise ConfigError(
            f"--weights: {len(weights)} numbers for {1 + len(args.with_runs)} runs (the run "
            "and each --with)"
        )
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"--weights: expected numbers >= 0, not all 0, got {args.weights!r}")
    return weights


def _ensemble(
    args: argparse.Namespace,
    run: Run,
    ds: PreparedDataset,
    device: str,
    weights: list[float] | None,
) -> tuple[Scorer, str]:
    """The run and the runs of --with as one `Ensemble`, its weights --weights or chosen on
    the validation split (printed)."""
    from seqrec.experiments.ensemble import Ensemble, check_same_items, choose_run_weights

    members = [run, *(load_run(p, device=device, trust=args.trust) for p in args.with_runs)]
    check_same_items(members)
    if weights is None:
        choice = choose_run_weights(members, ds, device=device)
        weights = list(choice.weights)
        print(
            f"weights chosen on {choice.metric} ({len(choice.grid)} grid points): "
            + ", ".join(f"{w:.2f}" for w in weights)
            + f" -> {choice.value:.4f}",
            file=sys.stderr,
        )
    labels = [run_label(m.config.model, m.config.train.loss) for m in members]
    name = " + ".join(f"{w / sum(weights):.2f} {x}" for w, x in zip(weights, labels, strict=True))
    return Ensemble([m.model for m in members], weights), name


def _print_report(
    args: argparse.Namespace, report: EvalReport, name: str, ds: PreparedDataset
) -> None:
    if args.save_ranks:
        save_ranks(report, Path(args.save_ranks), ds.user_ids)
    if args.json:
        print(json.dumps(report.metrics_with_draws()))
        return
    print(metrics_table(report.metrics, model=name, with_paper=args.split == "test"))
    spread = report.over_draws()
    if spread:
        seeds = draw_seeds(ds.candidate_seed, args.draws)
        print(
            f"\nOver {args.draws} candidate draws (eval.negative_seed {seeds[0]}, the stored "
            f"one, then {', '.join(map(str, seeds[1:]))}): mean ± sample standard deviation "
            "[range]\n"
        )
        metrics = list(next(iter(spread.values())))
        print("| protocol | " + " | ".join(m.upper() for m in metrics) + " |")
        print("|---|" + "---|" * len(metrics))
        for protocol, by_metric in spread.items():
            cells = (
                f"{s['mean']:.4f} ± {s['std']:.4f} [{s['min']:.4f}, {s['max']:.4f}]"
                for s in by_metric.values()
            )
            print(f"| {protocol} | " + " | ".join(cells) + " |")


def cmd_significance(args: argparse.Namespace) -> int:
    a, b = load_ranks(Path(args.ranks_a)), load_ranks(Path(args.ranks_b))
    out = {}
    for protocol in parse_protocols(args.protocol):
        if protocol not in a or protocol not in b:
            raise SeqrecError(f"protocol {protocol} is missing from one of the rank files")
        out[protocol] = paired_test(a[protocol], b[protocol], args.metric)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"| protocol | {args.metric} A | {args.metric} B | diff | t-test p "
            "| Wilcoxon p | users |"
        )
        print("|---|---|---|---|---|---|---|")
        for p, r in out.items():
            print(
                f"| {p} | {r['metric_a']:.4f} | {r['metric_b']:.4f} | {r['diff']:+.4f} | "
                f"{r['t_pvalue']:.3g} | {r['wilcoxon_pvalue']:.3g} | {r['n_users']} |"
            )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Evaluate two or more runs on the same split and print their metrics side by side under
    every protocol, with the paired tests of each run against the first."""
    if len(args.runs) < 2:
        raise SeqrecError("compare needs at least two run directories")
    if len({Path(d).resolve() for d in args.runs}) < len(args.runs):
        raise SeqrecError("compare: a run directory is given twice")
    runs = [load_run(d, device=str(resolve_device("auto")), trust=args.trust) for d in args.runs]
    names = [Path(d).resolve().name for d in args.runs]
    if len(set(names)) < len(names):  # same folder names in different places
        names = [str(d) for d in args.runs]
    if args.data:
        ds = prepare(args.data, data_cfg=runs[0].config.data, eval_cfg=runs[0].config.eval)
    else:  # the prepared dataset the first run was trained on
        prepared = runs[0].source.get("prepared")
        if not prepared or not Path(prepared).exists():
            raise ConfigError(f"{args.runs[0]}: its prepared data is gone; pass --data")
        ds = load_prepared(prepared)
    for name, run in zip(names, runs, strict=True):
        check_items(run.item_ids, ds.item_ids, name, ds.path)
    protocols = parse_protocols(args.protocol or runs[0].config.eval.protocols)
    ks = [int(k) for k in args.k.split(",")] if args.k else list(runs[0].config.eval.ks)
    if args.metric not in metric_names(ks):
        raise ConfigError(f"--metric {args.metric!r} is not one of {', '.join(metric_names(ks))}")
    device = str(resolve_device("auto"))
    reports = {
        name: evaluate_split(ds, run.model, args.split, protocols=protocols, ks=ks, device=device)
        for name, run in zip(names, runs, strict=True)
    }
    tests = compare_reports(reports, args.metric)
    if args.json:
        print(
            json.dumps(
                {
                    "split": args.split,
                    "metrics": {n: r.metrics for n, r in reports.items()},
                    "paired_tests": tests,
                }
            )
        )
        return 0
    print(f"{args.split} split of {ds.name} ({len(reports[names[0]].users):,} users)\n")
    print("| protocol | metric | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for p in protocols:
        for m in metric_names(ks):
            cells = [f"{reports[n].metrics[p][m]:.4f}" for n in names]
            print(f"| {p} | {m} | " + " | ".join(cells) + " |")
    print(f"\nPaired tests on per-user {args.metric}, each run against {names[0]}:\n")
    print(f"| run | protocol | run - {names[0]} | better | t-test p | Wilcoxon p |")
    print("|---|---|---|---|---|---|")
    for n, by_protocol in tests.items():
        for p, r in by_protocol.items():
            gain = -r["diff"]  # the tests' diff is base - run
            better = n if gain > 0 else names[0] if gain < 0 else "="
            print(
                f"| {n} | {p} | {gain:+.4f} | {better} | {r['t_pvalue']:.3g} "
                f"| {r['wilcoxon_pvalue']:.3g} |"
            )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Validation curves of one or more runs in one PNG."""
    from seqrec.experiments.plots import plot_curves

    out = Path(args.out) if args.out else Path(args.runs[0]) / "curves.png"
    check_out_file(out, replace=args.force)
    print(f"-> {plot_curves(args.runs, out, trust=args.trust)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One self-contained HTML page of runs: curves, metrics, paired tests, recipe, provenance,
    attention, top-10s."""
    from seqrec.experiments.run_report import write_report

    out = Path(args.out)
    check_out_file(out, replace=args.force, inputs=args.runs)
    if args.users < 0:
        raise ConfigError(f"--users must be >= 0, got {args.users}")
    if args.items is not None and not Path(args.items).is_file():
        raise ConfigError(f"--items {args.items}: no such file (item metadata, e.g. movies.dat)")
    page = write_report(args.runs, out, users=args.users, trust=args.trust, items=args.items)
    print(f"-> {page}")
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    """BERT4Rec Figure 2: average attention heat-maps of the last positions, per layer and head."""
    import tempfile

    import numpy as np
    import torch

    from seqrec.evaluation.protocols import pad_histories
    from seqrec.experiments.attention import attention_maps, plot_attention
    from seqrec.provenance import atomic_write, write_json

    out = Path(args.figure) if args.figure else Path(args.run) / "attention.png"
    for path in (out, out.with_suffix(".json")):
        check_out_file(path, replace=args.force, inputs=[args.data])
    _settings_of_the_run(args, args.run)
    run = load_run(args.run, trust=args.trust)
    ds = _prepare(args, run.config, inputs=[args.run])
    check_items(run.item_ids, ds.item_ids, args.run, f"{args.data} gives")
    test = ds.split.test
    rows = np.arange(len(test.users))
    if args.users:
        wanted = args.users.split(",")
        index = {str(u): i for i, u in enumerate(ds.user_ids)}
        missing = [u for u in wanted if u not in index]
        if missing:
            raise SeqrecError(f"--users: no test user {', '.join(missing[:5])} in {args.data}")
        position = {int(u): e for e, u in enumerate(test.users)}
        rows = np.array([position[index[u]] for u in wanted if index[u] in position])
    max_len = int(run.model.max_len)
    histories = torch.as_tensor(pad_histories(test.histories, rows, max_len))
    maps = attention_maps(run.model, histories, last=args.last)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        plot_attention(maps, str(staged), title=f"{run.config.model}: {args.run}")
        atomic_write(out, lambda f: f.write(staged.read_bytes()))
    write_json(out.with_suffix(".json"), {"run": str(args.run), **maps.to_json()})
    print(f"{maps.users:,} users averaged -> {out} and {out.with_suffix('.json')}")
    return 0


def add_parsers(sub: Any) -> None:
    _evaluate_parser(sub)
    _significance_parser(sub)
    _compare_parser(sub)
    _attention_parser(sub)
    _plot_parser(sub)
    _report_parser(sub)


def _evaluate_parser(sub: Any) -> None:
    p = sub.add_parser("evaluate", help="evaluate a model under full / uni100 / pop100")
    p.add_argument("model", help="'pop', or a run directory from `seqrec train`")
    p.add_argument(
        "--with",
        dest="with_runs",
        action="append",
        default=[],
        metavar="RUN_DIR",
        help="another run of the same items: rank by the ensemble of the runs (repeatable)",
    )
    p.add_argument(
        "--weights",
        help="the ensemble's weights, one per run ('w1,w2,...'), or 'valid' (the default): "
        "chosen on the validation split's full NDCG@10 over a grid of step 0.1",
    )
    _add_data_flags(p, on_a_run=True)
    _add_kcore_flags(p)
    p.add_argument("--protocol", help="comma-separated: full,uni100,pop100 (default: all)")
    p.add_argument("--split", choices=["test", "valid"], default="test")
    p.add_argument("--k", help="comma-separated cut-offs (default 1,5,10)")
    p.add_argument("--save-ranks", metavar="FILE.parquet", help="write every user's rank")
    p.add_argument(
        "--draws",
        type=int,
        default=1,
        metavar="N",
        help="rank uni100 / pop100 against N draws of their candidates, the stored one first, "
        "and report the mean and standard deviation over them (default 1: the stored draw)",
    )
    p.add_argument("--json", action="store_true")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_evaluate)


def _significance_parser(sub: Any) -> None:
    p = sub.add_parser("significance", help="paired t-test and Wilcoxon between two rank files")
    p.add_argument("ranks_a")
    p.add_argument("ranks_b")
    p.add_argument("--metric", default="ndcg@10")
    p.add_argument("--protocol", default="full")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_significance)


def _compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="runs side by side, every protocol, paired tests")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="two or more run directories")
    p.add_argument("--data", help="the dataset (default: the first run's prepared data)")
    p.add_argument("--split", choices=["test", "valid"], default="test")
    p.add_argument("--protocol", help="comma-separated: full,uni100,pop100 (default: all)")
    p.add_argument("--k", help="comma-separated cut-offs (default 1,5,10)")
    p.add_argument("--metric", default="ndcg@10", help="per-user metric of the paired tests")
    p.add_argument("--json", action="store_true")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_compare)


def _attention_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attention", help="average attention heat-maps of the last positions (BERT4Rec Fig. 2)"
    )
    p.add_argument("run", metavar="RUN_DIR")
    _add_data_flags(p, on_a_run=True)
    p.add_argument("--users", help="comma-separated user ids (default: every test user)")
    p.add_argument("--last", type=int, default=10, help="positions from the end (10)")
    p.add_argument("--figure", help="the PNG (default: attention.png in the run); JSON beside it")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_attention)


def _plot_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="the validation curves of runs, by epoch and by minutes")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="the PNG (default: curves.png in the first run)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--trust", action="store_true", help="read runs that have no manifest (sha256.json)"
    )
    p.set_defaults(func=cmd_plot)


def _report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page of trained runs")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, help="the HTML file, e.g. report.html")
    p.add_argument("--users", type=int, default=3, help="users whose top-10 is listed (3)")
    p.add_argument("--items", help="item metadata (MovieLens movies.dat) for the top-10s' titles")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--trust", action="store_true", help="read runs that have no manifest (sha256.json)"
    )
    p.set_defaults(func=cmd_report)
