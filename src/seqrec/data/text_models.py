"""A text feature's vectors from a sentence-embedding model (the optional `sentence-transformers`
package, `pip install 'seqrec[text]'`) in place of the built-in hashed n-grams.

`items.text_encoder = "sentence-transformers:NAME"` names the model: a name the package resolves
(downloaded once into its cache, where the machine can reach the model hub) or a local folder
holding a saved model. The run keeps the name and the vectors' width, not the model: a run that
adds items later encodes their text with the same model, so it must be loadable there too.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqrec.errors import DataError

__all__ = ["PREFIX", "SentenceEncoder", "check_text_encoder"]

PREFIX = "sentence-transformers:"
_MODELS: dict[str, Any] = {}  # loaded once per process: loading takes seconds
_LOCK = threading.Lock()


def check_text_encoder(value: str, where: str = "items.text_encoder") -> str | None:
    """The model a text encoder names (None: the built-in "hashed" one); one DataError line for
    a value that is neither."""
    if value == "hashed":
        return None
    if value.startswith(PREFIX) and value[len(PREFIX) :].strip():
        return value[len(PREFIX) :].strip()
    raise DataError(f'{where}: {value!r}; expected "hashed" or "{PREFIX}<model name or folder>"')


def _model(name: str) -> Any:
    with _LOCK:
        if name in _MODELS:
            return _MODELS[name]
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise DataError(
                f"items.text_encoder {PREFIX}{name}: needs the sentence-transformers package "
                "(pip install 'seqrec[text]')"
            ) from None
        try:
            model = SentenceTransformer(name, device="cpu")
        except Exception as err:  # a missing folder, no network to the hub, a damaged model
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise DataError(
                f"items.text_encoder {PREFIX}{name}: cannot be loaded "
                f"({type(err).__name__}: {first[:200]})"
            ) from None
        _MODELS[name] = model
        return model


@dataclass
class SentenceEncoder:
    """Texts -> a sentence-embedding model's unit-length vectors (an empty text: zeros)."""

    model: str
    width: int

    @classmethod
    def fit(cls, model: str) -> SentenceEncoder:
        loaded = _model(model)
        width = getattr(loaded, "get_embedding_dimension", None) or (
            loaded.get_sentence_embedding_dimension  # sentence-transformers before 6
        )
        return cls(model, int(width() or 0))

    @property
    def dim(self) -> int:
        return self.width

    def transform(self, texts: Sequence[str | None]) -> np.ndarray:
        """(n, dim) float32 vectors of unit length (zeros for a missing or empty text)."""
        out = np.zeros((len(texts), self.width), np.float32)
        present = [i for i, t in enumerate(texts) if t is not None and t.strip()]
        if present:
            vectors = _model(self.model).encode(
                [texts[i] for i in present],
                batch_size=64,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            if vectors.shape[1] != self.width:
                raise DataError(
                    f"items.text_encoder {PREFIX}{self.model}: gives {vectors.shape[1]} numbers "
                    f"per text, the run's items {self.width} (another model under that name)"
                )
            out[present] = vectors
        return out
