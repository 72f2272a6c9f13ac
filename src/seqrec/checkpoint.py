"""The run directory: everything a training run leaves behind, and the one way to load it
(used by `--resume`, `seqrec evaluate DIR`, and later the recommender and the server).

    config.json     the resolved RunConfig (defaults -> file -> --set), plus the data it ran on
    vocab.json      {"items": [external ids], "popularity": [training counts]}: internal item i
                    is items[i - 1]; popularity[i] its interactions in the training split
    checkpoint.pt   the last finished epoch: weights, optimiser, schedule, best state, history
    model.pt        the best weights (chosen on validation), written when the run ends
    metrics.json    validation and test metrics for every protocol, wall time, epochs, commit,
                    machine, seed
    log.jsonl       one line per epoch: loss, learning rate, sequences/s, validation metric
    code.diff       only when the run started from a checkout with uncommitted changes: that
                    change, so the run's numbers can be traced to its exact code

Every file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqrec.config import RunConfig, from_dict
from seqrec.errors import ConfigError, RunError
from seqrec.models.bert4rec import BERT4Rec
from seqrec.models.sasrec import SASRec
from seqrec.provenance import atomic_write, write_json

__all__ = [
    "MODELS",
    "Run",
    "build_model",
    "load_run",
    "load_tensors",
    "read_checkpoint",
    "save_torch",
    "write_json",
]

CONFIG, VOCAB, CHECKPOINT, WEIGHTS, METRICS, LOG, CODE_DIFF = (
    "config.json",
    "vocab.json",
    "checkpoint.pt",
    "model.pt",
    "metrics.json",
    "log.jsonl",
    "code.diff",
)

# model name -> constructor from (number of items, run config)
MODELS: dict[str, Any] = {
    "bert4rec": lambda n_items, cfg: BERT4Rec(n_items, cfg.bert4rec),
    "sasrec": lambda n_items, cfg: SASRec(n_items, cfg.sasrec),
}


def build_model(cfg: RunConfig, n_items: int) -> nn.Module:
    if cfg.model not in MODELS:
        raise ConfigError(f"model {cfg.model!r} is unknown; expected one of {', '.join(MODELS)}")
    model: nn.Module = MODELS[cfg.model](n_items, cfg)
    return model


def save_torch(path: Path, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    atomic_write(path, lambda f: f.write(data))


# Keys added to the configs after runs were written whose default is not what those runs did:
# (section, key) -> the value an older run directory without the key was trained with.
_BEFORE_ADDED = {("bert4rec", "head_norm"): False}


def read_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG})")
    data = json.loads(path.read_text())
    data.pop("source", None)
    for (section, key), value in _BEFORE_ADDED.items():
        if isinstance(data.get(section), dict):
            data[section].setdefault(key, value)
    return from_dict(RunConfig, data, str(path))


def load_tensors(path: Path) -> Any:
    """A file written by `save_torch`, read with PyTorch's restricted unpickler
    (`weights_only=True`): tensors, numbers, strings and plain containers only. A file that holds
    anything else (a pickled object whose loading would run code) or is damaged is refused with a
    one-line error naming it; nothing in it is executed."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # UnpicklingError, RuntimeError, EOFError, ...: all one answer
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RunError(
            f"{path}: refused, not a tensors-only seqrec file or damaged ({first})"
        ) from None


def read_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    state: dict[str, Any] = load_tensors(path)
    return state


@dataclass
class Run:
    """A finished (or interrupted) run, loaded for scoring."""

    path: Path
    config: RunConfig
    model: nn.Module
    item_ids: list[Any]
    metrics: dict[str, Any] | None
    source: dict[str, Any]


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> Run:
    """The single load path: config + vocab + the best weights (model.pt, or the best state of
    an unfinished run's checkpoint), in eval mode."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    source = json.loads((run_dir / CONFIG).read_text()).get("source", {})
    item_ids = json.loads((run_dir / VOCAB).read_text())["items"]
    model = build_model(cfg, len(item_ids))
    if (run_dir / WEIGHTS).exists():
        state = load_tensors(run_dir / WEIGHTS)
    else:
        ckpt = read_checkpoint(run_dir)
        if ckpt is None:
            raise ConfigError(f"{run_dir}: the run has no weights yet ({WEIGHTS}, {CHECKPOINT})")
        state = ckpt["best_state"] or ckpt["model"]
    model.load_state_dict(state)
    model.to(device).eval()
    metrics_path = run_dir / METRICS
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else None
    return Run(run_dir, cfg, model, item_ids, metrics, source)
