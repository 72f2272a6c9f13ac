"""The `seqrec` command: each subcommand parses its flags, builds a config and makes one library
call. User errors (`SeqrecError`) print one line on stderr and exit with status 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqrec import registry
from seqrec.checkpoint import load_run
from seqrec.config import (
    RunConfig,
    load_config,
    refit_config,
    short_budget_tiers,
    speed_tiers,
    validate,
)
from seqrec.data import download
from seqrec.data.prepared import PreparedDataset, load_prepared, prepare, prepare_frame
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError, DownloadError, SeqrecError
from seqrec.evaluate import (
    EvalReport,
    Scorer,
    compare_reports,
    load_ranks,
    parse_protocols,
    save_ranks,
)
from seqrec.export import FORMATS, export_run
from seqrec.metrics import metric_names, paired_test
from seqrec.models.baselines import Popularity
from seqrec.outputs import check_out_file
from seqrec.recommender import Recommender, read_histories, write_recommendations
from seqrec.report import metrics_table, run_label, stats_table
from seqrec.rundir import RunDir
from seqrec.train import check_run_out, fit, resolve_device

__all__ = ["main"]

DATA_DIR_ENV = "SEQREC_DATA_DIR"  # a folder laid out like shared/data (benchmarks, main job)


# ------------------------------------------------------------------------------------ helpers


def _run_config(args: argparse.Namespace) -> RunConfig:
    overrides = list(getattr(args, "set", None) or [])
    for flag, key in (
        ("format", "data.format"),
        ("min_user_interactions", "data.min_user_interactions"),
        ("min_item_interactions", "data.min_item_interactions"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    cfg = load_config(RunConfig, getattr(args, "config", None), overrides)
    columns = _column_flags(args)
    if columns:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **columns))
    return cfg


def _column_flags(args: argparse.Namespace) -> dict[str, Any]:
    """--user-col / --item-col / --time-col as data settings (`--time-col none`: the rows are
    in time order within each user)."""
    columns: dict[str, Any] = {}
    for flag in ("user_col", "item_col", "time_col"):
        value = getattr(args, flag, None)
        if value is not None:
            columns[flag] = None if flag == "time_col" and value.lower() == "none" else value
    return columns


def _add_column_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user-col", help="a CSV/Parquet log's user column (default: user)")
    p.add_argument("--item-col", help="its item column (default: item)")
    p.add_argument(
        "--time-col",
        help="its time column (default: timestamp); 'none': rows in time order per user",
    )


def _prepare(
    args: argparse.Namespace, cfg: RunConfig, inputs: Sequence[str] = ()
) -> PreparedDataset:
    """The --data of a command, prepared into --out (or the cache); --out may not be or
    contain any of `inputs` (a run directory the command reads)."""
    return prepare(
        args.data,
        data_cfg=cfg.data,
        eval_cfg=cfg.eval,
        out=Path(args.out) if getattr(args, "out", None) else None,
        force=getattr(args, "force", False),
        progress=not getattr(args, "quiet", False),
        inputs=[Path(p) for p in inputs],
    )


def _add_data_flags(
    p: argparse.ArgumentParser, out_help: str | None = None, *, on_a_run: bool = False
) -> None:
    p.add_argument(
        "--data",
        required=not on_a_run,
        help=f"a dataset name ({', '.join(download.DATASETS)}) or a file path"
        + (" (default for a run: the data it records)" if on_a_run else ""),
    )
    p.add_argument("--format", help="reader for a file path (default: from its name)")
    _add_column_flags(p)
    p.add_argument("--config", help="a TOML config file")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.min_user_interactions=5",
    )
    if out_help:
        p.add_argument("--out", required=True, help=out_help)
    else:
        p.add_argument(
            "--out",
            help="prepared-dataset directory: new, empty or a prepared dataset (default: under "
            "the cache)",
        )
    p.add_argument(
        "--force",
        action="store_true",
        help="prepare again even if unchanged; replace a prepared --out or an output file",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_run_out_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a command that trains into a run directory (train, refit)."""
    p.add_argument(
        "--break-lock",
        action="store_true",
        help="take the run's lock that a process on another host left (it must have stopped)",
    )
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="a finished run keeps both its last checkpoints (default: the last only)",
    )


