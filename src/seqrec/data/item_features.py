"""Item features as numbers a model reads: an `ItemEncoder` fitted on an items table
(seqrec.data.items_table) turns each item's row into `ItemFeatures`, row r for internal item r.

What the encoder learns from the table, and keeps, so that an item added later (a cold item) is
encoded exactly as the catalogue was:
    category / categories   the values seen, each a code 1..C (0: none, or a value not seen)
    number                  the mean and standard deviation of the values present; a missing
                            value is 0 with its missing flag set
    vector                  its length
    text                    hashed word and character-trigram counts (no vocabulary to
                            download), TF-IDF weighted, projected on the top `text_dim` singular
                            vectors of the catalogue's matrix (latent semantic analysis), each
                            row then of unit length; or a named sentence-embedding model's
                            vectors (`items.text_encoder`, seqrec.data.text_models)

`ItemFeatures.codes` holds one (rows, slots) matrix of codes per categorical feature (a
multi-valued one uses several slots, 0-padded); `dense` one (rows, width) matrix of every number,
missing flag, vector and text vector side by side. Row 0 (padding) is all zeros.
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from seqrec.data.items_table import Feature
from seqrec.data.text_models import SentenceEncoder, check_text_encoder
from seqrec.errors import DataError

__all__ = [
    "ItemEncoder",
    "ItemFeatures",
    "TextEncoder",
    "items_file_bytes",
    "load_items_file",
]

_HASH_BITS = 20  # hashed n-gram buckets: 2^20, few collisions for a catalogue's titles
_TOKEN = re.compile(r"\w+")
# the dense SVD below this many matrix entries; scipy's iterative one above
_DENSE_SVD = 4_000_000


@dataclass
class ItemFeatures:
    """Encoded features of rows 0..n (row r = internal item r; row 0 zeros)."""

    codes: tuple[np.ndarray, ...]  # per categorical feature: (n_rows, slots) int64, 0 = none
    sizes: tuple[int, ...]  # per categorical feature: its codes are 1..size
    dense: np.ndarray  # (n_rows, width) float32

    @property
    def n_rows(self) -> int:
        return int(self.dense.shape[0])

    @property
    def width(self) -> int:
        return int(self.dense.shape[1])

    def append(self, other: ItemFeatures) -> ItemFeatures:
        """These rows followed by `other`'s rows 1.. (its padding row dropped)."""
        codes = []
        for a, b in zip(self.codes, other.codes, strict=True):
            slots = max(a.shape[1], b.shape[1])
            codes.append(np.concatenate([_pad(a, slots), _pad(b[1:], slots)]))
        return ItemFeatures(tuple(codes), self.sizes, np.concatenate([self.dense, other.dense[1:]]))


def _pad(codes: np.ndarray, slots: int) -> np.ndarray:
    return np.pad(codes, ((0, 0), (0, slots - codes.shape[1])))


@dataclass
class TextEncoder:
    """Hashed n-grams -> TF-IDF -> the catalogue's top singular vectors."""

    buckets: np.ndarray  # (U,) int64, sorted: the hashed n-grams seen in the catalogue
    idf: np.ndarray  # (U,) float32
    components: np.ndarray  # (k, U) float32

    @staticmethod
    def counts(texts: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, bucket, count) triples of the texts' hashed words and character trigrams."""
        rows: list[int] = []
        cols: list[int] = []
        for r, text in enumerate(texts):
            for word in _TOKEN.findall((text or "").lower()):
                padded = f" {word} "
                grams = [word] + ["#" + padded[i : i + 3] for i in range(len(padded) - 2)]
                for g in grams:
                    rows.append(r)
                    cols.append(zlib.crc32(g.encode()) & ((1 << _HASH_BITS) - 1))
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        pairs = np.unique(np.stack([rows, cols]), axis=1, return_counts=True)
        return pairs[0][0], pairs[0][1], pairs[1].astype(np.float64)

    @classmethod
    def fit(cls, texts: Sequence[str | None], dim: int) -> TextEncoder:
        rows, cols, counts = cls.counts(texts)
        buckets, col = np.unique(cols, return_inverse=True)
        n, u = len(texts), len(buckets)
        df = np.bincount(col, minlength=u)
        idf = (np.log((1 + n) / (1 + df)) + 1).astype(np.float32)
        x = _tfidf(rows, col, counts, idf, n, u)
        k = min(dim, n - 1, u - 1)
        if k < 1:
            return cls(buckets.astype(np.int64), idf, np.zeros((0, u), np.float32))
        if n * u <= _DENSE_SVD:
            _, _, vt = np.linalg.svd(x.toarray(), full_matrices=False)
            vt = vt[:k]
        else:
            from scipy.sparse.linalg import svds

            v0 = np.full(min(n, u), 1 / np.sqrt(min(n, u)))  # a fixed start: the same answer
            _, s, vt = svds(x, k=k, v0=v0)
            vt = vt[np.argsort(-s)]
        # a singular vector's sign is arbitrary: its largest entry is made positive
        signs = np.sign(vt[np.arange(k), np.abs(vt).argmax(axis=1)])
        return cls(buckets.astype(np.int64), idf, (vt * signs[:, None]).astype(np.float32))

    @property
    def dim(self) -> int:
        return int(self.components.shape[0])

    def transform(self, texts: Sequence[str | None]) -> np.ndarray:
        """(n, dim) unit-length vectors (zeros for a text with no n-gram of the catalogue)."""
        rows, cols, counts = self.counts(texts)
        pos = np.searchsorted(self.buckets, cols)
        known = (pos < len(self.buckets)) & (
            self.buckets[np.minimum(pos, len(self.buckets) - 1)] == cols
        )
        x = _tfidf(rows[known], pos[known], counts[known], self.idf, len(texts), len(self.buckets))
        out = np.asarray(x @ self.components.T, dtype=np.float32)
        norm = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norm, out=np.zeros_like(out), where=norm > 0)


