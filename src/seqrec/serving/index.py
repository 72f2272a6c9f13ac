"""Approximate top-k over a large catalogue: an index of the model's output item vectors (the
optional `seqrec[ann]`), asked for more candidates than k, which are then scored exactly by the
model and cut after the seen and excluded items are removed. Two kinds:

- "hnsw" (faiss, the default, or usearch): a navigable small-world graph, searched by inner
  product `ef_search` wide.
- "ivf" (faiss): the vectors grouped into `nlist` lists by k-means; a query scores the list
  centres and then every vector of its `nprobe` best lists (when built, `nprobe` is chosen as
  the fewest lists that reach a recall target on a sample of histories). The largest inner
  product is made a nearest neighbour first (each vector x gets one more number,
  sqrt(M^2 - |x|^2) with M the largest |x|, the query a 0) so that k-means groups by distance.
  It builds in seconds where a graph takes minutes; which of the two finds more at a given
  speed depends on the vectors (`python benchmarks/speed.py item-index --run RUN` measures a
  run's own; docs/scaling.md, "Large catalogues").

A model whose score is a dot product with its output layer (`SequenceModel.blockwise`: score =
f(history) . w_i + b_i) is searched by inner product over [w_i, b_i] with the query [f, 1], so
the item bias is part of the search. The index is a run file (`index.bin`, its digest in the
manifest like every run file) that records the digest of the weights it was built from: an
index of other weights (a retrained or grown model) is not used, and `seqrec index RUN`
rebuilds it. What the search misses is measured when it is built: recall@k of the index's
answers against exact scoring on a sample of histories.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from seqrec.errors import ConfigError, RunError
from seqrec.training.sizes import MAX_INDEX_LINKS

__all__ = [
    "INDEX_MIN_ITEMS",
    "KINDS",
    "MAX_BREADTH",
    "MAX_LINKS",
    "MAX_LISTS",
    "LIBRARIES",
    "ItemIndex",
    "approximate_top",
    "candidates_wanted",
    "csr",
    "masked_top",
    "run_index",
    "weights_digest",
]

LIBRARIES = ("faiss", "usearch")
KINDS = ("hnsw", "ivf")
# a finished training builds an index at and above this many items (below it exact scoring is
# as fast: docs/scaling.md, "Large catalogues")
INDEX_MIN_ITEMS = 200_000
_MAGIC = b"SEQREC-INDEX-1\n"

# The bounds of an index's settings (`seqrec index`'s options have the same: seqrec.cli.numbers)
# and of what one holds; a header past them is damage, refused before the libraries see it.
MAX_LINKS = MAX_INDEX_LINKS  # hnsw: links per node
MAX_BREADTH = 65536  # hnsw: ef_construction, ef_search
MAX_LISTS = 1 << 20  # ivf: nlist, nprobe
MAX_INDEX_ITEMS = 1 << 31
MAX_INDEX_DIM = 65538  # a model's width (65,536 at most) with the bias and the ivf coordinate


def _faiss_kind(faiss: Any, handle: Any) -> str:
    """ "hnsw" or "ivf": what kind of faiss index `handle` is (anything else: "")."""
    inner = faiss.downcast_index(handle.index) if isinstance(handle, faiss.IndexIDMap) else handle
    if isinstance(inner, faiss.IndexHNSW):
        return "hnsw"
    return "ivf" if isinstance(inner, faiss.IndexIVF) else ""


def weights_digest(weight: torch.Tensor, bias: torch.Tensor | None) -> str:
    """The sha256 of the output vectors an index is built from (what makes it stale)."""
    h = hashlib.sha256()
    h.update(weight.detach().float().cpu().contiguous().numpy().data)  # no copy of the table
    if bias is not None:
        h.update(bias.detach().float().cpu().contiguous().numpy().data)
    return h.hexdigest()


def default_nlist(n_items: int) -> int:
    """The IVF lists of a catalogue of `n_items`: about 4 sqrt(n), at most n / 39 (faiss's
    k-means wants 39 training vectors a list)."""
    return max(1, min(int(4 * n_items**0.5), n_items // 39))


def _vectors(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rows: slice | torch.Tensor,
    max_norm2: float | None = None,
) -> np.ndarray:
    """(r, D + 1) float32 rows [w_i, b_i] of `rows` (b = 0 without a bias); with `max_norm2`,
    (r, D + 2) rows [w_i, b_i, sqrt(max_norm2 - |w_i, b_i|^2)]."""
    w = weight[rows].detach().float().cpu()
    b = bias[rows].detach().float().cpu() if bias is not None else torch.zeros(w.shape[0])
    x = torch.cat([w, b[:, None]], dim=1)
    if max_norm2 is not None:
        x = torch.cat([x, (max_norm2 - x.square().sum(1)).clamp(min=0).sqrt()[:, None]], dim=1)
    return np.ascontiguousarray(x.numpy())


def _max_norm2(weight: torch.Tensor, bias: torch.Tensor | None) -> float:
    """The largest |w_i, b_i|^2, a chunk of rows at a time."""
    return max(
        float(np.square(_vectors(weight, bias, slice(s, s + _CHUNK))).sum(1).max())
        for s in range(0, weight.shape[0], _CHUNK)
    )


_CHUNK = 1 << 18  # rows added to an index at a time (no whole-table copy)


def _library(name: str) -> Any:
    if name not in LIBRARIES:
        raise ConfigError(f"index library {name!r}; expected one of {', '.join(LIBRARIES)}")
    try:
        if name == "faiss":
            import faiss

            return faiss
        import usearch.index

        return usearch.index
    except ImportError:
        package = "faiss-cpu" if name == "faiss" else "usearch"
        raise ConfigError(
            f"an item index with {name} needs the {package} package (pip install 'seqrec[ann]')"
        ) from None


@dataclass
class ItemIndex:
    """An index of a run's output item vectors; labels are internal item ids (1..n)."""

    library: str
    n_items: int
    dim: int
    digest: str  # weights_digest of the vectors it holds
    m: int = 32  # hnsw: links per node
    ef_construction: int = 200  # hnsw
    ef_search: int = 256  # hnsw
    recall: dict[str, float] = field(default_factory=dict)  # measured at build
    kind: str = "hnsw"  # headers written before "ivf" existed hold a graph
    nlist: int = 0  # ivf: lists
    nprobe: int = 0  # ivf: lists searched
    handle: Any = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        library: str = "faiss",
        kind: str = "hnsw",
        m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 256,
        nlist: int | None = None,
        nprobe: int = 32,
        seed: int = 0,
    ) -> ItemIndex:
        """The index of `weight` (n, D) and `bias` (n,), rows for items 1..n (`nlist` None:
        `default_nlist`; the k-means of "ivf" trains on a `seed`ed sample of 64 vectors a list)."""
        if kind not in KINDS:
            raise ConfigError(f"index kind {kind!r}: expected one of {', '.join(KINDS)}")
        if kind == "ivf" and library != "faiss":
            raise ConfigError(f"an ivf index is faiss's; {library} builds hnsw")
        lib = _library(library)
        n, dim = weight.shape[0], weight.shape[1] + (2 if kind == "ivf" else 1)
        index = cls(library, n, dim, weights_digest(weight, bias), m, ef_construction, ef_search)
        index.kind = kind
        top = _max_norm2(weight, bias) if kind == "ivf" else None
        if kind == "ivf":
            index.nlist = min(nlist or default_nlist(n), n)
            index.nprobe = min(nprobe, index.nlist)
            picked = np.random.default_rng(seed).choice(n, min(n, 64 * index.nlist), replace=False)
            index.handle = lib.IndexIVFFlat(lib.IndexFlatL2(dim), dim, index.nlist, lib.METRIC_L2)
            index.handle.cp.seed = seed
            index.handle.train(_vectors(weight, bias, torch.from_numpy(np.sort(picked)), top))
        elif library == "faiss":
            inner = lib.IndexHNSWFlat(dim, m, lib.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = ef_construction
            index.handle = lib.IndexIDMap(inner)
        else:
            index.handle = lib.Index(
                ndim=dim, metric="ip", dtype="f32", connectivity=m, expansion_add=ef_construction
            )
        for start in range(0, n, _CHUNK):
            x = _vectors(weight, bias, slice(start, start + _CHUNK), top)
            labels = np.arange(start + 1, start + 1 + len(x), dtype=np.int64)
            if library == "faiss":
                index.handle.add_with_ids(x, labels)
            else:
                index.handle.add(labels, x)
        return index

    def set_breadth(self, breadth: int) -> None:
        """Search `breadth` wide: ef_search for a graph, nprobe (at most every list) for lists."""
        if breadth < 1:
            raise ConfigError(f"a search breadth is >= 1, got {breadth}")
        if self.kind == "ivf":
            self.nprobe = min(breadth, self.nlist)
        else:
            self.ef_search = breadth

    def describe(self) -> str:
        """What it is, in a few words (the CLI's lines)."""
        if self.kind == "ivf":
            return f"{self.library} ivf, {self.nlist:,} lists, {self.nprobe} searched"
        return f"{self.library} hnsw, m {self.m}, ef {self.ef_construction}/{self.ef_search}"

    def search(self, queries: torch.Tensor, k: int) -> np.ndarray:
        """(B, k') internal item ids of the `k` best candidates of each query (B, D) by inner
        product, k' = min(k, n); -1 where the index found fewer."""
        k = min(k, self.n_items)
        ones = torch.ones(queries.shape[0], 1)
        extra = [ones, torch.zeros_like(ones)] if self.kind == "ivf" else [ones]  # see above
        q = torch.cat([queries.detach().float().cpu(), *extra], dim=1)
        q_np = np.ascontiguousarray(q.numpy())
        if self.library == "faiss":
            faiss = _library("faiss")
            params = (
                faiss.SearchParametersIVF(nprobe=self.nprobe)
                if self.kind == "ivf"
                else faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k))
            )
            _, ids = self.handle.search(q_np, k, params=params)
            return np.asarray(ids, dtype=np.int64)
        self.handle.expansion_search = max(self.ef_search, k)
        found = self.handle.search(q_np, k)
        ids = np.asarray(found.keys, dtype=np.int64).reshape(len(q_np), -1)
        # one query: its matches, as many as found; several: a matrix and a count per row
        counts = np.asarray(getattr(found, "counts", [ids.shape[1]])).reshape(-1)
        ids[np.arange(ids.shape[1])[None, :] >= counts[:, None]] = -1
        if ids.shape[1] < k:
            ids = np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)
        return ids

    # ------------------------------------------------------------------------------- files

    def to_bytes(self) -> bytes:
        """The run file: a header line of JSON (what it is, what it was built from), then the
        library's own serialisation."""
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "handle"}
        if self.library == "faiss":
            payload = _library("faiss").serialize_index(self.handle).tobytes()
        else:
            payload = bytes(self.handle.save())
        return _MAGIC + json.dumps(meta).encode() + b"\n" + payload

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray,
        where: str,
        *,
        n_items: int | None = None,
        dim: int | None = None,
    ) -> ItemIndex:
        """An index from `to_bytes`' bytes; one RunError line when they are not one, or when
        its header is out of bounds or (where given) not of a catalogue of `n_items` vectors
        of `dim` floats."""
        if not data.startswith(_MAGIC):
            raise RunError(f"{where}: not an item index")
        # the payload read where it lies (a slice of gigabytes would be a copy of them)
        end = data.find(b"\n", len(_MAGIC))
        end = len(data) if end < 0 else end
        head, payload = data[len(_MAGIC) : end], memoryview(data)[end + 1 :]
        try:
            meta = json.loads(head)
            index = cls(
                str(meta["library"]),
                int(meta["n_items"]),
                int(meta["dim"]),
                str(meta["digest"]),
                int(meta["m"]),
                int(meta["ef_construction"]),
                int(meta["ef_search"]),
                dict(meta["recall"]),
                str(meta.get("kind", "hnsw")),
                int(meta.get("nlist", 0)),
                int(meta.get("nprobe", 0)),
            )
        except (ValueError, KeyError, TypeError):
            raise RunError(f"{where}: damaged (its header)") from None
        wrong = index.header_fault(n_items, dim)
        if wrong:  # before the payload reaches a library: its sizes allocate
            raise RunError(f"{where}: damaged (its header: {wrong})")
        lib = _library(index.library)
        try:
            if index.library == "faiss":
                index.handle = lib.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
            else:
                index.handle = lib.Index.restore(bytes(payload), view=False)
        except Exception as err:  # the libraries raise their own types for a damaged payload
            raise RunError(f"{where}: damaged ({type(err).__name__})") from None
        held = index.handle.ntotal if index.library == "faiss" else len(index.handle)
        if held != index.n_items:
            raise RunError(f"{where}: damaged (it holds another number of items)")
        if index.library == "faiss" and index.kind != _faiss_kind(lib, index.handle):
            raise RunError(f"{where}: damaged (its header names another kind of index)")
        width = index.handle.d if index.library == "faiss" else index.handle.ndim
        if width != index.dim:
            raise RunError(f"{where}: damaged (its vectors are not of the header's width)")
        return index

    def header_fault(self, n_items: int | None = None, dim: int | None = None) -> str:
        """What is wrong with the header's values ("" when nothing): each field within the
        bounds an index is built with (`seqrec index`'s options), the catalogue's size and the
        vectors' width where known."""
        checks = [
            (self.library in LIBRARIES, f"library {self.library!r}"),
            (self.kind in KINDS, f"kind {self.kind!r}"),
            (self.kind == "hnsw" or self.library == "faiss", "an ivf index is faiss's"),
            (1 <= self.n_items <= MAX_INDEX_ITEMS, f"n_items {self.n_items}"),
            (n_items is None or self.n_items == n_items, f"{self.n_items} items, not {n_items}"),
            (1 <= self.dim <= MAX_INDEX_DIM, f"dim {self.dim}"),
            (dim is None or self.dim == dim, f"dim {self.dim}, not {dim}"),
            (1 <= self.m <= MAX_LINKS, f"m {self.m}"),
            (1 <= self.ef_construction <= MAX_BREADTH, f"ef_construction {self.ef_construction}"),
            (1 <= self.ef_search <= MAX_BREADTH, f"ef_search {self.ef_search}"),
            (0 <= self.nlist <= min(MAX_LISTS, self.n_items), f"nlist {self.nlist}"),
            (0 <= self.nprobe <= max(self.nlist, 0), f"nprobe {self.nprobe}"),
            (self.kind == "hnsw" or self.nlist >= 1 <= self.nprobe, "an ivf index without lists"),
        ]
        return next((what for ok, what in checks if not ok), "")