def _add_trust_flag(p: argparse.ArgumentParser) -> None:
    """The flag of a command that reads a run: load one without a manifest."""
    p.add_argument(
        "--trust", action="store_true", help="load a run that has no manifest (sha256.json)"
    )


def _add_kcore_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-user-interactions",
        type=int,
        metavar="K",
        help="k-core: drop users with fewer interactions (default 5; none for a `user item` file)",
    )
    p.add_argument(
        "--min-item-interactions",
        type=int,
        metavar="K",
        help="k-core: drop items with fewer interactions (default 5; none for a `user item` file)",
    )


# ---------------------------------------------------------------------------------- commands


def cmd_download(args: argparse.Namespace) -> int:
    path = download.fetch(args.name, force=args.force, progress=not args.quiet)
    print(path)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    ds = _prepare(args, _run_config(args))
    print(
        f"prepared {ds.name}: {ds.stats['users']:,} users, {ds.stats['items']:,} items, "
        f"{ds.stats['actions']:,} actions -> {ds.path}"
    )
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    ds = _prepare(args, _run_config(args))
    if args.json:
        print(
            json.dumps(
                {k: ds.stats[k] for k in ("users", "items", "actions", "avg_length", "density")}
            )
        )
    else:
        print(stats_table(ds.name, ds.stats))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume:
        # the run goes on with the config it was started with; the data must be the same
        cfg = RunDir(args.out).config()
    else:
        extra = [f"model={json.dumps(args.model)}"]
        if args.time_budget:
            extra.append(f"train.time_budget={json.dumps(args.time_budget)}")
        args.set = [*(args.set or []), *extra]
        cfg = _run_config(args)
    _say_short_budget(cfg)
    return _train(args, cfg, args.data, source={"data": args.data}, inputs=[args.data])


def cmd_refit(args: argparse.Namespace) -> int:
    run = Path(args.run)
    if args.resume:
        cfg = RunDir(args.out).config()
        data = args.data or _source_data(Path(args.out))
    else:
        metrics = RunDir(run, trust=args.trust).metrics()
        if metrics is None:
            raise ConfigError(
                f"{run}: the run has not finished (no metrics yet); a refit needs the epoch "
                "its validation chose"
            )
        best = int(metrics["best_epoch"])
        cfg = refit_config(RunDir(run, trust=args.trust).config(), best)
        data = args.data or _source_data(run)
        print(
            f"refit of {run}: {cfg.train.max_epochs} epochs (its validation chose epoch {best}) "
            "on the training and validation items; the last state is tested",
            flush=True,
        )
    return _train(args, cfg, data, source={"data": data, "refit_of": str(run)}, inputs=[data, run])


def _source_data(run_dir: Path) -> str:
    """The dataset a run was trained on, as its config records it."""
    data = RunDir(run_dir).source().get("data")
    if not data:
        raise ConfigError(f"{run_dir}: its config records no source data; give --data")
    return str(data)


def _train(
    args: argparse.Namespace,
    cfg: RunConfig,
    data: str,
    source: dict[str, str],
    inputs: Sequence[str | Path],
) -> int:
    """Train `cfg` on `data` into --out (or resume it there) and print the test metrics; --out
    may not be or contain any of `inputs`."""
    inputs = [p for p in inputs if Path(p).exists()]
    validate(cfg)  # before anything is prepared or written
    check_run_out(Path(args.out), resume=args.resume, inputs=inputs)
    ds = prepare(
        data, data_cfg=cfg.data, eval_cfg=cfg.eval, force=args.force, progress=not args.quiet
    )
    result = fit(
        ds,
        cfg,
        Path(args.out),
        resume=args.resume,
        progress=not args.quiet,
        source=source,
        inputs=inputs,
        break_lock=args.break_lock,
        keep_checkpoints=args.keep_checkpoints,
    )
    m = result.metrics
    label = run_label(cfg.model, cfg.train.loss)
    print(metrics_table(m["test"], model=label, with_paper=_is_ml1m(ds)))
    print(
        f"\n{m['epochs']} epochs ({m['stopped']}), tested epoch {m['best_epoch']}, chosen by "
        f"{m['selected_on']}; {m['train_time_s'] / 60:.1f} min, {m['seq_per_s']:.0f} seq/s "
        f"-> {result.run_dir}"
    )
    return 0