def _tfidf(
    rows: np.ndarray, cols: np.ndarray, counts: np.ndarray, idf: np.ndarray, n: int, u: int
) -> Any:
    from scipy.sparse import csr_matrix

    values = (1 + np.log(counts)) * idf[cols] if len(cols) else counts
    x = csr_matrix((values, (rows, cols)), shape=(n, u))
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    norms[norms == 0] = 1
    return csr_matrix(x.multiply(1 / norms[:, None]))


@dataclass
class ItemEncoder:
    """What turns an items table's rows into `ItemFeatures` (fitted once, on the catalogue)."""

    features: tuple[Feature, ...]
    separator: str = "|"
    categories: dict[str, list[str]] = field(default_factory=dict)
    numbers: dict[str, tuple[float, float]] = field(default_factory=dict)
    vectors: dict[str, int] = field(default_factory=dict)
    text: dict[str, TextEncoder | SentenceEncoder] = field(default_factory=dict)

    @classmethod
    def fit(
        cls,
        table: pl.DataFrame,
        features: Sequence[Feature],
        *,
        separator: str = "|",
        text_dim: int = 32,
        text_encoder: str = "hashed",
    ) -> ItemEncoder:
        """Fitted on `table`'s `features`; a text feature's vectors from `text_encoder`: "hashed"
        (built in, fitted here) or "sentence-transformers:MODEL" (seqrec.data.text_models)."""
        model = check_text_encoder(text_encoder)
        enc = cls(tuple(features), separator)
        for f in features:
            col = table.get_column(f.name)
            if f.kind in ("category", "categories"):
                values = {v for row in enc._values(col, f.kind) for v in row}
                enc.categories[f.name] = sorted(values)
            elif f.kind == "number":
                x = col.cast(pl.Float64, strict=False).drop_nulls().drop_nans()
                mean = float(x.mean()) if x.len() else 0.0  # type: ignore[arg-type]
                std = float(x.std(ddof=0)) if x.len() else 0.0  # type: ignore[arg-type]
                enc.numbers[f.name] = (mean, std if std > 0 else 1.0)
            elif f.kind == "vector":
                enc.vectors[f.name] = int(len(col[0]))
            elif model is not None:
                enc.text[f.name] = SentenceEncoder.fit(model)
            else:
                enc.text[f.name] = TextEncoder.fit(_texts(col), text_dim)
        return enc

    def _values(self, col: pl.Series, kind: str) -> list[list[str]]:
        """Each row's category values as text (none for a missing value)."""
        if isinstance(col.dtype, pl.List | pl.Array):
            return [[str(v) for v in (row or []) if v is not None] for row in col.to_list()]
        texts = col.cast(pl.String).to_list()
        if kind == "category":
            return [[t.strip()] if t is not None and t.strip() else [] for t in texts]
        return [
            [v.strip() for v in t.split(self.separator) if v.strip()] if t is not None else []
            for t in texts
        ]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(
            len(self.categories[f.name]) for f in self.features if f.name in self.categories
        )

    @property
    def width(self) -> int:
        """Columns of the dense matrix."""
        return (
            2 * len(self.numbers)
            + sum(self.vectors.values())
            + sum(t.dim for t in self.text.values())
        )

    def describe(self) -> str:
        """ "genres: categories (18 values), year: number, title: text (32 dims)"."""
        parts = []
        for f in self.features:
            extra = ""
            if f.name in self.categories:
                extra = f" ({len(self.categories[f.name])} values)"
            elif f.name in self.vectors:
                extra = f" ({self.vectors[f.name]} numbers)"
            elif f.name in self.text:
                t = self.text[f.name]
                model = f", {t.model}" if isinstance(t, SentenceEncoder) else ""
                extra = f" ({t.dim} dims{model})"
            parts.append(f"{f.name}: {f.kind}{extra}")
        return ", ".join(parts)

    def encode(
        self, table: pl.DataFrame, items: Sequence[Any], where: str = "items table"
    ) -> ItemFeatures:
        """The features of `items` (external ids, in order) as rows 1..n, row 0 zeros; every item
        must have a row of `table` (one DataError line counts and names those that have none)."""
        rows = _rows_of(table, items, where)
        sub = table[rows]
        codes: list[np.ndarray] = []
        dense: list[np.ndarray] = []
        for f in self.features:
            col = sub.get_column(f.name)
            if f.name in self.categories:
                index = {v: k for k, v in enumerate(self.categories[f.name], start=1)}
                values = [
                    [index[v] for v in row if v in index] for row in self._values(col, f.kind)
                ]
                slots = max([1, *(len(v) for v in values)])
                m = np.zeros((len(items) + 1, slots), np.int64)
                for r, v in enumerate(values, start=1):
                    m[r, : len(v)] = v
                codes.append(m)
            elif f.name in self.numbers:
                mean, std = self.numbers[f.name]
                x = col.cast(pl.Float64, strict=False).fill_nan(None).to_numpy()
                missing = np.isnan(x)
                z = np.where(missing, 0.0, (np.nan_to_num(x) - mean) / std)
                dense.append(_rows0(np.stack([z, missing.astype(np.float64)], axis=1)))
            elif f.name in self.vectors:
                vec = np.asarray(col.to_list(), dtype=np.float64).reshape(len(items), -1)
                if vec.shape[1] != self.vectors[f.name]:
                    raise DataError(
                        f"{where}: {f.name} has {vec.shape[1]} numbers, the catalogue's items "
                        f"{self.vectors[f.name]}"
                    )
                dense.append(_rows0(vec))
            else:
                dense.append(_rows0(self.text[f.name].transform(_texts(col))))
        matrix = np.concatenate(dense, axis=1) if dense else np.zeros((len(items) + 1, 0))
        return ItemFeatures(tuple(codes), self.sizes, matrix.astype(np.float32))

    def to_json(self) -> dict[str, Any]:
        return {
            "features": [[f.name, f.kind] for f in self.features],
            "separator": self.separator,
            "categories": self.categories,
            "numbers": {k: list(v) for k, v in self.numbers.items()},
            "vectors": self.vectors,
            "text": sorted(n for n, t in self.text.items() if isinstance(t, TextEncoder)),
            "text_models": {
                n: [t.model, t.width]
                for n, t in self.text.items()
                if isinstance(t, SentenceEncoder)
            },
        }


