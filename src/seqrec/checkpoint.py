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
    sha256.json     the manifest: the sha256 of every file a loader reads (config.json,
                    vocab.json, metrics.json and the weight files), by file name. A file loads
                    only if its digest is the one recorded for its name (or, while a file
                    is being replaced, the one recorded as pending for it); a run without the
                    manifest loads only when the caller trusts it (`--trust`: hand-made runs)
    .lock           while a training runs in the directory: its pid, its process's start time
                    and its host; held with `fcntl.flock` (see run_lock)

Every file is written to a temporary name and renamed into place. What the manifest protects
against is damage (a truncated, half-written, swapped or edited file), not an attacker who can
write the directory: such a one can rewrite the manifest too (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqrec.config import RunConfig, from_dict, validate
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
    "read_config_dict",
    "read_metrics",
    "read_source",
    "read_vocab",
    "run_lock",
    "save_weights",
    "shape_mismatch",
    "write_json",
    "write_run_json",
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
PENDING = ".pending"  # in the manifest: the digests of files being put in place (_commit)


def build_model(cfg: RunConfig, n_items: int, n_users: int = 0) -> SequenceModel:
    """The model `cfg.model` for `n_items` items (and `n_users` training users, for the models
    with a per-user term), freshly initialised (seqrec.registry)."""
    return entry(cfg.model).build(n_items, n_users, cfg)


def _digests(run_dir: Path, *, trust: bool = False) -> dict[str, Any] | None:
    """The run's manifest {file name: sha256}; None when it has none and `trust` is set (a
    RunError otherwise)."""
    path = run_dir / DIGESTS
    if not path.exists():
        if trust:
            return None
        raise RunError(
            f"{path}: missing, so the run's files cannot be checked; a run made by hand "
            "loads with --trust"
        )
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        raise RunError(f"{path}: damaged (not JSON); the run's files cannot be checked") from None
    if not isinstance(data, dict) or not _digest_map(data.get(PENDING, {})):
        raise RunError(f"{path}: damaged (expected {{file name: sha256}})")
    if not _digest_map({k: v for k, v in data.items() if k != PENDING}):
        raise RunError(f"{path}: damaged (expected {{file name: sha256}})")
    return data


def _digest_map(data: Any) -> bool:
    return isinstance(data, dict) and all(
        isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in data.items()
    )


def _commit(run_dir: Path, changes: dict[str, str], write: Callable[[], None]) -> None:
    """Change files of the run so that a crash at any moment leaves each file with a digest the
    manifest accepts for its name: the new digests (`changes`, {name: sha256}) are recorded as
    pending first, then `write` puts the files in place, then they become the recorded ones."""
    digests = _digests(run_dir, trust=True) or {}
    digests.pop(PENDING, None)
    write_json(run_dir / DIGESTS, {**digests, PENDING: changes})
    write()
    write_json(run_dir / DIGESTS, {**digests, **changes})


def write_run_json(run_dir: Path, name: str, obj: Any) -> None:
    """Write a JSON file of the run (config, vocab, metrics) and record its digest."""
    data = (json.dumps(obj, indent=2) + "\n").encode()
    digest = hashlib.sha256(data).hexdigest()
    _commit(run_dir, {name: digest}, lambda: atomic_write(run_dir / name, lambda f: f.write(data)))


def _read_verified(run_dir: Path, name: str, *, trust: bool = False) -> bytes:
    """A run file's bytes, only if its sha256 is the one the manifest records for its name.
    `trust` (hand-made runs, runs of older versions) loads what the manifest does not name, or
    a run without one; a file whose recorded digest differs is refused all the same."""
    path = run_dir / name
    digests = _digests(run_dir, trust=trust)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunError(f"{path}: missing") from None
    if digests is None:
        return data
    pending: dict[str, str] = digests.get(PENDING) or {}
    if name not in digests and name not in pending and trust:
        return data  # a run of an older seqrec: its manifest named the weight files only
    if name not in digests and name not in pending:
        raise RunError(
            f"{path}: not recorded in {DIGESTS} (the run was stopped while writing it, and "
            "--resume writes it again; or it was put there by hand)"
        )
    if hashlib.sha256(data).hexdigest() not in (digests.get(name), pending.get(name)):
        raise RunError(
            f"{path}: its sha256 is not one this run recorded for it ({DIGESTS}): "
            "damaged, truncated, edited or replaced"
        )
    return data


def _read_json(run_dir: Path, name: str, *, trust: bool = False) -> dict[str, Any]:
    """A run's JSON file (verified), which must hold an object; one line naming it otherwise."""
    data = _read_verified(run_dir, name, trust=trust)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise RunError(f"{run_dir / name}: damaged (not JSON)") from None
    if not isinstance(obj, dict):
        raise RunError(f"{run_dir / name}: damaged (expected a JSON object)")
    return obj


def save_weights(run_dir: Path, name: str, obj: Any) -> None:
    """Write a weight file of the run (`CHECKPOINT` or `WEIGHTS`) and record its sha256.

    The new file is written whole beside the old one first; only then does a new checkpoint
    move the current one to `PREVIOUS` and take its place, each move recorded in the manifest
    before it is made (`_commit`). A crash or a full disk at any moment leaves the last good
    checkpoint loadable, and every file on disk with a digest recorded for its name: a file
    whose digest is not recorded is never trusted. A failed write is one line."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    target, fresh = run_dir / name, run_dir / f".{name}.new"
    try:
        atomic_write(fresh, lambda f: f.write(data))
        changes = {name: hashlib.sha256(data).hexdigest()}
        moving = name == CHECKPOINT and target.exists()
        if moving:  # the current checkpoint becomes the previous one
            current = (_digests(run_dir, trust=True) or {}).get(CHECKPOINT)
            if current is not None:
                changes[PREVIOUS] = current

        def put() -> None:
            if moving:
                os.replace(target, run_dir / PREVIOUS)
            os.replace(fresh, target)

        _commit(run_dir, changes, put)
    except OSError as err:
        fresh.unlink(missing_ok=True)
        raise RunError(
            f"{target}: could not be written ({err.strerror or err}); the last good "
            "checkpoint is kept"
        ) from None


def _verified(run_dir: Path, name: str, *, trust: bool = False) -> Any:
    """A weight file of the run, loaded only if its sha256 is the one the run recorded for it."""
    return load_tensors(run_dir / name, _read_verified(run_dir, name, trust=trust))


@contextlib.contextmanager
def run_lock(run_dir: Path, *, break_lock: bool = False) -> Iterator[None]:
    """Hold the run directory for one training: a second one is refused in one line.

    The lock is `fcntl.flock` on `.lock`, which the kernel releases when its holder dies, so a
    lock left by a killed process is taken over at once; the file records the holder's pid,
    start time and host for the message. A lock file naming another host (a directory on shared
    storage, where flock may not reach across machines) is refused unless `break_lock`; one
    naming a process of this host that still runs with the same start time (a holder that did
    not flock) is refused; a pid reused by another process is not mistaken for the holder."""
    created = not run_dir.exists()
    path = run_dir / LOCK
    fd = _take_lock(run_dir, path, break_lock)
    _remove_leftovers(run_dir)
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # before the lock goes: a waiter re-checks the inode
        finally:
            os.close(fd)
        if created:
            with contextlib.suppress(OSError):  # a run that failed before writing anything
                run_dir.rmdir()  # leaves nothing (only when empty)


def _take_lock(run_dir: Path, path: Path, break_lock: bool) -> int:
    me = f"{os.getpid()} {_start_time(os.getpid())} {socket.gethostname()}"
    for _ in range(1000):
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # the directory was removed by a holder leaving: again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 256, 0).decode(errors="replace").split()
            os.close(fd)
            raise RunError(
                f"{run_dir}: {_held(owner)}; wait for it or choose another --out"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder unlinked it before we locked: lock the new file instead
            os.close(fd)
            continue
        owner = os.pread(fd, 256, 0).decode(errors="replace").split()
        if owner and not break_lock and _still_held(owner):
            os.close(fd)
            host = owner[-1] if len(owner) > 1 else "?"
            hint = (
                "; seqrec cannot tell whether it still runs there: --break-lock takes it"
                if host != socket.gethostname()
                else ""
            )
            raise RunError(f"{run_dir}: {_held(owner)}{hint}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        return fd
    raise RunError(f"{run_dir}: could not take the lock {path}")


def _held(owner: list[str]) -> str:
    host = owner[-1] if len(owner) > 1 else "?"
    return f"in use by another training (pid {owner[0] if owner else '?'} on {host})"


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); "?" where
    there is no /proc. With the pid it names one process: pids are reused, start times not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _still_held(owner: list[str]) -> bool:
    """Whether the process a lock file names (`pid [start] host`) may still hold it: another
    host's, always; this host's, when that pid runs with the recorded start time."""
    if len(owner) > 1 and owner[-1] != socket.gethostname():
        return True
    try:
        pid = int(owner[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # exists, owned by another user
        pass
    recorded = owner[1] if len(owner) == 3 else "?"
    return recorded == "?" or recorded == _start_time(pid)


def _remove_leftovers(run_dir: Path) -> None:
    """Half-written temporary files of run files, left by a process killed while writing them
    (atomic_write's `.<name>.*`, save_weights' `.<name>.new` and its `..<name>.new.*`): never
    read, removed when the directory is taken again."""
    names = (CONFIG, VOCAB, CHECKPOINT, WEIGHTS, METRICS, LOG, CODE_DIFF, DIGESTS)
    for p in run_dir.iterdir():
        hidden = p.name.startswith(".") and p.name != LOCK
        if hidden and any(p.name.lstrip(".").startswith(f"{n}.") for n in names):
            p.unlink(missing_ok=True)


# Keys added to the configs after runs were written whose default is not what those runs did:
# (section, key) -> the value an older run directory without the key was trained with.
_BEFORE_ADDED = {("bert4rec", "head_norm"): False}


def read_source(run_dir: Path, *, trust: bool = False) -> dict[str, Any]:
    """What a run was trained from, as its config.json records it (`data`, `prepared`, ...)."""
    return dict(_read_json(run_dir, CONFIG, trust=trust).get("source") or {})


def read_metrics(run_dir: Path, *, trust: bool = False) -> dict[str, Any] | None:
    """A finished run's metrics.json; None while the run has not finished."""
    if not (run_dir / METRICS).exists():
        return None
    return _read_json(run_dir, METRICS, trust=trust)


def read_config_dict(run_dir: Path, *, trust: bool = False) -> dict[str, Any]:
    """config.json as it is stored (verified): the resolved config and its `source`."""
    if not (run_dir / CONFIG).exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG})")
    return _read_json(run_dir, CONFIG, trust=trust)