def _say_short_budget(cfg: RunConfig) -> None:
    """One line when the config's short-budget tiers change, or may change, this run's
    settings (an epochs tier is decided by timing the machine as the run starts)."""
    due, timed = short_budget_tiers(cfg), speed_tiers(cfg)
    budget = cfg.train.time_budget
    parts = []
    if due:
        settings = ", ".join(x for tier in due for x in tier.said())
        parts.append(f"{budget} is a short budget: this run trains with {settings}")
    if timed:
        settings = ", ".join(x for tier in timed for x in tier.said())
        parts.append(f"the epochs {budget} buys here decide {settings}, timed as the run starts")
    if parts:
        print("; ".join([*parts, "--set short_budget=[] keeps the config's own"]), flush=True)


def _settings_of_the_run(args: argparse.Namespace, run: str) -> None:
    """A command on a run prepares its data with the settings the run recorded: flags that
    would change them are an error, not ignored; --data defaults to the run's own."""
    given = [
        flag
        for flag, value in (
            ("--set", args.set),
            ("--config", args.config),
            ("--format", args.format),
            ("--user-col/--item-col/--time-col", _column_flags(args)),
            ("--min-user-interactions", getattr(args, "min_user_interactions", None)),
            ("--min-item-interactions", getattr(args, "min_item_interactions", None)),
        )
        if value
    ]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: {run} is a run; its data and evaluation settings are the ones "
            "it recorded (train a new run to change them)"
        )
    if not args.data:
        args.data = _source_data(Path(run))


def _is_ml1m(ds: PreparedDataset) -> bool:
    return ds.stats.get("users") == 6040 and ds.stats.get("items") == 3416


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.save_ranks:
        check_out_file(Path(args.save_ranks), replace=args.force, inputs=[args.model, args.data])
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
        if list(ds.item_ids) != list(run.item_ids):
            raise ConfigError(
                f"{args.model}: the run was trained on other items than {args.data} gives "
                f"({len(run.item_ids)} vs {len(ds.item_ids)})"
            )
        scorer = run.model
        name = run_label(cfg.model, cfg.train.loss)
    else:
        raise SeqrecError(f"{args.model}: neither 'pop' nor a run directory")
    report = ds.evaluate(
        scorer,
        args.split,
        protocols=parse_protocols(protocols_arg or cfg.eval.protocols),
        ks=ks_arg or list(cfg.eval.ks),
        batch_size=cfg.eval.batch_size,
        device=device,
        progress=not args.quiet,
    )
    _print_report(args, report, name, ds)
    return 0


