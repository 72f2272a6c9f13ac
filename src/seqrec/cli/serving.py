"""`seqrec recommend`, `serve`, `export`: a trained model in use."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from seqrec.cli.common import (
    _add_column_flags,
    _add_trust_flag,
    _column_flags,
    _id_list,
    _parse_id,
)
from seqrec.errors import ConfigError, SeqrecError
from seqrec.outputs import check_out_file
from seqrec.serving.catalogue import CATALOGUE_WAIT
from seqrec.serving.export import FORMATS, QUANTIZED, export_run
from seqrec.serving.files import read_timed_histories, write_recommendations
from seqrec.serving.indexing import TARGET_RECALL
from seqrec.serving.recommender import Recommender
from seqrec.training.rundir import RunDir
from seqrec.training.setup import resolve_device


def cmd_recommend(args: argparse.Namespace) -> int:
    """Top-k for one history (--history), a known user (--user), or every history of a file
    (--input -> --output)."""
    modes = [args.history is not None, args.user is not None, args.input is not None]
    if sum(modes) + args.all_users != 1:
        raise SeqrecError("recommend: give exactly one of --history, --user, --input, --all-users")
    if (args.input or args.all_users) and not args.output:
        flag = "--input" if args.input else "--all-users"
        raise SeqrecError(f"recommend {flag} needs --output (a .parquet or .csv file)")
    if args.output:
        check_out_file(Path(args.output), replace=args.force, inputs=[args.input, args.run])
        if Path(args.output).suffix not in (".parquet", ".csv"):
            raise ConfigError(f"{args.output}: the output must be a .parquet or .csv file")
    rec = Recommender.from_run(
        args.run,
        device=str(resolve_device("auto")),
        unknown=args.unknown,
        metadata=args.items,
        trust=args.trust,
        exact=args.exact,
    )
    exclude = not args.include_seen
    candidates = _id_list(args.candidates) if args.candidates else None
    if args.exclude:
        rec.exclude_items(_id_list(args.exclude))
    if args.all_users:
        from seqrec.serving.all_users import write_all_users

        n = write_all_users(
            rec,
            args.output,
            args.k,
            exclude,
            candidates=candidates,
            progress=not args.quiet,
            at=args.at,
        )
        print(f"{n:,} users -> {args.output}")
        return 0
    if args.input:
        data = dataclasses.replace(rec.run.config.data, **_column_flags(args))
        users, histories, times = read_timed_histories(
            args.input, user_col=data.user_col, item_col=data.item_col, time_col=data.time_col
        )
        recs = rec.recommend_batch(
            histories,
            args.k,
            exclude,
            candidates,
            progress=not args.quiet,
            users=users,
            times=times,
            at=args.at,
        )
        path = write_recommendations(args.output, users, recs, rec)
        if rec.dropped:
            print(f"dropped {rec.dropped:,} unknown item ids", file=sys.stderr)
        print(f"{len(users):,} histories -> {path}")
        return 0
    if args.user is not None:
        user = _parse_id(args.user)
        recs_one = rec.recommend_user(user, args.k, exclude, at=args.at)
        dropped: list[object] = []
    else:
        history = _id_list(args.history)
        times = None if args.times is None else [_times(args.times)]
        ([enc], kept) = rec.encode_batch([history], times)
        dropped = list(enc.unknown)
        (recs_one,) = rec.recommend_encoded(
            [enc.ids],
            args.k,
            exclude,
            candidates=candidates,
            times=kept,
            at=args.at,
        )
    _print_recommendations(rec, recs_one, dropped, args.json)
    return 0


def _print_recommendations(
    rec: Recommender, recs: list[tuple[Any, float]], dropped: list[object], as_json: bool
) -> None:
    """One history's top-k: JSON, or a Markdown table (with titles where known)."""
    rows = [
        {"rank": r, "item": item, "score": score, **(rec.describe(item) or {})}
        for r, (item, score) in enumerate(recs, start=1)
    ]
    if as_json:
        print(json.dumps({"items": rows, "dropped": dropped}))
        return
    if dropped:
        print(f"dropped {len(dropped)} unknown item id(s): {dropped[:10]}", file=sys.stderr)
    has_title = any("title" in r for r in rows)
    print("| rank | item | score |" + (" title |" if has_title else ""))
    print("|---|---|---|" + ("---|" if has_title else ""))
    for r in rows:
        title = f" {r.get('title', '')} |" if has_title else ""
        print(f"| {r['rank']} | {r['item']} | {r['score']:.4f} |{title}")