def _texts(col: pl.Series) -> list[str | None]:
    return col.cast(pl.String).to_list()


def _rows0(m: np.ndarray) -> np.ndarray:
    """`m` below a zero row (the padding row 0)."""
    return np.concatenate([np.zeros((1, m.shape[1])), m])


def _rows_of(table: pl.DataFrame, items: Sequence[Any], where: str) -> np.ndarray:
    """The table's row of each item; one line for items without one."""
    index = {v: r for r, v in enumerate(table.get_column("item").to_list())}
    text_index = {str(v): r for v, r in index.items()}
    rows = [index.get(i, text_index.get(str(i), -1)) for i in items]
    missing = [i for i, r in zip(items, rows, strict=True) if r < 0]
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise DataError(
            f"{where}: {len(missing):,} of {len(items):,} items have no row ({shown}); "
            "expected a row for every item of the log"
        )
    return np.asarray(rows, dtype=np.int64)


def items_file_bytes(encoder: ItemEncoder, features: ItemFeatures) -> bytes:
    """The run file of an encoder and its items' features (an .npz, no pickles)."""
    arrays: dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(encoder.to_json()).encode(), dtype=np.uint8),
        "dense": features.dense,
    }
    for i, codes in enumerate(features.codes):
        arrays[f"codes_{i}"] = codes
    for name, t in encoder.text.items():
        if not isinstance(t, TextEncoder):
            continue  # a named model: kept by name (in meta)
        arrays[f"text_{name}_buckets"] = t.buckets
        arrays[f"text_{name}_idf"] = t.idf
        arrays[f"text_{name}_components"] = t.components
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def load_items_file(data: bytes | bytearray, where: str) -> tuple[ItemEncoder, ItemFeatures]:
    """(encoder, features) from `items_file_bytes`' bytes; one DataError line if damaged."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            features = tuple(Feature(n, k) for n, k in meta["features"])
            text: dict[str, TextEncoder | SentenceEncoder] = {
                n: TextEncoder(
                    z[f"text_{n}_buckets"], z[f"text_{n}_idf"], z[f"text_{n}_components"]
                )
                for n in meta["text"]
            }
            for n, (model, width) in meta.get("text_models", {}).items():
                text[n] = SentenceEncoder(str(model), int(width))
            enc = ItemEncoder(
                features,
                meta["separator"],
                {k: list(v) for k, v in meta["categories"].items()},
                {k: (float(v[0]), float(v[1])) for k, v in meta["numbers"].items()},
                {k: int(v) for k, v in meta["vectors"].items()},
                text,
            )
            codes = tuple(z[f"codes_{i}"] for i in range(len(enc.sizes)))
            return enc, ItemFeatures(codes, enc.sizes, z["dense"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{where}: damaged ({type(err).__name__})") from None
