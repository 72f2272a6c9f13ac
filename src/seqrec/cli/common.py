"""Helpers the command groups share: data and column flags, preparing --data, the settings
a run recorded."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqrec.config import RunConfig, load_config
from seqrec.data import download
from seqrec.data.prepare import prepare
from seqrec.data.prepared import PreparedDataset
from seqrec.errors import ConfigError
from seqrec.evaluation.reference import is_papers_ml1m
from seqrec.training.policy import apply_device_tiers, device_tiers, short_budget_tiers, speed_tiers
from seqrec.training.rundir import RunDir

DATA_DIR_ENV = "SEQREC_DATA_DIR"  # a folder laid out like shared/data (benchmarks, main job)


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
    args: argparse.Namespace, cfg: RunConfig, inputs: Sequence[str] = (), *, items: bool = False
) -> PreparedDataset:
    """The --data of a command, prepared into --out (or the cache); --out may not be or
    contain any of `inputs` (a run directory the command reads). `items`: with the features of
    `cfg`'s items table kept beside it (`seqrec prepare --items-table`)."""
    return prepare(
        args.data,
        data_cfg=cfg.data,
        eval_cfg=cfg.eval,
        out=Path(args.out) if getattr(args, "out", None) else None,
        force=getattr(args, "force", False),
        progress=not getattr(args, "quiet", False),
        inputs=[Path(p) for p in inputs],
        items_cfg=cfg.items if items else None,
    )


def _add_items_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--items-table",
        metavar="FILE",
        help="an items table (CSV/TSV/Parquet with a header, or movies.dat) for --item-features",
    )
    p.add_argument(
        "--item-features",
        metavar="COLS",
        help="its feature columns, name or name:kind (category, categories, number, vector, "
        "text), e.g. genres:categories,year,title:text",
    )


def _items_sets(args: argparse.Namespace) -> list[str]:
    """--items-table and --item-features as the --set lines of [items]."""
    extra = []
    if args.items_table:
        extra.append(f"items.table={json.dumps(args.items_table)}")
    if args.item_features:
        names = [n.strip() for n in args.item_features.split(",") if n.strip()]
        extra.append(f"items.features={json.dumps(names)}")
    return extra


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


def _source_data(run_dir: Path) -> str:
    """The dataset a run was trained on, as its config records it."""
    data = RunDir(run_dir).source().get("data")
    if not data:
        raise ConfigError(f"{run_dir}: its config records no source data; give --data")
    return str(data)


def _say_short_budget(cfg: RunConfig) -> None:
    """One line when the config's tiers change, or may change, this run's settings (its device's
    tiers; an epochs tier is decided by timing the machine as the run starts)."""
    from seqrec.training.setup import resolve_device

    kind = resolve_device(cfg.train.device).type
    on_device = [tier for tier in device_tiers(cfg) if tier.device == kind]
    cfg = apply_device_tiers(cfg, kind)  # decided first: they may set the budget
    due, timed = short_budget_tiers(cfg), speed_tiers(cfg)
    budget = cfg.train.time_budget
    parts = []
    if on_device:
        settings = ", ".join(x for tier in on_device for x in tier.said())
        parts.append(f"this run trains with {settings}")
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
    return is_papers_ml1m(ds.stats)


def _id_list(text: str) -> list[object]:
    """ "1193,661,914" -> [1193, 661, 914]; ids that are not integers stay strings."""
    return [_parse_id(part) for part in text.split(",") if part.strip()]


def _parse_id(text: str) -> object:
    """An id as typed: an integer when it is one, else the (stripped) string."""
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else text