def _times(text: str) -> list[int]:
    """ "978300760,978302109" -> [978300760, 978302109]: --times, seconds since the epoch."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--times {text!r}: expected whole seconds, comma-separated") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from seqrec.serving.service import ServeOptions, serve

    flags = ("max_connections", "max_requests_per_connection", "max_history", "max_batch")
    for flag in (*flags, "micro_batch", "max_queue"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected >= 1")
    for flag in ("header_timeout", "keep_alive", "timeout"):
        if not getattr(args, flag) > 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected a positive number of seconds")
    if args.threads < 0:
        raise ConfigError("--threads: expected >= 0 (0: torch's default)")
    if args.search_breadth < 0:
        raise ConfigError("--search-breadth: expected >= 1 (or 0: as the index was built)")
    if args.search_breadth and args.exact:
        raise ConfigError("--search-breadth: --exact searches no index")
    if not args.batch_wait_ms >= 0:
        raise ConfigError("--batch-wait-ms: expected a number of milliseconds >= 0")

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
        micro_batch=args.micro_batch,
        batch_wait=args.batch_wait_ms / 1000,
        max_queue=args.max_queue,
        threads=args.threads,
        http=args.http,
        exclude_items=tuple(_read_ids(args.exclude_items)) if args.exclude_items else (),
        exact=args.exact,
        search_breadth=args.search_breadth,
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
        access_log=not args.no_access_log,
    )
    return 0


def _read_ids(path: str) -> list[Any]:
    """The item ids of a file, one a line (blank lines and `#` comments skipped)."""
    from seqrec.files import bound, read_checked

    try:
        text = read_checked(Path(path), bound("vocab"), error=ConfigError).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--exclude-items {path}: not UTF-8 text") from None
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [_parse_id(line) for line in lines if line]


def cmd_export(args: argparse.Namespace) -> int:
    path = export_run(
        args.run,
        args.format,
        args.out,
        quantize=args.quantize,
        replace=args.force,
        trust=args.trust,
    )
    print(f"{args.format}{f' ({args.quantize})' if args.quantize else ''} -> {path}")
    return 0


def cmd_add_items(args: argparse.Namespace) -> int:
    rec = Recommender.from_run(args.run, trust=args.trust)
    before = rec.n_items
    ids = rec.add_items(args.items)
    shown = ", ".join(map(str, ids[:5])) + (", ..." if len(ids) > 5 else "")
    print(f"{args.run}: {len(ids):,} items added ({shown}); {before:,} -> {rec.n_items:,} items")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from seqrec.serving.indexing import build_index

    if args.remove:
        run = RunDir(args.run, trust=args.trust)
        with run.lock(wait=CATALOGUE_WAIT, what="catalogue"):
            run.save_index(None)
        print(f"{args.run}: item index removed (every item scored)")
        return 0
    for flag in ("m", "ef_construction", "ef_search", "sample", "nlist", "nprobe"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}: expected >= 1")
    kind = args.kind
    if kind == "ivf" and args.library != "faiss":
        raise ConfigError(f"--kind ivf: an ivf index is faiss's; {args.library} builds hnsw")
    other = ("nlist", "nprobe") if kind == "hnsw" else ("m", "ef_construction", "ef_search")
    for flag in other:
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')}: not a setting of a {kind} index")
    if not 0 < args.target <= 1:
        raise ConfigError(f"--target: expected a recall in (0, 1], got {args.target}")
    rec = Recommender.from_run(args.run, trust=args.trust, exact=True)
    index = build_index(
        rec,
        library=args.library,
        kind=kind,
        m=args.m or 32,
        ef_construction=args.ef_construction or 200,
        ef_search=args.ef_search,
        nlist=args.nlist,
        nprobe=args.nprobe,
        target=args.target,
        sample=args.sample,
    )
    r = index.recall
    print(
        f"{args.run}: item index of {index.n_items:,} items ({index.describe()}) built in "
        f"{r['build_seconds']:.1f} s; recall@10 against exact scoring {r['recall@10']:.4f} on "
        f"{int(r['histories']):,} histories"
    )
    return 0


def add_parsers(sub: Any) -> None:
    _recommend_parser(sub)
    _serve_parser(sub)
    _export_parser(sub)
    p = sub.add_parser(
        "index",
        help="build (or rebuild) a run's item index: approximate top-k over a large catalogue",
    )
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--library", choices=["faiss", "usearch"], default="faiss")
    p.add_argument(
        "--kind",
        choices=["hnsw", "ivf"],
        default="hnsw",
        help="hnsw (a graph; the default) or ivf (k-means lists, faiss: builds in seconds)",
    )
    p.add_argument("--nlist", type=int, help="ivf: lists (default about 4 sqrt(items))")
    p.add_argument(
        "--nprobe", type=int, help="ivf: lists searched (default: the fewest reaching --target)"
    )
    p.add_argument(
        "--target",
        type=float,
        default=TARGET_RECALL,
        help=f"the recall@10 the search breadth is chosen for (default {TARGET_RECALL})",
    )
    p.add_argument("--m", type=int, help="hnsw: links per node (default 32)")
    p.add_argument("--ef-construction", type=int, help="hnsw (default 200)")
    p.add_argument(
        "--ef-search", type=int, help="hnsw: search breadth (default: the least reaching --target)"
    )
    p.add_argument("--sample", type=int, default=1000, help="histories its recall is measured on")
    p.add_argument("--remove", action="store_true", help="remove the run's index")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_index)
    p = sub.add_parser(
        "add-items",
        help="add new items to a run trained with item features (scored from their features)",
    )
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument(
        "--items", required=True, help="an items table of the new items, with the run's columns"
    )
    _add_trust_flag(p)
    p.set_defaults(func=cmd_add_items)


def _recommend_parser(sub: Any) -> None:
    p = sub.add_parser("recommend", help="top-k items for a history, a user, or a file of them")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--history", help="item ids, oldest first: 1193,661,914 ('' = none)")
    p.add_argument(
        "--times",
        help="when each --history item happened, seconds since the epoch: 978300760,... (a "
        "model of time, HSTU's time bias, needs them; an --input log gives its time column)",
    )
    p.add_argument(
        "--at",
        type=int,
        help="the time the recommendations are for, seconds since the epoch (default: now; "
        "read by a model of time)",
    )
    p.add_argument("--user", help="a user of the training data")
    p.add_argument("--input", help="a CSV/Parquet log with columns user,item[,timestamp]")
    p.add_argument(
        "--all-users",
        action="store_true",
        help="every user of the run's data, streamed to --output in bounded memory",
    )
    p.add_argument(
        "--output", help="recommendations file for --input or --all-users (.parquet or .csv)"
    )
    _add_column_flags(p)  # default: the columns the run was trained with
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.add_argument("-k", type=int, default=10, help="how many items (default 10)")
    p.add_argument("--include-seen", action="store_true", help="keep the history's own items")
    p.add_argument("--candidates", help="rank only these item ids: 1,2,3")
    p.add_argument("--exclude", help="never recommend these item ids: 1,2,3")
    p.add_argument("--unknown", choices=["drop", "reject"], default="drop")
    p.add_argument("--items", help="item metadata (MovieLens movies.dat) for titles")
    p.add_argument("--exact", action="store_true", help="score every item (no item index)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_recommend)


_BREADTH_HELP = (
    "search the item index N wide: its ef_search (a graph) or nprobe (lists); default as it "
    "was built (seqrec index chose it for a recall target)"
)


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a run over HTTP (needs the serve extra)")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1, help="processes, each loads the model")
    p.add_argument(
        "--device", default="cpu", help="where the model scores: cpu (default), cuda, auto"
    )
    p.add_argument("--unknown", choices=["drop", "reject"], default="drop")
    p.add_argument(
        "--exclude-items",
        metavar="FILE",
        help="item ids never recommended, one a line (out of stock); unknown ids are ignored",
    )
    p.add_argument("--exact", action="store_true", help="score every item (no item index)")
    p.add_argument("--search-breadth", type=int, default=0, metavar="N", help=_BREADTH_HELP)
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
        "--micro-batch",
        type=int,
        default=64,
        help="one-history requests scored together at most (64; 1: each alone)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=1.0,
        help="how long a request waits for others to join its batch (1 ms)",
    )
    p.add_argument(
        "--max-queue", type=int, default=512, help="requests waiting to be scored; more: 503"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for scoring, per worker (0: one per core; 1 suits 2 cores)",
    )
    p.add_argument(
        "--http",
        choices=["auto", "httptools", "h11"],
        default="auto",
        help="the HTTP parser (auto: httptools when installed, else h11)",
    )
    p.add_argument("--no-access-log", action="store_true", help="no log line per request (faster)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a --host other than the loopback without --api-key-env",
    )
    _add_trust_flag(p)
    p.set_defaults(func=cmd_serve)


def _export_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="export a run's model (ONNX or TorchScript)")
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--format", choices=list(FORMATS), default="onnx")
    p.add_argument(
        "--quantize",
        choices=list(QUANTIZED),
        help="an ONNX graph with int8 weights (dynamic quantization) or in fp16 "
        "(default file: model.int8.onnx / model.fp16.onnx in the run)",
    )
    p.add_argument("--out", help="the file (default: model.onnx / model.ts in the run)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    _add_trust_flag(p)
    p.set_defaults(func=cmd_export)
