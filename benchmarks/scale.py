"""At scale, each stage in its own process: its wall time and peak resident memory (the
process's own maximum RSS).

    python benchmarks/scale.py catalogue [--users 1000000] [--items 1000000] [--budget 10m]
        [--eval-users 10000] [--serve-seconds 10] [--workdir DIR | --keep DIR]
        [--no-all-users] [--index FLAGS] [--name scale_catalogue]
    python benchmarks/scale.py ml-20m [--data ratings.csv] [--budget 10m] [--workdir DIR]
        [--name scale_ml20m]

`catalogue`: a synthetic log of a million users over a million items (Zipf-like popularity,
10-40 items a user; no k-core on items, so every item that occurs stays in the catalogue):
prepare; one epoch of SASRec (the `sasrec-ce` recipe's model) trained with a sampled softmax
(1,024 negatives shared by each batch, logQ-corrected) under the budget, validated and tested
on a seeded sample of users (`eval.sample_users`), its item index built at the end (or, with
--index, by `seqrec index` as a stage of its own); that run's test split evaluated again alone
(full ranking and the two sampled protocols; seconds per 1,000 users); every user's top 10
written by `seqrec recommend --all-users`; the index's recall@10 against exact scoring on 2,000
users' test histories; `seqrec serve` on the run under wrk (8 connections, real histories of
the log).

`ml-20m`: the ML-20M-format synthetic `ratings.csv` of benchmarks/speed.py prepare-scale (138,493
users, 26,744 items, 20,000,263 ratings), or the real file with --data; prepare; BERT4Rec
(`ml-20m-bert4rec`) and SASRec+CE (`ml-20m-sasrec-ce`) each under the budget, every user of
validation and test ranked under the three protocols at the end (the `seqrec train` run's own
evaluation, timed from its log).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from _common import write_results
from seqrec.evaluation.protocols import evaluate_split


def _stage(name: str, cmd: list[str], log: Path) -> dict[str, Any]:
    """Run `cmd` to its end (its output to `log`): wall seconds and the process's peak RSS."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    print(f"{name}: {wall:.1f} s, peak RSS {usage.ru_maxrss / 2**20:.2f} GiB", flush=True)
    return {
        "stage": name,
        "wall_s": round(wall, 2),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),
    }


def _seqrec(*argv: str) -> list[str]:
    return [sys.executable, "-m", "seqrec", *argv]


def _train_cmd(model: str, config: str, data: Path, run: Path, budget: str) -> list[str]:
    return _seqrec(
        "train", model, "--data", str(data), "--out", str(run), "--quiet",
        "--config", config, "--time-budget", budget,
    )  # fmt: skip


def _this(*argv: str) -> list[str]:
    return [sys.executable, __file__, *argv]


def make_catalogue(path: Path, users: int, items: int, seed: int) -> None:
    """The synthetic log of `catalogue`, as Parquet (user, item, timestamp)."""
    from seqrec.data.synthetic import synthetic_interactions

    df = synthetic_interactions(n_users=users, n_items=items, min_len=10, max_len=40, seed=seed)
    df.select("user", "item", "timestamp").write_parquet(path)


def evaluate_test(run: str, users: int) -> None:
    """The run's test split, its sampled users, under every protocol: seconds (printed)."""
    from seqrec.data.prepared import load_prepared
    from seqrec.training.checkpoint import load_run

    loaded = load_run(run)
    ds = load_prepared(loaded.source["prepared"])
    cfg = loaded.config
    start = time.perf_counter()
    report = evaluate_split(
        ds,
        loaded.model.eval(),
        "test",
        batch_size=cfg.eval.batch_size,
        sample_users=users,
        seed=cfg.eval.negative_seed,
    )
    seconds = time.perf_counter() - start
    print(json.dumps({"users": len(report.users), "seconds": seconds, "metrics": report.metrics}))