def read_config(run_dir: Path, *, trust: bool = False) -> RunConfig:
    """The run's config (verified, migrated from older layouts, every value range-checked)."""
    path = run_dir / CONFIG
    data = read_config_dict(run_dir, trust=trust)
    data.pop("source", None)
    for (section, key), value in _BEFORE_ADDED.items():
        if isinstance(data.get(section), dict):
            data[section].setdefault(key, value)
    # before [[short_budget]]: bert4rec.dropout_min_minutes turned the hidden dropout off for a
    # shorter budget, at model build, so the file holds the config as given
    bert = data.get("bert4rec")
    minimum = bert.pop("dropout_min_minutes", 0.0) if isinstance(bert, dict) else 0.0
    if minimum and "short_budget" not in data:
        data["short_budget"] = [{"minutes": minimum, "set": ["bert4rec.dropout=0.0"]}]
    return validate(from_dict(RunConfig, data, str(path), foreign="drop"), str(path))


def read_vocab(run_dir: Path, *, trust: bool = False) -> dict[str, Any]:
    """vocab.json (verified): `items` (external ids, internal item i = items[i - 1]), and
    `popularity` and `n_users` where the run recorded them; one line naming it when malformed."""
    path = run_dir / VOCAB
    vocab = _read_json(run_dir, VOCAB, trust=trust)
    items = vocab.get("items")
    if not isinstance(items, list) or not items:
        raise RunError(f"{path}: damaged (expected a non-empty list 'items')")
    popularity = vocab.get("popularity")
    if popularity is not None and (
        not isinstance(popularity, list) or len(popularity) != len(items) + 1
    ):
        raise RunError(f"{path}: damaged ('popularity' must hold {len(items) + 1} counts)")
    n_users = vocab.get("n_users", 0)
    if isinstance(n_users, bool) or not isinstance(n_users, int) or n_users < 0:
        raise RunError(f"{path}: damaged ('n_users' must be a count)")
    return vocab