def candidates_wanted(k: int, n_items: int, seen: int, excluded: int, oversample: int = 2) -> int:
    """How many candidates to ask the index for so that `k` remain after a history's `seen`
    items and the `excluded` ones are removed, with `oversample` x k for what the graph search
    misses (re-scored exactly: more candidates only cost their dot products)."""
    return min(n_items, oversample * k + seen + excluded)


def approximate_top(
    index: ItemIndex,
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    seen: torch.Tensor | None,
    allowed: torch.Tensor | None,
    excluded: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, internal ids), each (B, k), of the best items for the query vectors `features`
    (B, D): the index's candidates scored exactly (f . w_i + b_i, as `SequenceModel.score`),
    the `seen` ids (B, H) and the items not `allowed` (a mask over the catalogue, `excluded` of
    them off) set to -inf, then cut. A row with fewer than k finite values ran out of
    candidates (the caller scores it exactly)."""
    seen_width = 0 if seen is None else int(seen.shape[1])
    want = candidates_wanted(k, index.n_items, seen_width, excluded)
    found = torch.from_numpy(index.search(features, want)).to(features.device)  # (B, want)
    rows = found.clamp(min=1) - 1  # row i - 1 of the output layer is item i
    scores = torch.einsum("bd,bkd->bk", features.float(), weight[rows].float())
    if bias is not None:
        scores = scores + bias.float()[rows]
    off = found <= 0
    if seen is not None:  # each candidate looked up in its row's sorted history
        ordered = seen.sort(dim=1).values
        at = torch.searchsorted(ordered, found).clamp(max=ordered.shape[1] - 1)
        off |= ordered.gather(1, at) == found
    if allowed is not None:
        off |= ~allowed[found.clamp(min=0)]
    scores[off] = -torch.inf
    values, at = scores.topk(min(k, scores.shape[1]), dim=1)
    return values, found.gather(1, at)


def run_index(
    path: Any, weight: torch.Tensor, bias: torch.Tensor | None, *, trust: bool = False
) -> ItemIndex | None:
    """The run's index (index.bin, verified like every run file) when it holds these output
    vectors; None when the run has none, or (said on stderr) when it was built from other
    weights (items added or a retrained model since) or is damaged (its digest, its size, its
    header): every item is then scored; `seqrec index RUN` rebuilds it."""
    import sys

    from seqrec.training.rundir import RunDir

    try:
        data = RunDir(path, trust=trust).read_file("index.bin")
        if data is None:
            return None
        index = ItemIndex.from_bytes(data, f"{path}/index.bin", n_items=int(weight.shape[0]))
    except RunError as err:  # the index only speeds the run up: it still serves, exactly
        print(f"{err}; scoring exactly (seqrec index RUN builds it again)", file=sys.stderr)
        return None
    if index.digest != weights_digest(weight, bias):
        print(
            f"{path}/index.bin: built from other weights than the run's (items added since?); "
            "scoring exactly (seqrec index RUN rebuilds it)",
            file=sys.stderr,
        )
        return None
    return index


def masked_top(
    scores: torch.Tensor,
    first: int,
    k: int,
    seen: torch.Tensor | None,
    allowed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, item ids) of the top min(k, c) of `scores`, (B, c) columns first..first + c - 1
    of the catalogue's, after setting (in place) the `seen` ids (B, H) and the items not
    `allowed` (a mask over the whole catalogue) to -inf."""
    c = scores.shape[1]
    if seen is not None:  # in place
        local = seen - first
        inside = (local >= 0) & (local < c)
        row = torch.arange(scores.shape[0], device=scores.device)[:, None].expand_as(local)
        scores[row[inside], local[inside]] = -torch.inf
    if allowed is not None:
        scores[:, ~allowed[first : first + c]] = -torch.inf
    values, at = torch.topk(scores, min(k, c), dim=1)
    return values, at + first


def csr(histories: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenated items and each history's (start, end) in them."""
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    ends = np.cumsum(lengths)
    parts = [np.asarray(h, dtype=np.int64) for h in histories]
    items = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return items, ends - lengths, ends
