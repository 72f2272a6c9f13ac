"""`seqrec download`, `prepare`, `stats`: datasets in."""

from __future__ import annotations

import argparse
import json
from typing import Any

from seqrec.cli.common import (
    _add_data_flags,
    _add_items_flags,
    _add_kcore_flags,
    _items_sets,
    _prepare,
    _run_config,
)
from seqrec.data import download
from seqrec.evaluation.report import stats_table


def cmd_download(args: argparse.Namespace) -> int:
    path = download.fetch(args.name, force=args.force, progress=not args.quiet)
    print(path)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    args.set = [*(args.set or []), *_items_sets(args)]
    ds = _prepare(args, _run_config(args), items=True)
    found = ds.item_features()
    features = f", item features {found[0].describe()}" if found is not None else ""
    print(
        f"prepared {ds.name}: {ds.stats['users']:,} users, {ds.stats['items']:,} items, "
        f"{ds.stats['actions']:,} actions{features} -> {ds.path}"
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


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("download", help="fetch a dataset into the cache ($SEQREC_HOME)")
    p.add_argument("name", choices=list(download.DATASETS))
    p.add_argument("--force", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("prepare", help="read, filter, split a dataset; sample its candidates")
    _add_data_flags(p)
    _add_kcore_flags(p)
    _add_items_flags(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("stats", help="print the dataset's row of BERT4Rec Table 1")
    _add_data_flags(p)
    _add_kcore_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)