def load_tensors(path: Path, data: bytes | None = None) -> Any:
    """A file written by `save_weights` (or its bytes, `data`, already read and verified), read
    with PyTorch's restricted unpickler (`weights_only=True`): tensors, numbers, strings and
    plain containers only. A file that holds anything else (a pickled object whose loading would
    run code) or is damaged is refused with a one-line error naming it; nothing in it runs."""
    try:
        source: Any = io.BytesIO(data) if data is not None else path
        return torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # UnpicklingError, RuntimeError, EOFError, ...: all one answer
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RunError(
            f"{path}: refused, not a tensors-only seqrec file or damaged ({first})"
        ) from None


def read_checkpoint(run_dir: Path, *, trust: bool = False) -> dict[str, Any] | None:
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
            state: dict[str, Any] = _verified(run_dir, name, trust=trust)
            if not isinstance(state, dict):
                raise RunError(f"{run_dir / name}: damaged (not a checkpoint)")
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


# Parameters and buffers a loaded model may hold: a bound checked on the meta device before
# anything is allocated ($SEQREC_MAX_MODEL_BYTES overrides it).
MAX_MODEL_BYTES = 8 << 30


def _max_model_bytes() -> int:
    text = os.environ.get("SEQREC_MAX_MODEL_BYTES")
    try:
        return int(text) if text else MAX_MODEL_BYTES
    except ValueError:
        raise ConfigError(f"$SEQREC_MAX_MODEL_BYTES={text!r}: expected a number") from None


