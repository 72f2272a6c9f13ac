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
    checkpoint.prev.pt  the epoch before checkpoint.pt: what `--resume` falls back to when the
                    last checkpoint is damaged
    sha256.json     the sha256 of every weight file written ({file: digest}); a weight file
                    loads only if its digest is recorded there (runs from before it: unchecked)
    .lock           while a training runs in the directory: its pid and host

Every file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqrec.config import RunConfig, from_dict
from seqrec.errors import ConfigError, RunError
from seqrec.models.base import SequenceModel
from seqrec.provenance import atomic_write, write_json
from seqrec.registry import MODELS, entry

__all__ = [
    "MODELS",
    "Run",
    "build_model",
    "load_run",
    "load_tensors",
    "read_checkpoint",
    "read_config",
    "read_metrics",
    "read_source",
    "run_lock",
    "save_weights",
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
PREVIOUS, DIGESTS, LOCK = "checkpoint.prev.pt", "sha256.json", ".lock"


def build_model(cfg: RunConfig, n_items: int, n_users: int = 0) -> SequenceModel:
    """The model `cfg.model` for `n_items` items (and `n_users` training users, for the models
    with a per-user term), freshly initialised (seqrec.registry)."""
    return entry(cfg.model).build(n_items, n_users, cfg)


def _digests(run_dir: Path) -> dict[str, str] | None:
    path = run_dir / DIGESTS
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise RunError(f"{path}: damaged (not JSON); the run's weights cannot be checked") from None
    return {str(k): str(v) for k, v in data.items()}


def save_weights(run_dir: Path, name: str, obj: Any) -> None:
    """Write a weight file of the run (`CHECKPOINT` or `WEIGHTS`) and record its sha256.

    The new file is written whole beside the old one first; only then does a new checkpoint
    move the current one to `PREVIOUS` and take its place, and only then is its digest
    recorded. A crash or a full disk at any moment leaves the last good checkpoint loadable: a
    file whose digest is not recorded is never trusted. A failed write is one line."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    target, fresh = run_dir / name, run_dir / f".{name}.new"
    try:
        atomic_write(fresh, lambda f: f.write(data))
        digests = _digests(run_dir) or {}
        if name == CHECKPOINT and target.exists():
            os.replace(target, run_dir / PREVIOUS)
            if CHECKPOINT in digests:
                digests[PREVIOUS] = digests[CHECKPOINT]
        os.replace(fresh, target)
        digests[name] = hashlib.sha256(data).hexdigest()
        write_json(run_dir / DIGESTS, digests)
    except OSError as err:
        fresh.unlink(missing_ok=True)
        raise RunError(
            f"{target}: could not be written ({err.strerror or err}); the last good "
            "checkpoint is kept"
        ) from None


def _verified(run_dir: Path, name: str) -> Any:
    """A weight file of the run, loaded only if its sha256 is one the run recorded."""
    path = run_dir / name
    digests = _digests(run_dir)
    if digests is not None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in digests.values():
            raise RunError(
                f"{path}: its sha256 is not one this run recorded ({DIGESTS}): damaged, "
                "truncated or replaced"
            )
    return load_tensors(path)


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory for one training: a second one is refused in one line. A lock
    left by a process that no longer runs (on this host) is taken over."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path, me = run_dir / LOCK, f"{os.getpid()} {socket.gethostname()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = path.read_text().split() if path.exists() else []
            if owner and _alive(owner):
                raise RunError(
                    f"{run_dir}: in use by another training (pid {owner[0]} on "
                    f"{owner[1] if len(owner) > 1 else '?'}); wait for it or choose another --out"
                ) from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        break
    else:
        raise RunError(f"{run_dir}: could not take the lock {path}")
    _remove_leftovers(run_dir)
    try:
        yield
    finally:
        if path.exists() and path.read_text() == me:
            path.unlink()
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()  # a run that failed before writing anything leaves nothing


def _remove_leftovers(run_dir: Path) -> None:
    """Half-written temporary files of run files, left by a process killed while writing them
    (atomic_write's `.<name>.*`, save_weights' `.<name>.new` and its `..<name>.new.*`): never
    read, removed when the directory is taken again."""
    names = (CONFIG, VOCAB, CHECKPOINT, WEIGHTS, METRICS, LOG, CODE_DIFF, DIGESTS)
    for p in run_dir.iterdir():
        hidden = p.name.startswith(".") and p.name != LOCK
        if hidden and any(p.name.lstrip(".").startswith(f"{n}.") for n in names):
            p.unlink(missing_ok=True)


def _alive(owner: list[str]) -> bool:
    """Whether the process named by a lock (pid, host) still runs; another host's: assume so."""
    if len(owner) > 1 and owner[1] != socket.gethostname():
        return True
    try:
        os.kill(int(owner[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


# Keys added to the configs after runs were written whose default is not what those runs did:
# (section, key) -> the value an older run directory without the key was trained with.
_BEFORE_ADDED = {("bert4rec", "head_norm"): False}


def read_source(run_dir: Path) -> dict[str, Any]:
    """What a run was trained from, as its config.json records it (`data`, `prepared`, ...)."""
    return dict(json.loads((run_dir / CONFIG).read_text()).get("source") or {})


def read_metrics(run_dir: Path) -> dict[str, Any] | None:
    """A finished run's metrics.json; None while the run has not finished."""
    path = run_dir / METRICS
    return dict(json.loads(path.read_text())) if path.exists() else None


def read_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG})")
    data = json.loads(path.read_text())
    data.pop("source", None)
    for (section, key), value in _BEFORE_ADDED.items():
        if isinstance(data.get(section), dict):
            data[section].setdefault(key, value)
    # before [[short_budget]]: bert4rec.dropout_min_minutes turned the hidden dropout off for a
    # shorter budget, at model build, so the file holds the config as given
    minimum = (data.get("bert4rec") or {}).pop("dropout_min_minutes", 0.0)
    if minimum and "short_budget" not in data:
        data["short_budget"] = [{"minutes": minimum, "set": ["bert4rec.dropout=0.0"]}]
    return from_dict(RunConfig, data, str(path), foreign="drop")


def load_tensors(path: Path) -> Any:
    """A file written by `save_weights`, read with PyTorch's restricted unpickler
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
    """The last good checkpoint of the run: checkpoint.pt, or, when it is damaged or was being
    written when the process died, the epoch before it (checkpoint.prev.pt, with a one-line
    notice on stderr). None when the run has none; a RunError when none is good."""
    if not (run_dir / CHECKPOINT).exists() and not (run_dir / PREVIOUS).exists():
        return None
    errors = []
    for name in (CHECKPOINT, PREVIOUS):
        if not (run_dir / name).exists():
            continue
        try:
            state: dict[str, Any] = _verified(run_dir, name)
        except RunError as err:
            errors.append(str(err))
            continue
        if errors:
            print(f"{errors[0]}; using {name} (epoch {state.get('epoch')})", file=sys.stderr)
        return state
    raise RunError(
        errors[0] if len(errors) == 1 else f"{run_dir}: no good checkpoint ({errors[0]})"
    )


@dataclass
class Run:
    """A finished (or interrupted) run, loaded for scoring."""

    path: Path
    config: RunConfig
    model: SequenceModel
    item_ids: list[Any]
    metrics: dict[str, Any] | None
    source: dict[str, Any]


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> Run:
    """The single load path: config + vocab + the best weights (model.pt, or the best state of
    an unfinished run's checkpoint), in eval mode."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    source = read_source(run_dir)
    vocab = json.loads((run_dir / VOCAB).read_text())
    item_ids = vocab["items"]
    model = build_model(cfg, len(item_ids), int(vocab.get("n_users", 0)))
    if (run_dir / WEIGHTS).exists():
        state = _verified(run_dir, WEIGHTS)
    else:
        ckpt = read_checkpoint(run_dir)
        if ckpt is None:
            raise ConfigError(f"{run_dir}: the run has no weights yet ({WEIGHTS}, {CHECKPOINT})")
        state = ckpt["best_state"] or ckpt["model"]
    model.load_state_dict(state)
    model.to(device).eval()
    return Run(run_dir, cfg, model, item_ids, read_metrics(run_dir), source)