def _print_report(
    args: argparse.Namespace, report: EvalReport, name: str, ds: PreparedDataset
) -> None:
    if args.save_ranks:
        save_ranks(report, Path(args.save_ranks), ds.user_ids)
    if args.json:
        print(json.dumps(report.metrics))
    else:
        print(metrics_table(report.metrics, model=name, with_paper=args.split == "test"))


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
        if list(run.item_ids) != list(ds.item_ids):
            raise ConfigError(f"{name}: trained on other items than {ds.path}")
    protocols = parse_protocols(args.protocol or runs[0].config.eval.protocols)
    ks = [int(k) for k in args.k.split(",")] if args.k else list(runs[0].config.eval.ks)
    if args.metric not in metric_names(ks):
        raise ConfigError(f"--metric {args.metric!r} is not one of {', '.join(metric_names(ks))}")
    device = str(resolve_device("auto"))
    reports = {
        name: ds.evaluate(run.model, args.split, protocols=protocols, ks=ks, device=device)
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


def cmd_recommend(args: argparse.Namespace) -> int:
    """Top-k for one history (--history), a known user (--user), or every history of a file
    (--input -> --output)."""
    modes = [args.history is not None, args.user is not None, args.input is not None]
    if sum(modes) != 1:
        raise SeqrecError("recommend: give exactly one of --history, --user, --input")
    if args.input and not args.output:
        raise SeqrecError("recommend --input needs --output (a .parquet or .csv file)")
    if args.output:
        check_out_file(Path(args.output), replace=args.force, inputs=[args.input, args.run])
    rec = Recommender.from_run(
        args.run,
        device=str(resolve_device("auto")),
        unknown=args.unknown,
        metadata=args.items,
        trust=args.trust,
    )
    exclude = not args.include_seen
    candidates = _id_list(args.candidates) if args.candidates else None
    if args.input:
        data = dataclasses.replace(rec.run.config.data, **_column_flags(args))
        users, histories = read_histories(
            args.input, user_col=data.user_col, item_col=data.item_col, time_col=data.time_col
        )
        recs = rec.recommend_batch(
            histories, args.k, exclude, candidates, progress=not args.quiet, users=users
        )
        path = write_recommendations(args.output, users, recs, rec)
        if rec.dropped:
            print(f"dropped {rec.dropped:,} unknown item ids", file=sys.stderr)
        print(f"{len(users):,} histories -> {path}")
        return 0
    if args.user is not None:
        user = _parse_id(args.user)
        recs_one = rec.recommend_user(user, args.k, exclude)
        dropped: list[object] = []
    else:
        enc = rec.encode(_id_list(args.history))
        dropped = list(enc.unknown)
        (recs_one,) = rec.recommend_encoded([enc.ids], args.k, exclude, candidates=candidates)
    rows = [
        {"rank": r, "item": item, "score": score, **(rec.describe(item) or {})}
        for r, (item, score) in enumerate(recs_one, start=1)
    ]
    if args.json:
        print(json.dumps({"items": rows, "dropped": dropped}))
        return 0
    if dropped:
        print(f"dropped {len(dropped)} unknown item id(s): {dropped[:10]}", file=sys.stderr)
    has_title = any("title" in r for r in rows)
    print("| rank | item | score |" + (" title |" if has_title else ""))
    print("|---|---|---|" + ("---|" if has_title else ""))
    for r in rows:
        title = f" {r.get('title', '')} |" if has_title else ""
        print(f"| {r['rank']} | {r['item']} | {r['score']:.4f} |{title}")
    return 0


def _id_list(text: str) -> list[object]:
    """ "1193,661,914" -> [1193, 661, 914]; ids that are not integers stay strings."""
    return [_parse_id(part) for part in text.split(",") if part.strip()]


def _parse_id(text: str) -> object:
    """An id as typed: an integer when it is one, else the (stripped) string."""
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else text


def cmd_serve(args: argparse.Namespace) -> int:
    from seqrec.serve import ServeOptions, serve

    for flag in ("max_connections", "max_requests_per_connection", "max_history", "max_batch"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected >= 1")
    for flag in ("header_timeout", "keep_alive", "timeout"):
        if not getattr(args, flag) > 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected a positive number of seconds")

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(f"--api-key-env {args.api_key_env}: that variable is unset or empty")
    options = ServeOptions(
        max_history=args.max_history,
        max_batch=args.max_batch,
        max_body=args.max_body,
        timeout=args.timeout,
        api_key=api_key,
        cors_origins=tuple(args.cors_origin),
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        keep_alive=args.keep_alive,
        max_requests=args.max_requests_per_connection,
    )
    serve(
        args.run,
        host=args.host,
        port=args.port,
        workers=args.workers,
        unknown=args.unknown,
        options=options,
        trust=args.trust,
        insecure=args.insecure,
        device=str(resolve_device(args.device)),
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Validation curves of one or more runs in one PNG."""
    from seqrec.plots import plot_curves

    out = Path(args.out) if args.out else Path(args.runs[0]) / "curves.png"
    check_out_file(out, replace=args.force)
    print(f"-> {plot_curves(args.runs, out, trust=args.trust)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = export_run(args.run, args.format, args.out, replace=args.force, trust=args.trust)
    print(f"{args.format} -> {path}")
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    """BERT4Rec Figure 2: average attention heat-maps of the last positions, per layer and head."""
    import tempfile

    import numpy as np
    import torch

    from seqrec.attention import attention_maps, plot_attention
    from seqrec.evaluate import pad_histories
    from seqrec.provenance import atomic_write, write_json

    out = Path(args.figure) if args.figure else Path(args.run) / "attention.png"
    for path in (out, out.with_suffix(".json")):
        check_out_file(path, replace=args.force, inputs=[args.data])
    _settings_of_the_run(args, args.run)
    run = load_run(args.run, trust=args.trust)
    ds = _prepare(args, run.config, inputs=[args.run])
    if list(ds.item_ids) != list(run.item_ids):
        raise ConfigError(
            f"{args.run}: the run was trained on other items than {args.data} gives "
            f"({len(run.item_ids)} vs {len(ds.item_ids)})"
        )
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


REPRODUCIBLE = ("bert4rec-table2", "sasrec-table3")  # `seqrec reproduce` names: shipped specs


def cmd_experiment(args: argparse.Namespace) -> int:
    """A declarative sweep (seqrec.experiment): each point a run dir, results after each.
    `reproduce` is the same with a paper's table as the spec (and an optional budget per row)."""
    from seqrec.experiment import load_spec, run_experiment

    spec = load_spec(args.spec)
    if getattr(args, "time_budget", None):
        spec = spec.with_budget(args.time_budget)
    if getattr(args, "epochs", None) is not None:
        spec = spec.with_epochs(args.epochs)
    if args.dry_run:
        for point in spec.points:
            for seed in spec.seeds:
                cfg = spec.config(point, seed)
                budget = cfg.train.time_budget or (
                    f"{spec.epochs} epochs" if spec.epochs else "the config's own stopping rule"
                )
                print(
                    f"{point.label} seed {seed}: {' '.join(point.overrides) or '(the base)'} "
                    f"[{point.base or spec.base}, {budget}]"
                )
        return 0
    runs = Path(args.runs_dir) if args.runs_dir else download.cache_dir() / "runs"
    command = "seqrec " + " ".join(sys.argv[1:]) if sys.argv else ""
    path = run_experiment(
        spec, args.data, runs, progress=not args.quiet, command=command, trust=args.trust
    )
    print(path.with_suffix(".md").read_text())
    print(f"-> {path} (and .md, .png)")
    return 0


def _find_ml1m() -> tuple[str | None, str]:
    """The main job's data: the papers' ML-1M file from $SEQREC_DATA_DIR, else the cache or a
    download of the official ML-1M; (None, reason) when none is reachable."""
    root = os.environ.get(DATA_DIR_ENV)
    if root:
        for rel in ("bert4rec-paper/ml-1m.txt.gz", "ml-1m/ratings.dat"):
            if (Path(root) / rel).exists():
                return str(Path(root) / rel), f"${DATA_DIR_ENV}/{rel}"
    try:
        return str(download.fetch("ml-1m", retries=0, timeout=10)), "ml-1m (official, cached)"
    except DownloadError as e:
        return None, str(e)


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The main job: prepare ML-1M (or, offline, synthetic data), evaluate POP, train BERT4Rec
    briefly with the ML-1M recipe's settings (its schedule squeezed into the budget), print both
    tables."""
    if args.data:
        data, origin = args.data, args.data
    else:
        data, origin = _find_ml1m()
    if data is not None:
        cfg = load_config(RunConfig, "ml-1m-bert4rec")
        ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval)
    else:
        print(f"no ML-1M reachable ({origin}); running on SYNTHETIC data instead", file=sys.stderr)
        origin = "synthetic (seqrec.data.synthetic, seed 0)"
        cfg = load_config(RunConfig, "synthetic-bert4rec")
        ds = prepare_frame(
            synthetic_interactions(seed=0),
            download.cache_dir() / "prepared" / "synthetic-seed0",
            name="synthetic",
            data_cfg=cfg.data,
            eval_cfg=cfg.eval,
            replace=True,  # the cache's own folder
        )
    full_budget = cfg.train.time_budget
    cfg = load_config(
        RunConfig, None, [f"train.time_budget={json.dumps(args.time_budget)}"], base=cfg
    )
    paper = _is_ml1m(ds)
    print(f"data: {origin} -> {ds.path}\n")
    _say_short_budget(cfg)
    print(stats_table(ds.name, ds.stats) + "\n")
    pop = ds.evaluate(
        Popularity.fit(ds.split.train),
        "test",
        protocols=cfg.eval.protocols,
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
    )
    print(metrics_table(pop.metrics, model="pop", with_paper=paper) + "\n", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else download.cache_dir() / "runs" / f"quickstart-{stamp}"
    result = fit(ds, cfg, out, progress=not args.quiet, source={"data": origin})
    m = result.metrics
    print(metrics_table(m["test"], model="bert4rec", with_paper=paper))
    print(
        f"\nBERT4Rec: {m['epochs']} epochs in {m['train_time_s'] / 60:.1f} min "
        f"({m['seq_per_s']:.0f} seq/s), best epoch {m['best_epoch']} by {m['selected_on']} "
        f"-> {result.run_dir}"
    )
    if paper:
        print(
            f"A {args.time_budget} run of the recipe; its own budget ({full_budget}) buys more: "
            "seqrec train bert4rec --data ml-1m --out runs/b4r --config ml-1m-bert4rec "
            "(docs/bert4rec.md)."
        )
    return 0


# ------------------------------------------------------------------------------------ parser


def _version() -> str:
    from seqrec import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqrec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"seqrec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("download", help="fetch a dataset into the cache ($SEQREC_HOME)")
    p.add_argument("name", choices=list(download.DATASETS))
    p.add_argument("--force", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("prepare", help="read, filter, split a dataset; sample its candidates")
    _add_data_flags(p)
    _add_kcore_flags(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("stats", help="print the dataset's row of BERT4Rec Table 1")
    _add_data_flags(p)
    _add_kcore_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("train", help="train a model; the run directory gets everything")
    p.add_argument("model", choices=list(registry.MODELS))
    _add_data_flags(p, out_help="the run directory (created; must be new unless --resume)")
    p.add_argument("--time-budget", metavar="DURATION", help="wall clock for training: 20m, 1h")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    _add_run_out_flags(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "refit",
        help="train a finished run's config again on the training and validation items, for "
        "the epochs its validation chose (the state to serve)",
    )
    p.add_argument("run", metavar="RUN_DIR", help="a finished run trained on the training part")
    p.add_argument("--out", required=True, help="the new run directory (created)")
    p.add_argument("--data", help="the dataset (default: the one the run records)")
    p.add_argument("--force", action="store_true", help="prepare again even if unchanged")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--resume", action="store_true", help="continue the interrupted refit in --out")
    _add_trust_flag(p)
    _add_run_out_flags(p)
    p.set_defaults(func=cmd_refit)

    p = sub.add_parser("evaluate", help="evaluate a model under full / uni100 / pop100")
    p.add_argument("model", help="'pop', or a run directory from `seqrec train`")
    _add_data_flags(p, on_a_run=True)
    _add_kcore_flags(p)
    p.add_argument("--protocol", help="comma-separated: full,uni100,pop100 (default: all)")
    p.add_argument("--split", choices=["test", "valid"], default="test")
    p.add_argument("--k", help="comma-separated cut-offs (default 1,5,10)")
    p.add_argument("--save-ranks", metavar="FILE.parquet", help="write every user's rank")
    p.add_argument("--json", action="store_true")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("significance", help="paired t-test and Wilcoxon between two rank files")
    p.add_argument("ranks_a")
    p.add_argument("ranks_b")
    p.add_argument("--metric", default="ndcg@10")
    p.add_argument("--protocol", default="full")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_significance)

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

    p = sub.add_parser("recommend", help="top-k items for a history, a user, or a file of them")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--history", help="item ids, oldest first: 1193,661,914 ('' = none)")
    p.add_argument("--user", help="a user of the training data")
    p.add_argument("--input", help="a CSV/Parquet log with columns user,item[,timestamp]")
    p.add_argument("--output", help="recommendations file for --input (.parquet or .csv)")
    _add_column_flags(p)  # default: the columns the run was trained with
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.add_argument("-k", type=int, default=10, help="how many items (default 10)")
    p.add_argument("--include-seen", action="store_true", help="keep the history's own items")
    p.add_argument("--candidates", help="rank only these item ids: 1,2,3")
    p.add_argument("--unknown", choices=["drop", "reject"], default="drop")
    p.add_argument("--items", help="item metadata (MovieLens movies.dat) for titles")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("serve", help="serve a run over HTTP (needs the serve extra)")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1, help="processes, each loads the model")
    p.add_argument(
        "--device", default="cpu", help="where the model scores: cpu (default), cuda, auto"
    )
    p.add_argument("--unknown", choices=["drop", "reject"], default="drop")
    p.add_argument("--max-history", type=int, default=10_000, help="longest history accepted")
    p.add_argument("--max-batch", type=int, default=1024, help="histories per batch request")
    p.add_argument("--max-body", type=int, default=1_000_000, help="request body bytes")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (504)")
    p.add_argument(
        "--api-key-env", metavar="NAME", help="require 'Authorization: Bearer $NAME' (401)"
    )
    p.add_argument("--cors-origin", action="append", default=[], help="allowed origin (none)")
    p.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        help="open connections; one more closes the longest idle (1000)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a connection has to send a request's headers (10)",
    )
    p.add_argument("--keep-alive", type=float, default=5.0, help="idle keep-alive seconds (5)")
    p.add_argument(
        "--max-requests-per-connection", type=int, default=1000, help="then it is closed (1000)"
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a --host other than the loopback without --api-key-env",
    )
    _add_trust_flag(p)
    p.set_defaults(func=cmd_serve)

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

    p = sub.add_parser(
        "experiment", help="a declarative sweep: each point a run, results as they finish"
    )
    p.add_argument("spec", help="a spec file or a shipped name (table4-ml1m, fig4-ml1m, ...)")
    p.add_argument("--data", required=True, help="a dataset name or file path")
    p.add_argument("--runs-dir", help="where the points' runs go (default: $SEQREC_HOME/runs)")
    p.add_argument(
        "--epochs",
        type=int,
        help="train every point for this many epochs, no time budget (results: SPEC-<N>ep)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the points, train nothing")
    p.add_argument(
        "--trust",
        action="store_true",
        help="reuse finished runs that have no manifest (sha256.json): an older seqrec's",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_experiment)

    p = sub.add_parser(
        "reproduce",
        help="train (or reuse) every row of a paper's table and print it beside the paper's",
    )
    p.add_argument("spec", choices=REPRODUCIBLE, metavar="TABLE", help=", ".join(REPRODUCIBLE))
    p.add_argument("--data", required=True, help="a dataset name or file path (ML-1M)")
    p.add_argument("--time-budget", help="one budget for every row (default: each row's own)")
    p.add_argument("--runs-dir", help="where the rows' runs go (default: $SEQREC_HOME/runs)")
    p.add_argument("--dry-run", action="store_true", help="list the rows, train nothing")
    p.add_argument(
        "--trust",
        action="store_true",
        help="reuse finished runs that have no manifest (sha256.json): an older seqrec's",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_experiment)

    p = sub.add_parser("plot", help="the validation curves of runs, by epoch and by minutes")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="the PNG (default: curves.png in the first run)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--trust", action="store_true", help="read runs that have no manifest (sha256.json)"
    )
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("export", help="export a run's model (ONNX or TorchScript)")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--format", choices=list(FORMATS), default="onnx")
    p.add_argument("--out", help="the file (default: model.onnx / model.ts in the run)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "quickstart", help="the main job: prepare ML-1M, evaluate POP, train BERT4Rec briefly"
    )
    p.add_argument("--data", help="dataset name or file (default: find ML-1M, else synthetic)")
    p.add_argument(
        "--time-budget", default="5m", help="BERT4Rec's training budget on real data (5m)"
    )
    p.add_argument("--out", help="run directory (default: under the cache)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_quickstart)
    return parser


def _one_line(err: BaseException, width: int = 1000) -> str:
    lines = str(err).strip().splitlines()
    text = " ".join(line.strip() for line in lines) if isinstance(err, SeqrecError) else ""
    text = text or (lines[0] if lines else type(err).__name__)
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SeqrecError, ValueError, OSError) as e:
        # library functions raise ValueError on bad arguments; one line, of a bounded length
        # whatever the input echoed into it
        print(f"seqrec: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