def _shaped_model(cfg: RunConfig, n_items: int, n_users: int, where: Path) -> SequenceModel:
    """The model `cfg` describes, built on the meta device (no memory), refused in one line
    when its size is over the bound."""
    try:
        with torch.device("meta"):
            model = build_model(cfg, n_items, n_users)
    except (ValueError, RuntimeError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RunError(f"{where}: its config does not build a model ({first})") from None
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size > _max_model_bytes():
        raise RunError(
            f"{where}: its config describes a model of {size / 2**30:.1f} GiB, over the "
            f"{_max_model_bytes() / 2**30:.1f} GiB bound ($SEQREC_MAX_MODEL_BYTES)"
        )
    return model


def shape_mismatch(state: dict[str, torch.Tensor], model: torch.nn.Module) -> str | None:
    """The first tensor of `state` that `model` does not hold in that shape, as
    "key: (shape) given, (shape) expected"; None when they fit."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if expected == got:
        return None
    key = next(k for k in sorted(expected.keys() | got.keys()) if expected.get(k) != got.get(k))
    return f"{key}: {got.get(key, 'missing')} given, {expected.get(key, 'none')} expected"


def _check_state(state: Any, shaped: SequenceModel, where: Path) -> None:
    """The weights must be the tensors the config's model holds, shape for shape."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RunError(f"{where}: damaged (not a model's weights)")
    mismatch = shape_mismatch(state, shaped)
    if mismatch:
        raise RunError(f"{where}: the weights do not fit the run's config ({mismatch})")


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu", *, trust: bool = False
) -> Run:
    """The single load path: config + vocab + the best weights (model.pt, or the best state of
    an unfinished run's checkpoint), in eval mode. Every file is checked against the run's
    manifest first (`trust`: a run without one is loaded unchecked), the config's values against
    their ranges, the model's size against a bound and the weights' shapes against the config,
    all before the model is allocated."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir, trust=trust)
    source = read_source(run_dir, trust=trust)
    vocab = read_vocab(run_dir, trust=trust)
    item_ids = vocab["items"]
    n_users = int(vocab.get("n_users", 0))
    shaped = _shaped_model(cfg, len(item_ids), n_users, run_dir / CONFIG)
    if (run_dir / WEIGHTS).exists():
        state, where = _verified(run_dir, WEIGHTS, trust=trust), run_dir / WEIGHTS
    else:
        ckpt = read_checkpoint(run_dir, trust=trust)
        if ckpt is None:
            raise ConfigError(f"{run_dir}: the run has no weights yet ({WEIGHTS}, {CHECKPOINT})")
        state, where = ckpt.get("best_state") or ckpt.get("model"), run_dir / CHECKPOINT
    _check_state(state, shaped, where)
    model = build_model(cfg, len(item_ids), n_users)
    model.load_state_dict(state)
    model.to(device).eval()
    return Run(run_dir, cfg, model, item_ids, read_metrics(run_dir, trust=trust), source)
