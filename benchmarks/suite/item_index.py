"""The item index's kind, library and threshold, measured: faiss-cpu and usearch HNSW graphs and
faiss IVF lists over item vectors, against the exact scoring the recommender does without an
index (one matrix product and a top-k). For each catalogue and index: the build time, the file
size, and at each search breadth (ef for a graph, nprobe for lists) the recall@10 of the final
answer (the index's candidates re-scored exactly, `seqrec.serving.index.candidates_wanted` of
them) and the time per query, alone (what one request costs) and 64 at once (a micro-batch).

The vectors are synthetic (grouped: 1,000 centres plus noise, 64 numbers and a bias; queries
drawn the same way), one catalogue per `--sizes`, or with `--run` a trained run's own output
vectors, queried with the model's vectors of its users' histories (each user's sequence but
its last item, a seeded sample).

    python benchmarks/speed.py item-index [--sizes 100000,300000,1000000] [--queries 300]
        [--indexes faiss-hnsw,usearch-hnsw,faiss-ivf] [--efs 64,128,256] [--nprobes 16,64,256]
        [--run RUN] [--name item_index]
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


def _trained(run: str, queries: int, seed: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """A run's output vectors (weight, bias) and the query vectors of `queries` of its users."""
    from seqrec.serving.index import csr
    from seqrec.serving.recommender import Recommender

    rec = Recommender.from_run(run, exact=True)
    assert rec.dataset is not None, f"{run}: its prepared data is gone"
    seqs = rec.dataset.sequences
    users = np.random.default_rng(seed).choice(seqs.n_users, queries, replace=False)
    items, starts, ends = csr(
        [seqs.items[seqs.offsets[u] : seqs.offsets[u + 1] - 1] for u in users]
    )
    with torch.no_grad():
        inputs = rec._inputs(items, starts, ends)
        q = rec.model.output_features(rec.model.user_vector(inputs, None)).float()
        weight, bias = rec.model.output_weights()
    return weight.detach().float(), None if bias is None else bias.detach().float(), q


def _timed(fn: Any, repeats: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure(
    weight: torch.Tensor, bias: torch.Tensor | None, queries: torch.Tensor, args: argparse.Namespace
) -> list[dict[str, Any]]:
    n, b = weight.shape[0], 0 if bias is None else bias
    exact = torch.topk(queries @ weight.T + b, 10).indices + 1
    one = [queries[i : i + 1] for i in range(len(queries))]
    exact_one = _timed(lambda: [torch.topk(q @ weight.T + b, 10) for q in one]) / len(one)
    exact_64 = _timed(lambda: torch.topk(queries[:64] @ weight.T + b, 10)) / 64
    rows = []
    want = candidates_wanted(10, n, seen=0, excluded=0)
    for spec in args.indexes.split(","):
        library, kind = spec.split("-")
        start = time.perf_counter()
        index = ItemIndex.build(weight, bias, library=library, kind=kind, m=args.m)
        build = time.perf_counter() - start
        size = len(index.to_bytes())
        breadths = args.nprobes if kind == "ivf" else args.efs
        for breadth in (int(e) for e in breadths.split(",")):
            setattr(index, "nprobe" if kind == "ivf" else "ef_search", breadth)

            def answer(q: torch.Tensor, index: ItemIndex = index) -> torch.Tensor:
                found = torch.from_numpy(index.search(q, want)).clamp(min=1)
                scores = torch.einsum("bd,bkd->bk", q, weight[found - 1])
                if bias is not None:
                    scores = scores + bias[found - 1]
                return found.gather(1, scores.topk(10, dim=1).indices)

            got = answer(queries)
            hits = sum(
                len(set(g.tolist()) & set(e.tolist())) for g, e in zip(got, exact, strict=True)
            )
            per_one = _timed(lambda answer=answer: [answer(q) for q in one]) / len(one)
            per_64 = _timed(lambda answer=answer: answer(queries[:64])) / 64
            rows.append(
                {
                    "items": n,
                    "library": library,
                    "kind": kind,
                    "m": args.m,
                    "nlist": index.nlist,
                    "breadth": breadth,
                    "build_s": build,
                    "file_mb": size / 2**20,
                    "recall@10": hits / (10 * len(queries)),
                    "ms_per_query": 1e3 * per_one,
                    "ms_per_query_in_64": 1e3 * per_64,
                    "exact_ms_per_query": 1e3 * exact_one,
                    "exact_ms_per_query_in_64": 1e3 * exact_64,
                }
            )
            r = rows[-1]
            print(
                f"{n:,} items, {spec} {breadth}: recall@10 {r['recall@10']:.4f}, "
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
    ap.add_argument("--indexes", default="faiss-hnsw,usearch-hnsw,faiss-ivf")
    ap.add_argument("--efs", default="64,128,256")
    ap.add_argument("--nprobes", default="16,64,256")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--run", help="a trained run's vectors and histories instead of synthetic ones")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="item_index")
    args = ap.parse_args(argv)
    if args.run:
        rows = measure(*_trained(args.run, args.queries, args.seed), args)
        what = (
            f"The output vectors of the run `{args.run}` ({rows[0]['items']:,} items), queried "
            f"with the model's vectors of {args.queries} of its users' histories (a seeded sample)"
        )
    else:
        rng = np.random.default_rng(args.seed)
        rows = []
        for n in (int(s) for s in args.sizes.split(",")):
            weight, bias = _vectors(n, rng)
            rows += measure(weight, bias, _vectors(args.queries, rng)[0], args)
        what = (
            f"Synthetic item vectors ({DIM} numbers and a bias, 1,000 groups), {args.queries} "
            "queries drawn the same way"
        )
    lines = [
        "# The item index: graphs and lists against exact scoring",
        "",
        f"{what}; HNSW m {args.m}, ef construction 200; IVF lists about 4 sqrt(items). "
        "Recall@10 of the final answer (the candidates re-scored exactly) against exact "
        "scoring; milliseconds per query alone and within a batch of 64; torch threads: "
        f"{torch.get_num_threads()}.",
        "",
        "| items | index | breadth | build s | file MB | recall@10 | ms/query | ms/query (64) | "
        "exact ms/query | exact ms/query (64) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['items']:,} | {r['library']} {r['kind']} | "
            f"{'nprobe' if r['kind'] == 'ivf' else 'ef'} {r['breadth']} | {r['build_s']:.1f} | "
            f"{r['file_mb']:.0f} | {r['recall@10']:.4f} | {r['ms_per_query']:.3f} | "
            f"{r['ms_per_query_in_64']:.3f} | {r['exact_ms_per_query']:.3f} | "
            f"{r['exact_ms_per_query_in_64']:.3f} |"
            for r in rows
        ),
    ]
    _, md = write_results(
        args.name,
        {"rows": rows, "dim": DIM, "queries": args.queries, "m": args.m, "run": args.run},
        "\n".join(lines) + "\n",
        seeds={"vectors": args.seed},
        area="performance",
    )
    print("\n".join(lines), f"-> {md}", sep="\n")


if __name__ == "__main__":
    main()
