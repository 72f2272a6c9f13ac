"""The item tower: an item's vector from its id and its features, shared by the models that read
item features (`ModelEntry.item_features`).

An item's vector is the sum of its id embedding and one embedding per feature (RecTools' "item
nets" summed; the convention of the feature-aware SASRec variants): each categorical feature
an embedding of its value (the mean over a multi-valued feature's values), and one linear map of
every dense column (numbers, missing flags, vectors, text vectors). The tower replaces a model's
item embedding table (`SequenceModel.item_tables`), so the same vectors are the model's input
and its output layer: the score of an item follows from its features as well as its id.

An item with no interactions (a cold item) has no id embedding of its own. `id_dropout` trains
for that case: in each training step each item's id embedding is replaced, with that
probability, by one learned "unknown id" vector, so that the features learn to stand for the
item (`id_dropout = 1`: a features-only tower). Scoring uses each item's own id: the dropout
regularises training only. An item added after training (`add_rows`) is given the id embedding
of the trained item whose features are nearest to its own (or the mean of several such): it is
scored like that item, with its own features.

The features are buffers of the tower, saved with the weights; the run's items file
(seqrec.training.rundir) keeps them too, with the encoder that made them (what encodes an item
added later).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from seqrec.data.item_features import ItemFeatures

__all__ = ["ItemTower", "attach_item_features", "grown_state", "nearest_rows"]


class ItemTower(nn.Module):
    """An item embedding table whose rows are id embedding + feature embeddings: used as the
    `nn.Embedding` it replaces (`tower(ids)`, `tower.weight`)."""

    def __init__(self, ids: nn.Embedding, features: ItemFeatures, id_dropout: float = 0.0) -> None:
        super().__init__()
        self.ids = ids  # (V, D): the model's own table, initialised as the model does
        d = ids.embedding_dim
        w = ids.weight
        # the feature embeddings start at the scale of the id embeddings they are added to
        std = 0.02 if w.is_meta else float(w[1:].detach().float().std())
        self.cats = nn.ModuleList(
            nn.Embedding(size + 1, d, padding_idx=0) for size in features.sizes
        )
        for emb in self.cats:
            assert isinstance(emb, nn.Embedding)
            nn.init.normal_(emb.weight, std=std)
            with torch.no_grad():
                emb.weight[0].zero_()
        self.dense = nn.Linear(features.width, d, bias=False) if features.width else None
        if self.dense is not None:
            nn.init.normal_(self.dense.weight, std=std / max(features.width, 1) ** 0.5)
        self.id_dropout = id_dropout
        # the id embedding of an item whose id is left out (id dropout) or unknown (added later)
        self.unknown = nn.Parameter(torch.randn(d) * std) if id_dropout > 0 else None
        self._cached: tuple[tuple[tuple[int, int], ...], torch.Tensor] | None = None
        self._set_features(features)

    def _set_features(self, features: ItemFeatures) -> None:
        """The features as buffers with the table's rows (rows past the features', such as
        BERT4Rec's [MASK], have none)."""
        rows = self.ids.num_embeddings
        if features.n_rows > rows:
            raise ValueError(f"{features.n_rows} rows of item features for a table of {rows}")
        extra = rows - features.n_rows
        device = self.ids.weight.device
        for i, codes in enumerate(features.codes):
            t = torch.as_tensor(codes, dtype=torch.long)
            self.register_buffer(f"codes_{i}", nn.functional.pad(t, (0, 0, 0, extra)).to(device))
        dense = torch.as_tensor(features.dense, dtype=torch.float32)
        self.register_buffer("dense_values", nn.functional.pad(dense, (0, 0, 0, extra)).to(device))
        self.n_codes = len(features.codes)

    dense_values: torch.Tensor  # (V, width) the dense features (a buffer)

    @property
    def embedding_dim(self) -> int:
        return self.ids.embedding_dim

    @property
    def num_embeddings(self) -> int:
        return self.ids.num_embeddings

    def feature_vectors(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(..., D) the features' part of the vectors of `rows` (every row when None)."""
        out: torch.Tensor | None = None
        for i, emb in enumerate(self.cats):
            codes = getattr(self, f"codes_{i}")
            c = codes if rows is None else codes[rows]  # (..., slots)
            valued = (c > 0)[..., None]  # (..., slots, 1): code 0 is no value
            n = valued.sum(-2).clamp(min=1)
            v = (emb(c) * valued).sum(-2) / n  # the mean over a multi-valued feature's values
            out = v if out is None else out + v
        if self.dense is not None:
            d = self.dense_values if rows is None else self.dense_values[rows]
            v = self.dense(d.to(self.dense.weight.dtype))
            out = v if out is None else out + v
        if out is None:
            shape = (
                *(rows.shape if rows is not None else (self.num_embeddings,)),
                self.embedding_dim,
            )
            return self.ids.weight.new_zeros(shape)
        return out

    def _ids(self, e: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """Id embeddings `e` under id dropout (`shape`: the mask's, broadcast over D). Training:
        each replaced by the unknown-id vector with probability p = `id_dropout`. Scoring: each
        item's own id (a regulariser of training, as dropout is), except with p = 1, where no
        id was ever trained and every item is scored by the unknown-id vector and its features."""
        if self.unknown is None:
            return e
        unknown = self.unknown.to(e.dtype)
        if not self.training:
            return unknown.expand_as(e) if self.id_dropout >= 1 else e
        drop = torch.rand(shape, device=e.device) < self.id_dropout
        return torch.where(drop, unknown, e)

    @property
    def weight(self) -> torch.Tensor:
        """(V, D) every row's vector: what the output layer multiplies. Scoring without
        gradients reuses it until a parameter changes (the table is computed once for many
        requests, not once a request)."""
        w = self.ids.weight
        frozen = not self.training and not torch.is_grad_enabled() and not w.is_meta
        if frozen and not torch.jit.is_tracing() and not torch.onnx.is_in_onnx_export():
            key = tuple((id(p), p._version) for p in self.parameters())
            if self._cached is None or self._cached[0] != key:
                self._cached = (key, self._ids(w, (w.shape[0], 1)) + self.feature_vectors())
            return self._cached[1]
        return self._ids(w, (w.shape[0], 1)) + self.feature_vectors()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(...) item ids -> (..., D) their vectors. A batch of more positions than the
        catalogue has rows takes its features' part from the whole table's (computed once, then
        gathered: a training batch of 128 x 200 positions over ML-1M's 3,417 rows does 7x less
        work), a smaller one computes its own rows."""
        if ids.numel() > self.num_embeddings:
            features = self.feature_vectors()[ids]
        else:
            features = self.feature_vectors(ids)
        return self._ids(self.ids(ids), (*ids.shape, 1)) + features

    @torch.no_grad()
    def add_rows(self, features: ItemFeatures, at: int, neighbours: int = 1) -> None:
        """New items' rows inserted at row `at` (rows from `at` on move down), `features`' rows
        1.. as their features. Each new item's id embedding is that of the trained item (rows
        1..at-1) whose feature vector is nearest to its own (cosine), or the mean of the
        `neighbours` nearest: a trained item's id carries what its features do not, and a new
        item is given a neighbour's. The unknown-id vector, or a mean over many neighbours,
        would give every new item the middle of the scores of the items it resembles, where a
        trained one spreads over them: a new item would seldom reach a top 10 (measured on a
        log where only the genre tells items apart: docs/results/features.md)."""
        n = features.n_rows - 1
        w = self.ids.weight
        for i in range(self.n_codes):
            old = getattr(self, f"codes_{i}")
            new = torch.as_tensor(features.codes[i][1:], dtype=torch.long, device=old.device)
            slots = max(old.shape[1], new.shape[1])
            old = nn.functional.pad(old, (0, slots - old.shape[1]))
            new = nn.functional.pad(new, (0, slots - new.shape[1]))
            setattr(self, f"codes_{i}", torch.cat([old[:at], new, old[at:]]))
        d = torch.as_tensor(
            features.dense[1:], dtype=torch.float32, device=self.dense_values.device
        )
        self.dense_values = torch.cat([self.dense_values[:at], d, self.dense_values[at:]])
        trained = torch.arange(1, at, device=w.device)
        added = torch.arange(at, at + n, device=w.device)
        start = nearest_rows(self.feature_vectors(), w, trained, added, neighbours)
        self.ids.weight = nn.Parameter(torch.cat([w[:at], start.to(w.dtype), w[at:]]))
        self.ids.num_embeddings = self.ids.weight.shape[0]
        self._cached = None


def nearest_rows(
    vectors: torch.Tensor,
    ids: torch.Tensor,
    have: torch.Tensor,
    new: torch.Tensor,
    neighbours: int,
) -> torch.Tensor:
    """(len(new), D): for each row of `new`, the mean of the `ids` rows of the `neighbours` rows
    of `have` whose feature `vectors` are nearest to its own (cosine); 1,024 new rows at a time,
    so that no (new, have) matrix of a large catalogue is held whole."""
    unit = nn.functional.normalize(vectors, dim=1)
    known = unit[have]
    out = [
        ids[
            have[(unit[new[lo : lo + 1024]] @ known.T).topk(min(neighbours, len(have))).indices]
        ].mean(1)
        for lo in range(0, len(new), 1024)
    ]
    return torch.cat(out) if out else ids.new_zeros(0, ids.shape[1])


def attach_item_features(model: nn.Module, features: ItemFeatures, id_dropout: float) -> None:
    """Replace each of the model's item tables (`item_tables`) with an `ItemTower` over it."""
    for name in getattr(model, "item_tables", ()):
        table = getattr(model, name)
        if table is None:
            continue
        if not isinstance(table, nn.Embedding):
            raise TypeError(f"{type(model).__name__}.{name}: not an embedding table")
        setattr(model, name, ItemTower(table, features, id_dropout))


def grown_state(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    rows: np.ndarray,
    neighbours: int = 1,
) -> dict[str, torch.Tensor]:
    """A trained model's weights (`state`, over its own items) for `model`, the same model with
    item towers over another catalogue (`train.init_from` on a log whose catalogue grew):
    `rows[r - 1]` is item r's row in the trained model, 0 for an item it did not have. The
    towers' id rows and the item biases are taken item by item (rows past the items, BERT4Rec's
    [MASK], as they were); an item the trained model did not have takes the id embedding of the
    one it had nearest to it by features (`neighbours`: the mean of that many) and the mean
    bias; the features are `model`'s own; every other tensor is the trained model's. A tensor
    that differs in another way is left as it is, for the caller's shape check to name."""
    target = model.state_dict()
    out = dict(state)
    known = rows > 0
    n = len(rows)
    for name in getattr(model, "item_tables", ()):
        tower = getattr(model, name)
        if not isinstance(tower, ItemTower):
            continue
        for key, value in target.items():  # the features: the new catalogue's
            if key.startswith(f"{name}.codes_") or key == f"{name}.dense_values":
                out[key] = value
        key = f"{name}.ids.weight"
        old, shape = state[key], target[key]
        if target[key].is_meta:
            out[key] = torch.empty_like(shape)
            continue
        extra = shape.shape[0] - (n + 1)  # rows past the items ([MASK])
        new = torch.zeros_like(shape)
        new[0] = old[0]
        new[1 : n + 1][torch.from_numpy(known)] = old[torch.from_numpy(rows[known])]
        if extra:
            new[n + 1 :] = old[old.shape[0] - extra :]
        if (~known).any() and known.any():
            probe = copy.deepcopy(tower)  # the trained feature layers over the new features
            probe.load_state_dict(
                {
                    k[len(name) + 1 :]: v
                    for k, v in {**out, key: new}.items()
                    if k.startswith(f"{name}.")
                }
            )
            have = torch.from_numpy(np.flatnonzero(known) + 1)
            missing = torch.from_numpy(np.flatnonzero(~known) + 1)
            with torch.no_grad():
                vectors = probe.feature_vectors()
                new[missing] = nearest_rows(vectors, new, have, missing, neighbours)
        out[key] = new
    for name, first in getattr(model, "item_biases", ()):
        old, shape = state[name], target[name]
        if shape.is_meta:
            out[name] = torch.empty_like(shape)
            continue
        n_old = old.shape[0] - first
        new = torch.full_like(shape, float(old[first : first + n_old].mean()))
        new[:first] = old[:first]
        new[first : first + n][torch.from_numpy(known)] = old[first + rows[known] - 1]
        out[name] = new
    return out
