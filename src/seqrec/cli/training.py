"""`seqrec train` and `refit`: a run directory out."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqrec.cli.common import (
    _add_data_flags,
    _add_items_flags,
    _add_run_out_flags,
    _add_trust_flag,
    _is_ml1m,
    _items_sets,
    _run_config,
    _say_short_budget,
    _source_data,
)
from seqrec.config import RunConfig
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.data.split import TrainOn
from seqrec.errors import ConfigError
from seqrec.evaluation.report import metrics_table, run_label
from seqrec.models import registry
from seqrec.serving.indexing import index_if_large
from seqrec.training.distributed import on_main, process_group, ranks
from seqrec.training.fit import check_run_out, fit
from seqrec.training.policy import ANY_LOG_ADAPT, refit_config
from seqrec.training.rundir import RunDir
from seqrec.training.setup import resolve_device
from seqrec.training.validation import validate


def cmd_train(args: argparse.Namespace) -> int:
    notice = None
    if args.resume:
        # the run goes on with the config it was started with; the data must be the same
        cfg = RunDir(args.out).config()
    else:
        extra = [f"model={json.dumps(args.model)}"]
        if not args.config:  # the model's defaults, their sizes and loss fitted to the data
            args.set = [ANY_LOG_ADAPT, *(args.set or [])]
        if args.time_budget:
            extra.append(f"train.time_budget={json.dumps(args.time_budget)}")
        extra += _items_sets(args)
        if args.model == "sasrec" and not args.config:
            # the start for a new log: the sasrec-ce recipe (full cross-entropy), far above the
            # paper's BCE with one negative on every dataset measured (docs/results/sasrec.md)
            args.config = "sasrec-ce"
            notice = (
                "sasrec: the sasrec-ce recipe (cross-entropy, trained until validation stops "
                "improving); --config ml-1m-sasrec for the paper's recipe"
            )
        args.set = [*(args.set or []), *extra]
        cfg = _run_config(args)
    _say_short_budget(cfg)
    return _train(
        args, cfg, args.data, source={"data": args.data}, inputs=[args.data], notice=notice
    )


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
        on: TrainOn = "all" if args.all else "train+valid"
        cfg = refit_config(
            RunDir(run, trust=args.trust).config(), best, metrics.get("lr_reductions", ()), on
        )
        data = args.data or _source_data(run)
        items, tested = (
            ("every item", "nothing is held out to test it")
            if args.all
            else ("the training and validation items", "the last state is tested")
        )
        print(
            f"refit of {run}: {cfg.train.max_epochs} epochs (its validation chose epoch {best}) "
            f"on {items}; {tested}",
            flush=True,
        )
    features = RunDir(run, trust=args.trust).item_features()  # the run's own, not the table's
    return _train(
        args,
        cfg,
        data,
        source={"data": data, "refit_of": str(run)},
        inputs=[data, run],
        items=features,
    )


def _train(
    args: argparse.Namespace,
    cfg: RunConfig,
    data: str,
    source: dict[str, str],
    inputs: Sequence[str | Path],
    notice: str | None = None,
    items: Any = None,
) -> int:
    """Train `cfg` on `data` into --out (or resume it there) and print the test metrics; --out
    may not be or contain any of `inputs`. `notice`: a line said with the results."""
    inputs = [p for p in inputs if Path(p).exists()]
    # every check a training makes that needs no data (ranges, the loop's, the model's, the
    # memory its layers ask for), before anything is prepared or written
    validate(cfg)
    r = ranks()  # under torchrun: rank 0 checks, prepares, writes and reports
    with process_group(r, resolve_device(cfg.train.device)):

        def check_and_prepare() -> PreparedDataset:
            check_run_out(Path(args.out), resume=args.resume, inputs=inputs)
            return prepare(
                data,
                data_cfg=cfg.data,
                eval_cfg=cfg.eval,
                force=args.force,
                progress=not args.quiet,
            )

        # rank 0 checks and prepares the data first (its error is every rank's); the others
        # then find it prepared
        ds = on_main(r, check_and_prepare)
        if ds is None:
            ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
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
            items=items,
        )
    if not r.main:
        return 0
    if not args.no_index:
        index_if_large(result.run_dir, progress=not args.quiet)
    m = result.metrics
    label = run_label(cfg.model, cfg.train.loss)
    if "test" in m:  # a run trained on every item has nothing held out to test
        print(metrics_table(m["test"], model=label, with_paper=_is_ml1m(ds)))
    print(
        f"\n{m['epochs']} epochs ({m['stopped']}), tested epoch {m['best_epoch']}, chosen by "
        f"{m['selected_on']}; {m['train_time_s'] / 60:.1f} min, {m['seq_per_s']:.0f} seq/s "
        f"-> {result.run_dir}"
    )
    if notice:
        print(notice)
    return 0


def _add_no_index_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-index",
        action="store_true",
        help="no item index at the end, whatever the catalogue (seqrec index RUN builds one)",
    )


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model; the run directory gets everything")
    p.add_argument("model", choices=list(registry.MODELS))
    _add_data_flags(p, out_help="the run directory (created; must be new unless --resume)")
    p.add_argument("--time-budget", metavar="DURATION", help="wall clock for training: 20m, 1h")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    _add_no_index_flag(p)
    _add_items_flags(p)
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
    _add_no_index_flag(p)
    p.add_argument(
        "--all",
        action="store_true",
        help="train on every item, the test ones too (the state to serve; tested on nothing)",
    )
    _add_trust_flag(p)
    _add_run_out_flags(p)
    p.set_defaults(func=cmd_refit)
