"""The item index's library and threshold, measured: faiss-cpu and usearch HNSW graphs over
catalogues of synthetic item vectors (grouped, as trained ones are: 1,000 centres plus noise,
64 numbers and a bias), against the exact scoring the recommender does without an index (one
matrix product and a top-k). For each size and library: the build time, the file size, and at
each search breadth (ef) the recall@10 of the final answer (the index's candidates re-scored
exactly, `seqrec.serving.index.candidates_wanted` of them) and the time per query, alone (what
one request costs) and 64 at once (a micro-batch).

    python benchmarks/speed.py item-index [--sizes 100000,300000,1000000] [--queries 300]
        [--efs 32,64,128] [--libraries faiss,usearch] [--name item_index]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from _common import write_results
from seqrec.serving.index import ItemIndex, candidates_wanted

DIM = 64


def _vectors(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    centres = rng.standard_normal((1000, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 1000, n)] + 0.5 * rng.standard_normal((n, DIM)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(0.3 * rng.standard_normal(n).astype(np.float32))


def _timed(fn: Any, repeats: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure(n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed)
    weight, bias = _vectors(n, rng)
    queries, _ = _vectors(args.queries, rng)
    exact = torch.topk(queries @ weight.T + bias, 10).indices + 1
    one = [queries[i : i + 1] for i in range(args.queries)]
    exact_one = _timed(lambda: [torch.topk(q @ weight.T + bias, 10) for q in one]) / args.queries
    exact_64 = _timed(lambda: torch.topk(queries[:64] @ weight.T + bias, 10)) / 64
    rows = []
    want = candidates_wanted(10, n, seen=0, excluded=0)
    for library in args.libraries.split(","):
        start = time.perf_counter()
        index = ItemIndex.build(weight, bias, library=library, m=args.m)
        build = time.perf_counter() - start
        size = len(index.to_bytes())
        for ef in (int(e) for e in args.efs.split(",")):
            index.ef_search = ef

            def answer(q: torch.Tensor, index: ItemIndex = index) -> torch.Tensor:
                found = torch.from_numpy(index.search(q, want)).clamp(min=1)
                scores = torch.einsum("bd,bkd->bk", q, weight[found - 1]) + bias[found - 1]
                return found.gather(1, scores.topk(10, dim=1).indices)

            got = answer(queries)
            hits = sum(
                len(set(g.tolist()) & set(e.tolist())) for g, e in zip(got, exact, strict=True)
            )
            per_one = _timed(lambda answer=answer: [answer(q) for q in one]) / args.queries
            per_64 = _timed(lambda answer=answer: answer(queries[:64])) / 64
            rows.append(
                {
                    "items": n,
                    "library": library,
                    "m": args.m,
                    "ef": ef,
                    "build_s": build,
                    "file_mb": size / 2**20,
                    "recall@10": hits / (10 * args.queries),
                    "ms_per_query": 1e3 * per_one,
                    "ms_per_query_in_64": 1e3 * per_64,
                    "exact_ms_per_query": 1e3 * exact_one,
                    "exact_ms_per_query_in_64": 1e3 * exact_64,
                }
            )
            r = rows[-1]
            print(
                f"{n:,} items, {library} ef {ef}: recall@10 {r['recall@10']:.4f}, "
                f"{r['ms_per_query']:.3f} ms/query (exact {r['exact_ms_per_query']:.3f}), "
                f"build {build:.1f} s",
                flush=True,
            )
        del index
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--efs", default="32,64,128")
    ap.add_argument("--libraries", default="faiss,usearch")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="item_index")
    args = ap.parse_args(argv)
    rows = [r for n in (int(s) for s in args.sizes.split(",")) for r in measure(n, args)]
    lines = [
        "# The item index: faiss and usearch against exact scoring",
        "",
        f"Synthetic item vectors ({DIM} numbers and a bias, 1,000 groups), {args.queries} "
        f"queries drawn the same way; HNSW m {args.m}, ef construction 200. Recall@10 of the "
        "final answer (the candidates re-scored exactly) against exact scoring; milliseconds per "
        "query alone and within a batch of 64; torch threads: "
        f"{torch.get_num_threads()}.",
        "",
        "| items | library | ef | build s | file MB | recall@10 | ms/query | ms/query (64) | "
        "exact ms/query | exact ms/query (64) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['items']:,} | {r['library']} | {r['ef']} | {r['build_s']:.1f} | "
            f"{r['file_mb']:.0f} | {r['recall@10']:.4f} | {r['ms_per_query']:.3f} | "
            f"{r['ms_per_query_in_64']:.3f} | {r['exact_ms_per_query']:.3f} | "
            f"{r['exact_ms_per_query_in_64']:.3f} |"
            for r in rows
        ),
    ]
    _, md = write_results(
        args.name,
        {"rows": rows, "dim": DIM, "queries": args.queries, "m": args.m},
        "\n".join(lines) + "\n",
        seeds={"vectors": args.seed},
        area="performance",
    )
    print("\n".join(lines), f"-> {md}", sep="\n")


if __name__ == "__main__":
    main()