def index_recall(
    run: Path, histories: list[np.ndarray], breadths: Sequence[int] = (0,)
) -> dict[int, dict[str, Any]] | None:
    """The run's item index (built at the end of its training) searched at each of `breadths`
    (0: as built): what it is, and the recall@10 of its answers against exact scoring on
    `histories` (each test user's input), with the seconds each way (one process, these
    histories in the recommender's batches). The exact answers come first, their model freed
    before the index's is loaded (at ten million items the two do not fit together with a
    server). None when the run has no index."""
    from seqrec.serving.recommender import Recommender

    if not (run / "index.bin").exists():
        return None
    start = time.perf_counter()
    want = Recommender.from_run(run, exact=True).recommend_encoded(histories, 10)
    exact_s = time.perf_counter() - start
    rec = Recommender.from_run(run)
    assert rec.index is not None, f"{run}: its index.bin holds other weights"
    out = {}
    for breadth in breadths:
        if breadth:
            rec.index.set_breadth(breadth)
        start = time.perf_counter()
        found = rec.recommend_encoded(histories, 10)
        hits = sum(
            len({i for i, _ in a} & {i for i, _ in e}) for a, e in zip(found, want, strict=True)
        )
        out[breadth] = {
            "index": rec.index.describe(),
            "built": rec.index.recall,
            "histories": len(histories),
            "recall@10": hits / sum(len(e) for e in want),
            "index_s": time.perf_counter() - start,
            "exact_s": exact_s,
        }
    return out


def serve_breadths(run: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The run's index searched at each of `--serve-breadths` (ef, or nprobe for lists; 0: no
    index, every item scored): its recall@10 against exact scoring on the test histories, then
    `seqrec serve --search-breadth B` (`--exact` for 0) under wrk. The index file is read, never
    rewritten: the recalls are measured in this process first, and freed before the servers."""
    from seqrec.data.prepared import load_prepared

    ds = load_prepared(run.parent / "prepared")
    picks = np.random.default_rng(0).choice(ds.n_users, size=2000, replace=False)
    histories = [[ds.item_ids[i - 1] for i in ds.sequences[u]] for u in picks]
    inputs = [ds.sequences[u][:-1] for u in picks]
    del ds
    breadths = [int(b) for b in args.serve_breadths.split(",")]
    recalls = index_recall(run, inputs, [b for b in breadths if b])
    assert recalls is not None, f"{run}: no item index"
    recalls[0] = {"index": "none (exact)", "recall@10": 1.0, "histories": len(picks)}
    rows = []
    for breadth in breadths:
        flags = ["--exact"] if breadth == 0 else ["--search-breadth", str(breadth)]
        rows.append(
            {
                "breadth": breadth,
                **recalls[breadth],
                "serve": _serve(run, args.serve_seconds, histories, flags),
            }
        )
        x = rows[-1]
        print(
            f"breadth {breadth}: recall@10 {x['recall@10']:.4f}, "
            f"{x['serve']['requests_per_s']:.0f} req/s, p99 {x['serve']['p99_ms']:.1f} ms, "
            f"server RSS {x['serve']['rss_end_mib']:.0f} MiB",
            flush=True,
        )
    return rows


def _json_line(log: Path) -> dict[str, Any]:
    return json.loads(next(x for x in log.read_text().splitlines()[::-1] if x.startswith("{")))


def _run_summary(run: Path) -> dict[str, Any]:
    """What a finished `seqrec train` run records: epochs, speed, its evaluation's seconds and
    test metrics."""
    from seqrec.training.rundir import RunDir

    rd = RunDir(run)
    metrics, log = rd.metrics() or {}, rd.log()
    return {
        "epochs": metrics.get("epochs"),
        "steps": metrics.get("steps"),
        "stopped": metrics.get("stopped"),
        "seq_per_s": metrics.get("seq_per_s"),
        "train_time_s": metrics.get("train_time_s"),
        "wall_time_s": metrics.get("wall_time_s"),
        # validation, POP's validation and the test split, after the last epoch's end
        "final_evaluation_s": (metrics.get("wall_time_s") or 0)
        - (log[-1]["elapsed_s"] if log else 0),
        "eval_sample_users": metrics.get("eval_sample_users"),
        "valid": metrics.get("valid"),
        "test": metrics.get("test"),
    }


def _serve(
    run: Path, seconds: float, histories: list[list[Any]], flags: list[str] | None = None
) -> dict[str, Any]:
    """`seqrec serve RUN` (defaults, or `flags`) under wrk, serve_load's measurement."""
    import serve_load

    args = SimpleNamespace(
        run=str(run), workers=1, client="wrk", seconds=seconds, clients=8, new_connections=False
    )
    bodies = [{"history": h[-200:], "k": 10} for h in histories]
    return serve_load._load(args, flags or [], bodies)


