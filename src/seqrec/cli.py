"""The `seqrec` command: each subcommand parses its flags, builds a config and makes one library
call. User errors (`SeqrecError`) print one line on stderr and exit with status 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from seqrec.config import RunConfig, load_config
from seqrec.data import download
from seqrec.data.prepared import PreparedDataset, prepare, prepare_frame
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import DownloadError, SeqrecError
from seqrec.evaluate import load_ranks, parse_protocols, save_ranks
from seqrec.metrics import paired_test
from seqrec.models.baselines import Popularity
from seqrec.report import metrics_table, stats_table

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
    return load_config(RunConfig, getattr(args, "config", None), overrides)


def _prepare(args: argparse.Namespace, cfg: RunConfig) -> PreparedDataset:
    return prepare(
        args.data,
        data_cfg=cfg.data,
        eval_cfg=cfg.eval,
        out=Path(args.out) if getattr(args, "out", None) else None,
        force=getattr(args, "force", False),
        progress=not getattr(args, "quiet", False),
    )


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        required=True,
        help=f"a dataset name ({', '.join(download.DATASETS)}) or a file path",
    )
    p.add_argument("--format", help="reader for a file path (default: from its name)")
    p.add_argument("--config", help="a TOML config file")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set data.min_user_interactions=5",
    )
    p.add_argument("--out", help="prepared-dataset directory (default: under the cache)")
    p.add_argument("--force", action="store_true", help="prepare again even if unchanged")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_kcore_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-user-interactions",
        type=int,
        metavar="K",
        help="k-core: drop users with fewer interactions (default 5)",
    )
    p.add_argument(
        "--min-item-interactions",
        type=int,
        metavar="K",
        help="k-core: drop items with fewer interactions (default 5)",
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.model != "pop":
        raise SeqrecError(f"unknown model {args.model!r}; expected 'pop'")
    cfg = _run_config(args)
    protocols = parse_protocols(args.protocol or cfg.eval.protocols)
    ks = [int(k) for k in args.k.split(",")] if args.k else list(cfg.eval.ks)
    ds = _prepare(args, cfg)
    # POP counts the training part only (all but each user's last two items).
    report = ds.evaluate(
        Popularity.fit(ds.split.train),
        args.split,
        protocols=protocols,
        ks=ks,
        batch_size=cfg.eval.batch_size,
    )
    if args.save_ranks:
        save_ranks(report, Path(args.save_ranks), ds.user_ids)
    if args.json:
        print(json.dumps(report.metrics))
    else:
        print(metrics_table(report.metrics, model="pop", with_paper=args.split == "test"))
    return 0


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
    cfg = RunConfig()
    if args.data:
        data, origin = args.data, args.data
        ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval)
    else:
        data, origin = _find_ml1m()
        if data is not None:
            ds = prepare(data, data_cfg=cfg.data, eval_cfg=cfg.eval)
        else:
            print(
                f"no ML-1M reachable ({origin}); running on SYNTHETIC data instead", file=sys.stderr
            )
            origin = "synthetic (seqrec.data.synthetic, seed 0)"
            out = download.cache_dir() / "prepared" / "synthetic-seed0"
            ds = prepare_frame(
                synthetic_interactions(seed=0),
                out,
                name="synthetic",
                data_cfg=cfg.data,
                eval_cfg=cfg.eval,
            )
    print(f"data: {origin} -> {ds.path}\n")
    print(stats_table(ds.name, ds.stats) + "\n")
    report = ds.evaluate(
        Popularity.fit(ds.split.train),
        "test",
        protocols=cfg.eval.protocols,
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
    )
    print(metrics_table(report.metrics, model="pop", with_paper=ds.name != "synthetic"))
    return 0


# ------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqrec", description=__doc__)
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

    p = sub.add_parser("evaluate", help="evaluate a model under full / uni100 / pop100")
    p.add_argument("model", help="'pop'")
    _add_data_flags(p)
    _add_kcore_flags(p)
    p.add_argument("--protocol", help="comma-separated: full,uni100,pop100 (default: all)")
    p.add_argument("--split", choices=["test", "valid"], default="test")
    p.add_argument("--k", help="comma-separated cut-offs (default 1,5,10)")
    p.add_argument("--save-ranks", metavar="FILE.parquet", help="write every user's rank")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("significance", help="paired t-test and Wilcoxon between two rank files")
    p.add_argument("ranks_a")
    p.add_argument("ranks_b")
    p.add_argument("--metric", default="ndcg@10")
    p.add_argument("--protocol", default="full")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_significance)

    p = sub.add_parser("quickstart", help="the main job: prepare ML-1M, evaluate POP")
    p.add_argument("--data", help="dataset name or file (default: find ML-1M, else synthetic)")
    p.set_defaults(func=cmd_quickstart)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SeqrecError as e:
        print(f"seqrec: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        # library functions raise ValueError on bad arguments; keep it to one line
        print(
            f"seqrec: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
