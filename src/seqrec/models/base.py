"""What every trainable model is to the rest of seqrec, and the registry entry that makes one.

`SequenceModel` is the interface train / evaluate / recommend / serve / export call: a module
that maps left-padded item ids to hidden states, an output layer the loss reads (features and
(weights, bias), so the loss gathers the target positions before the big matmul), and `score`,
the `Scorer` interface of `seqrec.evaluation.protocols`.

`ModelEntry` is everything seqrec needs to know to train a model by name: its config sections
(TOML section name -> frozen dataclass), how to build it, its training batches and where its
training recipe differs from `TrainConfig`'s defaults. A model file defines its module and one
`ModelEntry`; `seqrec.models.registry` lists the entries. Adding a model is that file plus one line
there (docs/design/architecture.md, "Adding a model").
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from seqrec.data.candidates import item_popularity
from seqrec.evaluation.blocks import BlockScores

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.batches import Batch
    from seqrec.data.item_features import ItemFeatures
    from seqrec.data.prepared import PreparedDataset

__all__ = [
    "BASELINE_TRAIN",
    "BlockScores",
    "ModelEntry",
    "Sampler",
    "SequenceModel",
    "linear",
    "next_item_batches",
    "whole_row_batches",
]


class SequenceModel(nn.Module, ABC):
    """A trainable next-item model over items 1..n_items (0 = padding)."""

    n_items: int
    # True for models with a per-user term (BPR-MF, FPMC, Caser): `forward` and `user_vector`
    # then take `users`, (B,) internal user indices of the training data, where -1 (or `users`
    # None) is a history of a user the model never saw: its user term is left out (zero).
    uses_users: ClassVar[bool] = False
    # False for a model whose score of (user, item) is not a dot product with an output layer
    # (NCF's MLP, HSTU's Mixture of Logits head): the sampled losses then read `pair_logits`,
    # and `score` is its own; a class default a model may set per instance (per head)
    dot_product_output: bool = True
    # False where torch's ONNX exporter cannot convert the model (GRU4Rec: nn.GRU); TorchScript
    # export still works
    onnx_export: ClassVar[bool] = True
    # The item embedding tables an item tower replaces when the run has item features
    # (seqrec.models.tower): row r is item r, rows past n_items (BERT4Rec's [MASK]) are special.
    # Empty: the model reads no item features.
    item_tables: ClassVar[tuple[str, ...]] = ()
    # The item-indexed bias parameters, each with the index of item 1 in it (0: items 1..n at
    # 0..n-1; 1: a row 0 for padding), that grow with the catalogue (`add_items`)
    item_biases: ClassVar[tuple[tuple[str, int], ...]] = ()

    @property
    def uses_times(self) -> bool:
        """Whether the model reads when each history item happened (HSTU's time bias): `score`,
        `block_scores` and `user_vector` then take `times`, (B, L + 1) int64 seconds, the L
        history items' times (0 for padding) and last the time the recommendation is for."""
        return False

    @property
    def device(self) -> torch.device:
        """Where the weights are: `score` takes its histories there, and `evaluate` puts them
        there unless told otherwise (a model `fit` trained on a GPU stays on it)."""
        return next(self.parameters()).device

    @property
    @abstractmethod
    def max_len(self) -> int:
        """How many most-recent items `score` reads."""

    def output_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) hidden states -> (..., D) features the output layer multiplies (the hidden
        states themselves unless a model has an output transform, as BERT4Rec does)."""
        return hidden

    @abstractmethod
    def output_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer: (n_items, D) weights of items 1..n and an (n_items,) bias or None."""

    @abstractmethod
    def user_vector(
        self, histories: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) features that score the next item; `users`
        (B,) is read only by models that `uses_users`."""

    def user_features(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, D) output features of `user_vector`, given the histories' `times` where the
        model reads them (`uses_times`; ignored otherwise)."""
        if not self.uses_times:
            return self.output_features(self.user_vector(histories, users))
        if times is None:
            raise ValueError(
                f"{type(self).__name__} reads when each item happened: score it with `times`"
            )
        return self.output_features(self.user_vector(histories, users, times=times))  # type: ignore[call-arg]

    def pair_logits(self, features: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(M, D) output features and (M, k) item ids -> (M, k) scores of those items; the dot
        product with the output layer unless a model (`dot_product_output` False) has its own."""
        weight, bias = self.output_weights()
        out = torch.einsum("md,mkd->mk", features, weight[items - 1])
        return out if bias is None else out + bias[items - 1]

    def sequence_logits(
        self, features: torch.Tensor, items: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """(B, L, D) output features, (B, k) item ids, each row's own, and the (B, L) bool
        `positions` to score -> (M, k) scores of each position's row's items (per-sequence
        negatives); the dot product with the output layer unless a model
        (`dot_product_output` False) has its own."""
        weight, bias = self.output_weights()
        out = torch.einsum("bld,bkd->blk", features, weight[items - 1])[positions]
        return out if bias is None else out + bias[items - 1][positions.nonzero()[:, 0]]

    def init_output_bias(self, popularity: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """Called once before training with the (n_items,) training counts; no-op by default."""

    @torch.no_grad()
    def add_items(self, features: ItemFeatures, neighbours: int = 1) -> None:
        """Extend the catalogue by `features`' rows 1.. as items n_items+1..: their vectors come
        from their features and the ids of their `neighbours` nearest trained items by features
        (seqrec.models.tower), their bias from those items' biases (the mean of them); the other
        items' vectors, and so their scores, are unchanged."""
        from seqrec.models.tower import ItemTower, nearest_rows

        towers = [getattr(self, name) for name in self.item_tables]
        towers = [t for t in towers if t is not None]
        if not towers or not all(isinstance(t, ItemTower) for t in towers):
            raise TypeError(
                f"{type(self).__name__}: items are added only to a model trained with item "
                "features (its vectors of a new item come from them)"
            )
        at, n = self.n_items + 1, features.n_rows - 1
        for tower in towers:
            tower.add_rows(features, at, neighbours)
        if self.item_biases:  # the output side's rows, the new ones in
            vectors = towers[-1].feature_vectors()
            trained, added = torch.arange(1, at), torch.arange(at, at + n)
        for name, first in self.item_biases:
            bias = getattr(self, name)
            end = self.n_items + first
            column = vectors.new_zeros(vectors.shape[0], 1)  # row r: item r's bias
            column[1:at, 0] = bias[first:end].to(column.dtype)
            fill = nearest_rows(vectors, column, trained, added, neighbours)[:, 0]
            fill = fill.to(bias.dtype)
            setattr(self, name, nn.Parameter(torch.cat([bias[:end], fill, bias[end:]])))
        self.n_items += n

    @torch.no_grad()
    def score(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The `Scorer` interface: (B, L) histories -> (B, n_items + 1); column 0 is -inf.
        `times`: read only by a model that `uses_times` (which needs them)."""
        weight, bias = self.output_weights()
        features = self.user_features(histories, users, times)
        # out= is outside autocast, autograd and export (a traced graph may later run with
        # autograd on): the scores are assembled there instead
        if (
            torch.is_grad_enabled()
            or torch.is_autocast_enabled(features.device.type)
            or torch.jit.is_tracing()
            or torch.onnx.is_in_onnx_export()
        ):
            scores = features @ weight.T
            if bias is not None:
                scores = scores + bias
            return torch.cat([torch.full_like(scores[:, :1], -math.inf), scores], dim=1)
        # (B, n_items + 1) allocated once and written in place: on a large catalogue the
        # scores are tens of MB, and each fresh tensor of that size costs its page faults
        out = features.new_empty(features.shape[0], weight.shape[0] + 1)
        out[:, 0] = -math.inf
        torch.mm(features, weight.T, out=out[:, 1:])
        if bias is not None:
            out[:, 1:] += bias
        return out

    @property
    def blockwise(self) -> bool:
        """Whether `block_scores` can score this model a block of items at a time."""
        return self.dot_product_output

    @torch.no_grad()
    def block_scores(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        times: torch.Tensor | None = None,
        *,
        bf16: bool = False,
    ) -> BlockScores:
        """The scores of `score`, to be read one block of items at a time (a catalogue of
        millions of items: no (B, n_items + 1) matrix is ever held); only for a `blockwise`
        model, whose score is a dot product with its output layer."""
        if not self.blockwise:
            raise TypeError(f"{type(self).__name__} is scored whole, not in blocks")
        with torch.autocast(histories.device.type, dtype=torch.bfloat16, enabled=bf16):
            features = self.user_features(histories, users, times)
        weight, bias = self.output_weights()
        return BlockScores(features, weight, bias, bf16=bf16)


class Sampler(Protocol):
    """A model's training batches: `len` batches per epoch, the same ones for the same epoch."""

    def __len__(self) -> int: ...

    def epoch(self, epoch: int) -> Iterator[Batch]: ...


@dataclass(frozen=True)
class ModelEntry:
    """One trainable model, by name (`seqrec train NAME`, `model = "NAME"` in a config)."""

    name: str
    # the model's own config sections, in TOML order: section name -> frozen dataclass; a run's
    # config holds these and no other model's (`RunConfig.sections`)
    sections: Mapping[str, type]
    # (n_items, n_users, run config) -> model; n_users: the training data's users (for the
    # models with a per-user term; the others ignore it)
    build: Callable[[int, int, RunConfig], SequenceModel]
    batches: Callable[[RunConfig, PreparedDataset], Sampler]  # its training task
    # (n_items, n_users, run config) -> how many parameters `build` makes, by a formula (nothing
    # built): what seqrec.training.sizes bounds before a model is allocated; the contract test
    # checks it against the built model
    parameters: Callable[[int, int, RunConfig], int]
    # where its recipe differs from TrainConfig's defaults (BERT4Rec §4.3)
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    # reads each row as one user's whole sequence (a GRU, a per-user term): no packed batches
    whole_rows: bool = False
    # the model's own rules beyond seqrec.training.validation's (cfg, the dataset or None): a
    # ConfigError line, before anything is built or written
    validate: Callable[[RunConfig, PreparedDataset | None], None] | None = None


def linear(n_in: int, n_out: int) -> int:
    """Parameters of nn.Linear(n_in, n_out): its weights and bias."""
    return n_in * n_out + n_out


def last_positions(x: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """x[:, -n:] along `dim` (every position when there are fewer than n), written with
    `narrow`: its length is an expression of the input's, where torch.export (2.10 on) takes a
    negative slice of a dynamic length for a data-dependent size and fails on it."""
    if torch.jit.is_tracing():  # TorchScript traces sizes as tensors: a slice traces as one
        return x[(slice(None),) * dim + (slice(-n, None),)]
    size = x.shape[dim]
    start = torch.sym_max(size - n, 0)
    return x.narrow(dim, start, size - start)


def next_item_batches(
    cfg: RunConfig, ds: PreparedDataset, max_len: int, times: bool = False
) -> Sampler:
    """The shifted next-item task (SASRec §III-E) over the training sequences, windows of at most
    `max_len` items: the training batches of any model whose config has a [next_item] section;
    with `times`, each batch also holds its items' times (a model that `uses_times`)."""
    from seqrec.data.batches import NextItemSampler
    from seqrec.data.negatives import NegativeSampler

    t = cfg.train
    train = ds.split.training(t.train_on)
    counts = item_popularity(train)
    return NextItemSampler(
        train,
        max_len=max_len,
        cfg=cfg.next_item,
        batch_size=t.batch_size,
        seed=t.seed,
        negatives=NegativeSampler.from_config(cfg.train, counts),
        times=times,
    )


def whole_row_batches(model: str, section: str) -> Callable[[RunConfig, PreparedDataset], Sampler]:
    """The next-item batches of a model that reads each row as one user's whole sequence (a GRU, a
    per-user term): windows of `cfg.<section>.max_len` items (its entry's `whole_rows` keeps them
    unpacked)."""

    def batches(cfg: RunConfig, ds: PreparedDataset) -> Sampler:
        return next_item_batches(cfg, ds, getattr(cfg, section).max_len)

    return batches


# The baselines' recipe where it differs from TrainConfig's (BERT4Rec's): plain Adam at 1e-3
# without the transformer's warm-up, decay, clipping or weight decay; each model adds its loss
BASELINE_TRAIN: Mapping[str, Any] = {
    "lr": 1e-3,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "warmup_steps": 0,
    "decay": "none",
    "clip_norm": 0.0,
    "batch_size": 128,
}


def whole_rows_only(model: str, layout: Mapping[str, Any]) -> None:
    """A model that reads each row as one user's whole sequence takes no packed layout (the
    config's rule, `ModelEntry.whole_rows`, is checked by validation before this)."""
    if layout:
        raise ValueError(f"{model} reads whole rows: next_item.pack must be false")