def catalogue(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    log = work / "log.parquet"
    prep, run = work / "prepared", work / "run"
    stages = [
        _stage(
            "generate",
            _this("--make-catalogue", str(log), str(args.users), str(args.items)),
            work / "generate.log",
        ),
        _stage(
            "prepare",
            _seqrec(
                "prepare",
                "--data",
                str(log),
                "--out",
                str(prep),
                "--quiet",
                "--min-item-interactions",
                "1",
            ),
            work / "prepare.log",
        ),
    ]
    sets = [
        'train.loss="sampled_softmax"',
        "train.n_negatives=1024",
        'train.negatives_per="batch"',
        "train.logq=true",
        "train.max_epochs=1",
        f"eval.sample_users={args.eval_users}",
        "sasrec.max_len=50",
        "train.batch_size=256",
    ]
    cmd = _train_cmd("sasrec", "sasrec-ce", prep, run, args.budget)
    cmd += [x for s in sets for x in ("--set", s)]
    if args.index is not None:  # the index in its own stage: its time and memory apart
        cmd.append("--no-index")
    stages.append(_stage("train", cmd, work / "train.log"))
    if args.index is not None:
        stages.append(
            _stage("index", _seqrec("index", str(run), *args.index.split()), work / "index.log")
        )
    stages.append(
        _stage(
            "evaluate", _this("--evaluate", str(run), str(args.eval_users)), work / "evaluate.log"
        )
    )
    evaluated = _json_line(work / "evaluate.log")
    recs = work / "recs.parquet"
    all_users = None
    if not args.no_all_users:
        stages.append(
            _stage(
                "recommend --all-users",
                _seqrec("recommend", str(run), "--all-users", "--output", str(recs), "--quiet"),
                work / "all_users.log",
            )
        )
        import polars as pl

        all_users = {
            "rows": pl.scan_parquet(recs).select(pl.len()).collect().item(),
            "file_mib": recs.stat().st_size / 2**20,
        }
    from seqrec.data.prepared import load_prepared

    ds = load_prepared(prep)
    rng = np.random.default_rng(0)
    picks = rng.choice(ds.n_users, size=2000, replace=False)
    histories = [[ds.item_ids[i - 1] for i in ds.sequences[u]] for u in picks]
    index = (index_recall(run, [ds.sequences[u][:-1] for u in picks]) or {}).get(0)
    served = _serve(run, args.serve_seconds, histories)
    breadths = serve_breadths(run, args) if args.serve_breadths else None
    return {
        "users": ds.n_users,
        "items": ds.n_items,
        "interactions": int(len(ds.sequences.items)),
        "stages": stages,
        "run": _run_summary(run),
        "evaluation": {
            **evaluated,
            "seconds_per_1000_users": evaluated["seconds"] / evaluated["users"] * 1000,
        },
        "serve": served,
        "all_users": all_users,
        "index": index,
        "breadths": breadths,
    }


def ml20m(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import prepare_scale

    stages = []
    if args.data:
        src = Path(args.data)
    else:
        src = work / "ratings.csv"
        start = time.perf_counter()
        prepare_scale.make_file(src, 20_000_263, 138_493, 26_744, args.seed)
        print(f"generated {src} in {time.perf_counter() - start:.1f} s", flush=True)
    prep = work / "prepared"
    stages.append(
        _stage(
            "prepare",
            _seqrec("prepare", "--data", str(src), "--out", str(prep), "--quiet"),
            work / "prepare.log",
        )
    )
    runs = {}
    for model, config in (("bert4rec", "ml-20m-bert4rec"), ("sasrec", "ml-20m-sasrec-ce")):
        run = work / f"run-{model}"
        cmd = _train_cmd(model, config, prep, run, args.budget)
        stages.append(_stage(f"train {config}", cmd, work / f"train-{model}.log"))
        runs[config] = _run_summary(run)
    from seqrec.data.prepared import load_prepared

    ds = load_prepared(prep)
    return {
        "source": "real" if args.data else "synthetic (benchmarks/speed.py prepare-scale)",
        "users": ds.n_users,
        "items": ds.n_items,
        "interactions": int(len(ds.sequences.items)),
        "stages": stages,
        "runs": runs,
    }


def _markdown(kind: str, args: argparse.Namespace, r: dict[str, Any]) -> str:
    head = {
        "catalogue": f"# A synthetic log of {args.users:,} users over up to {args.items:,} items",
        "ml-20m": "# ML-20M scale, end to end",
    }[kind]
    rows = "".join(
        f"| {s['stage']} | {s['wall_s']:.1f} s | {s['peak_rss_gib']:.2f} GiB |\n"
        for s in r["stages"]
    )
    md = (
        f"{head}\n\n{r['users']:,} users, {r['items']:,} items, {r['interactions']:,} "
        f"interactions; training budget {args.budget}.\n\n"
        f"| stage (its own process) | wall time | peak RSS |\n|---|---|---|\n{rows}\n"
    )

    def run_line(name: str, x: dict[str, Any]) -> str:
        test = x.get("test") or {}
        cells = " / ".join(
            f"{p} {test[p]['ndcg@10']:.4f}" for p in ("full", "uni100", "pop100") if p in test
        )
        return (
            f"- {name}: {x['epochs']} epoch(s), {x['steps']:,} steps, stopped by "
            f"{x['stopped']}, {x['seq_per_s']:.0f} seq/s; the run's closing evaluation "
            f"(validation, POP's validation, test) {x['final_evaluation_s']:.0f} s; test NDCG@10 "
            f"{cells}"
            + (f" (users: {x['eval_sample_users']})" if x.get("eval_sample_users") else "")
            + "\n"
        )

    if kind == "catalogue":
        e, s = r["evaluation"], r["serve"]
        md += run_line("training (sampled softmax, 1,024 shared negatives, logQ)", r["run"])
        md += (
            f"- test split of {e['users']:,} users under full, uni100 and pop100: "
            f"{e['seconds']:.1f} s, **{e['seconds_per_1000_users']:.2f} s per 1,000 users** "
            "(the `evaluate` stage's peak RSS above)\n"
            f"- `seqrec serve` (defaults) under wrk, 8 connections, {s['wall_s']:.0f} s: "
            f"{s['requests']:,} requests, {s['errors']} errors, {s['requests_per_s']:.0f} req/s, "
            f"p50 {s['p50_ms']:.1f} ms, **p99 {s['p99_ms']:.1f} ms**, server RSS "
            f"{s['rss_end_mib']:.0f} MiB\n"
        )
        if r.get("index"):
            x = r["index"]
            md += (
                f"- the item index built at the end of training ({x['index']}): built in "
                f"{x['built']['build_seconds']:.1f} s, recall@10 against exact scoring "
                f"{x['built']['recall@10']:.4f} on {int(x['built']['histories']):,} training "
                f"histories; on {x['histories']:,} test histories **{x['recall@10']:.4f}**, "
                f"{x['index_s']:.1f} s against {x['exact_s']:.1f} s exact\n"
            )
        if r.get("all_users"):  # results from before the stage (or without it) have none
            a = next(x for x in r["stages"] if x["stage"] == "recommend --all-users")
            md += (
                f"- `seqrec recommend RUN --all-users`: the top 10 of every user, "
                f"{a['wall_s']:.0f} s ({r['users'] / a['wall_s']:,.0f} users/s), peak RSS "
                f"{a['peak_rss_gib']:.2f} GiB, {r['all_users']['rows']:,} rows in a "
                f"{r['all_users']['file_mib']:.0f} MiB Parquet file\n"
            )
    else:
        for name, x in r["runs"].items():
            md += run_line(f"`{name}`", x)
    return md


def serve_again(args: argparse.Namespace) -> None:
    """`catalogue-serve --keep DIR --serve-breadths LIST`: the breadths of `serve_breadths` on
    the run a `catalogue --keep DIR` left (trained and indexed at the commit its run records)."""
    if not (args.keep and args.serve_breadths):
        raise SystemExit("catalogue-serve: give --keep DIR (a kept catalogue) and --serve-breadths")
    from seqrec.training.rundir import RunDir

    run = Path(args.keep) / "run"
    rows = serve_breadths(run, args)
    metrics = RunDir(run).metrics() or {}
    n_items = len(RunDir(run).vocab()["items"])
    trained = {
        k: metrics.get(k) for k in ("git_commit", "machine", "seed", "steps", "train_time_s")
    }
    name = args.name or "scale_catalogue_breadths"
    lines = [
        f"# {n_items:,} items: the item index's search breadth against serving speed",
        "",
        f"The run of a kept `scale.py catalogue` folder (trained at commit "
        f"`{trained['git_commit']}`, {trained['steps']} steps); {len(rows)} "
        f"breadths; `seqrec serve` (defaults but the breadth) under wrk, 8 connections, "
        f"{args.serve_seconds:g} s each; recall@10 against exact scoring on "
        f"{rows[0]['histories']:,} test histories.",
        "",
        "| index | breadth | recall@10 | req/s | p50 ms | p99 ms | errors | server RSS MiB "
        "| batch | ms a batch | model busy | cores busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {x['index'].rsplit(',', 1)[0]} | {x['breadth'] or '—'} | {x['recall@10']:.4f} | "
            f"{x['serve']['requests_per_s']:.0f} | {x['serve']['p50_ms']:.1f} | "
            f"{x['serve']['p99_ms']:.1f} | {x['serve']['errors']} | "
            f"{x['serve']['rss_end_mib']:.0f} | {_batching_cells(x['serve'])} |"
            for x in rows
        ),
    ]
    md = "\n".join(lines) + "\n"
    md += (
        "\nbatch: the mean number of requests a micro-batch held; ms a batch: the scoring "
        "thread's time on one (the model, the index search, the exact re-scoring); model busy: "
        "that thread's share of the load's wall time; cores busy: the machine's cores' share "
        "(the server and wrk).\n"
    )
    # the settings read from the environment (SEQREC_MAX_MODEL_BYTES lets a 10^7-item model load)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SEQREC_")}
    if env:
        md += "\n- environment: " + ", ".join(f"`{k}={v}`" for k, v in env.items()) + "\n"
    paths = write_results(
        name,
        {"kind": args.kind, "rows": rows, "run_provenance": trained, "environment": env},
        md,
        seeds={"synthetic_log": args.seed, "train": 0, "candidates": 42},
    )
    print(md)
    print("wrote", *paths)


def _batching_cells(serve: dict[str, Any]) -> str:
    """The micro-batching columns of a served row (— where the load did not record them)."""
    b, cpu = serve.get("micro_batching"), serve.get("cpu_busy")
    cells = (
        [f"{b['mean_batch']:.1f}", f"{b['ms_per_batch']:.1f}", f"{100 * b['scoring_busy']:.0f} %"]
        if b
        else ["—"] * 3
    )
    return " | ".join([*cells, "—" if cpu is None else f"{100 * cpu:.0f} %"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--make-catalogue":
        return make_catalogue(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), seed=0)
    if len(sys.argv) > 1 and sys.argv[1] == "--evaluate":
        return evaluate_test(sys.argv[2], int(sys.argv[3]))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kind", choices=["catalogue", "catalogue-serve", "ml-20m"])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--eval-users", type=int, default=10_000)
    ap.add_argument("--serve-seconds", type=float, default=10.0)
    ap.add_argument("--data", help="ml-20m: the real ratings.csv instead of the synthetic one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", help="work in this folder (new) and keep it: the log, run, ...")
    ap.add_argument("--no-all-users", action="store_true", help="catalogue: skip that stage")
    ap.add_argument(
        "--serve-breadths",
        metavar="LIST",
        help="catalogue: serve again with the index searched at each of these breadths "
        "(ef, or nprobe for lists; 0: no index), e.g. 0,64,256,512",
    )
    ap.add_argument(
        "--index",
        metavar="FLAGS",
        help="catalogue: build the item index as a stage of its own, `seqrec index RUN FLAGS` "
        '(e.g. "--m 16"), instead of at the end of training',
    )
    ap.add_argument("--name")
    args = ap.parse_args()
    if args.kind == "catalogue-serve":  # the serving stages again, on a kept folder's run
        return serve_again(args)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(args.keep or tmp)
        if args.keep:
            work.mkdir(parents=True)  # a new folder: nothing of another run mixed in
        result = catalogue(args, work) if args.kind == "catalogue" else ml20m(args, work)
    name = args.name or {"catalogue": "scale_catalogue", "ml-20m": "scale_ml20m"}[args.kind]
    md = _markdown(args.kind, args, result)
    paths = write_results(
        name,
        {"kind": args.kind, "budget": args.budget, **result},
        md,
        seeds={"synthetic_log": args.seed, "train": 0, "candidates": 42},
    )
    print(md)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
