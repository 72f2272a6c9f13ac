"""The run directory: everything a training run leaves behind. `RunDir` is the one owner of its
files: no other module opens one by name. (seqrec.training.checkpoint builds a model from one.)

    config.json     the resolved RunConfig (defaults -> file -> --set), plus the data it ran on
                    (`source`: the data, its prepared directory, what a refit started from)
    items.npz       only for a run with item features: the encoder fitted on the items table
                    and the features of the run's items, row i for internal item i
                    (seqrec.data.item_features)
    index.bin       only with an item index: an HNSW graph of the output vectors
                    (seqrec.serving.index)
    vocab.json      {"items": [external ids], "popularity": [training counts], "n_users"}:
                    internal item i is items[i - 1]; popularity[i] its training interactions
    checkpoint.pt   the last finished epoch: weights, optimiser, schedule, best state, history
    checkpoint.prev.pt  the epoch before: what `--resume` falls back to when the last is damaged
    model.pt        the best weights (chosen on validation), written when the run ends
    metrics.json    validation and test metrics for every protocol, wall time, epochs, commit,
                    machine, seed
    log.jsonl       one line per epoch: loss, learning rate, sequences/s, validation metric
    log.csv         the same, a row per epoch (for spreadsheets and plotting tools)
    tensorboard/    with train.tensorboard: the same scalars as TensorBoard event files
    code.diff       only when the run started from a checkout with uncommitted changes: that
                    change, so the run's numbers can be traced to its exact code
    sha256.json     the manifest: the sha256 of every file a loader reads (config, vocab,
                    metrics, weights), by file name. A file loads only if its digest is the one
                    recorded for its name (or, while a file is being replaced, the one recorded
                    as pending for it); a run without the manifest loads only when trusted
                    (`--trust`: hand-made runs, runs of older versions)
    .lock           while a training runs in it: its pid, its process's start time and its
                    host; held with `fcntl.flock` (RunDir.lock)

Every file is written to a temporary name and renamed into place. What the manifest protects
against is damage (a truncated, half-written, swapped or edited file), not an attacker who can
write the directory: such a one can rewrite the manifest too (docs/design/reliability.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import torch

from seqrec.data import ids
from seqrec.errors import ConfigError, DataError, RunError
from seqrec.files import (
    bound,
    checked_open,
    hash_file,
    identity,
    json_object,
    read_checked,
    read_hashed,
)
from seqrec.outputs import (
    CHECKPOINT,
    CODE_DIFF,
    CONFIG,
    DIGESTS,
    EVENTS,
    INDEX,
    ITEMS,
    LOCK,
    LOG,
    LOG_CSV,
    METRICS,
    PENDING,
    PREVIOUS,
    RUN_FILES,
    RUN_MARKER,
    RUN_OUTPUTS,
    VOCAB,
    WEIGHTS,
)
from seqrec.provenance import atomic_write, write_json
from seqrec.training.events import EventLog
from seqrec.training.lock import hold
from seqrec.training.manifest import covered, load_tensors, read_digests, save_hashed, verify
from seqrec.training.sizes import index_file_bytes, memory

if TYPE_CHECKING:
    from seqrec.config import RunConfig
    from seqrec.data.item_features import ItemEncoder, ItemFeatures

__all__ = ["RUN_FILES", "RUN_MARKER", "RUN_OUTPUTS", "RunDir"]

# the size bound (seqrec.files.bound) of each file read whole
_KINDS = {
    CONFIG: "config",
    VOCAB: "vocab",
    METRICS: "metrics",
    ITEMS: "item_features",
}

# Keys added to the configs after runs were written whose default is not what those runs did:
# (section, key) -> the value an older run directory without the key was trained with.
_BEFORE_ADDED = {("bert4rec", "head_norm"): False}


class RunDir:
    """One run directory. `trust`: load what the manifest does not cover (a run made by hand or
    by an older seqrec); a file whose recorded digest differs is refused all the same."""

    def __init__(self, path: str | Path, *, trust: bool = False) -> None:
        self.path = Path(path)
        self.trust = trust
        self._parameter_bytes: int | None = None  # the weights' bound's base (_weights_bound)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------------------- state

    @property
    def config_path(self) -> Path:
        """Where the config is (for messages about it)."""
        return self.path / CONFIG

    @property
    def started(self) -> bool:
        """A run was started here (its config is written)."""
        return (self.path / CONFIG).exists()

    @property
    def finished(self) -> bool:
        return (self.path / METRICS).exists()

    @property
    def has_checkpoint(self) -> bool:
        return (self.path / CHECKPOINT).exists() or (self.path / PREVIOUS).exists()

    # ------------------------------------------------------------------------------- writing

    def start(
        self,
        config: dict[str, Any],
        vocab: dict[str, Any],
        code_diff: str | None,
        items: bytes | None = None,
    ) -> None:
        """A new run's first files: its config (with `source`), its vocab, its item features
        (`items`, items_file_bytes) and, when the code had uncommitted changes, that diff. A start
        that fails (a full disk) takes back what it wrote: the directory is left as a run that
        never started."""
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._write_json(CONFIG, config)
            self._write_json(VOCAB, vocab)
            if items is not None:
                self._replace({ITEMS: items})
            if code_diff:  # the run's numbers stay traceable to its uncommitted code
                atomic_write(self.path / CODE_DIFF, lambda f: f.write(code_diff.encode()))
        except BaseException:
            for name in (CONFIG, VOCAB, ITEMS, CODE_DIFF, DIGESTS):
                (self.path / name).unlink(missing_ok=True)
            raise

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """The last finished epoch; the one before becomes `checkpoint.prev.pt`."""
        self._save_weights(CHECKPOINT, state)

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The best weights, when the run ends."""
        self._save_weights(WEIGHTS, state_dict)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        self._write_json(METRICS, metrics)

    def finish(self, metrics: dict[str, Any], *, keep_checkpoints: bool = False) -> None:
        """The run's metrics, which make it finished; its previous checkpoint is removed then
        (a finished run is not resumed: the last one, with the run's history, is kept) unless
        `keep_checkpoints`."""
        self.write_metrics(metrics)
        if not keep_checkpoints and (self.path / PREVIOUS).exists():
            (self.path / PREVIOUS).unlink()
            digests = self._digests(trust=True) or {}
            digests.pop(PREVIOUS, None)
            write_json(self.path / DIGESTS, digests)

    def write_log(self, history: Sequence[dict[str, Any]]) -> None:
        """The epochs so far: log.jsonl, and log.csv (a row an epoch; the validation column
        empty where an epoch was not validated) for spreadsheets and plotting tools."""
        text = "".join(json.dumps(h) + "\n" for h in history).encode()
        atomic_write(self.path / LOG, lambda f: f.write(text))
        buf = io.BytesIO()
        pl.from_dicts(list(history), infer_schema_length=None).write_csv(buf)
        atomic_write(self.path / LOG_CSV, lambda f: f.write(buf.getvalue()))

    def event_log(self) -> EventLog:
        """TensorBoard's writer for this run's tensorboard/ folder (a new events file per
        process: a resumed run adds one)."""
        return EventLog(self.path / EVENTS)

    def _write_json(self, name: str, obj: Any) -> None:
        data = (json.dumps(obj, indent=2) + "\n").encode()
        digest = hashlib.sha256(data).hexdigest()
        self._commit(
            {name: digest}, lambda: atomic_write(self.path / name, lambda f: f.write(data))
        )

    def add_items(self, vocab: dict[str, Any], items: bytes, state: dict[str, Any]) -> None:
        """A catalogue grown after training (`Recommender.add_items`): the vocab, the item
        features and the weights replaced together (`_replace`)."""
        buf = io.BytesIO()
        torch.save(state, buf)
        vocab_bytes = (json.dumps(vocab, indent=2) + "\n").encode()
        self._replace({VOCAB: vocab_bytes, ITEMS: items, WEIGHTS: buf.getvalue()})
        self._parameter_bytes = None

    def _replace(self, files: dict[str, bytes]) -> None:
        """Files ({name: bytes}) each written whole beside the old one first, their digests
        recorded as pending, then all moved into place (`_commit`); a failed write is one line
        and leaves the old files."""
        # names of this writer's own: a writer killed meanwhile leaves files that no other
        # writer overwrites or moves (the next lock holder removes them, RunDir.lock)
        token = f"{os.getpid()}-{os.urandom(4).hex()}"
        fresh = {name: self.path / f".{name}.{token}.new" for name in files}
        try:
            for name, data in files.items():
                atomic_write(fresh[name], lambda f, d=data: f.write(d))  # type: ignore[misc]

            def put() -> None:
                for name in files:
                    os.replace(fresh[name], self.path / name)

            self._commit({n: hashlib.sha256(d).hexdigest() for n, d in files.items()}, put)
        except OSError as err:
            for path in fresh.values():
                path.unlink(missing_ok=True)
            raise RunError(f"{self.path}: could not be written ({err.strerror or err})") from None

    def _save_weights(self, name: str, obj: Any) -> None:
        """Write a weight file and record its sha256. The new file is written whole beside the
        old one first; only then does a new checkpoint move the current one to `PREVIOUS` and
        take its place, each move recorded in the manifest before it is made (`_commit`). A
        crash or a full disk at any moment leaves the last good checkpoint loadable, and every
        file with a digest recorded for its name. A failed write is one line."""
        target, fresh = self.path / name, self.path / f".{name}.new"
        digest = hashlib.sha256()
        try:
            # streamed to the file and hashed as it goes: a checkpoint of a catalogue of
            # millions (the weights and Adam's moments) is never also held as bytes
            atomic_write(fresh, lambda f: save_hashed(obj, f, digest))
            changes = {name: digest.hexdigest()}
            moving = name == CHECKPOINT and target.exists()
            if moving:  # the current checkpoint becomes the previous one
                current = (self._digests(trust=True) or {}).get(CHECKPOINT)
                if current is not None:
                    changes[PREVIOUS] = current

            def put() -> None:
                if moving:
                    os.replace(target, self.path / PREVIOUS)
                os.replace(fresh, target)

            self._commit(changes, put)
        except OSError as err:
            fresh.unlink(missing_ok=True)
            raise RunError(
                f"{target}: could not be written ({err.strerror or err}); the last good "
                "checkpoint is kept"
            ) from None

    def _commit(self, changes: dict[str, str], write: Callable[[], None]) -> None:
        """Change files so that a crash at any moment leaves each with a digest the manifest
        accepts for its name: the new digests (`changes`, {name: sha256}) are recorded as
        pending first, then `write` puts the files in place, then they become the recorded
        ones."""
        digests = self._digests(trust=True) or {}
        digests.pop(PENDING, None)
        write_json(self.path / DIGESTS, {**digests, PENDING: changes})
        write()
        write_json(self.path / DIGESTS, {**digests, **changes})

    # ------------------------------------------------------------------------------- reading

    def config_dict(self) -> dict[str, Any]:
        """config.json as stored (verified): the resolved config and its `source`."""
        if not self.started:
            raise ConfigError(f"{self.path}: not a run directory (no {CONFIG})")
        return self._read_json(CONFIG)

    def config(self) -> RunConfig:
        """The run's config (verified, migrated from older layouts, every value range-checked
        by seqrec.config.check_ranges)."""
        from seqrec.config import RunConfig, check_ranges, from_dict

        path = self.path / CONFIG
        data = self.config_dict()
        data.pop("source", None)
        for (section, key), value in _BEFORE_ADDED.items():
            if isinstance(data.get(section), dict):
                data[section].setdefault(key, value)
        # before [[short_budget]]: bert4rec.dropout_min_minutes turned the hidden dropout off
        # for a shorter budget, at model build, so the file holds the config as given
        bert = data.get("bert4rec")
        minimum = bert.pop("dropout_min_minutes", 0.0) if isinstance(bert, dict) else 0.0
        if minimum and "short_budget" not in data:
            data["short_budget"] = [{"minutes": minimum, "set": ["bert4rec.dropout=0.0"]}]
        return check_ranges(from_dict(RunConfig, data, str(path), foreign="drop"), str(path))

    def source(self) -> dict[str, Any]:
        """What the run was trained from, as config.json records it (`data`, `prepared`, ...)."""
        return dict(self.config_dict().get("source") or {})

    def vocab(self) -> dict[str, Any]:
        """vocab.json (verified): `items`, and `popularity` and `n_users` where recorded; one
        line naming it when malformed."""
        path = self.path / VOCAB
        vocab = self._read_json(VOCAB)
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

    def item_features(self) -> tuple[ItemEncoder, ItemFeatures] | None:
        """items.npz (verified): the item encoder and the features of the run's items; None for
        a run without item features."""
        from seqrec.data.item_features import load_items_file

        if (data := self.read_file(ITEMS)) is None:
            return None
        try:
            return load_items_file(data, str(self.path / ITEMS))
        except DataError as err:
            raise RunError(str(err)) from None

    def read_file(self, name: str) -> bytearray | None:
        """items.npz or index.bin, verified; None when the run has none. Looked at first (no
        symlink out of the run, a regular file, within its bound: index.bin's what the run's
        parameters and catalogue imply, seqrec.training.sizes), read once and hashed as read."""
        path = self.path / name
        if not path.exists() and not path.is_symlink():
            return None
        limit, hint = bound(_KINDS.get(name, "index")), ""
        if name == INDEX:
            self._weights_bound(WEIGHTS)  # the parameters' bytes, computed once
            size = index_file_bytes(self._parameter_bytes or 0, len(self.vocab()["items"]))
            limit, hint = min(limit, size), "the bound the run's size implies for it"
        digests = self._digests(trust=self.trust)  # before the file: a writer records first
        data, digest = read_hashed(path, limit, root=self.path, error=RunError, hint=hint)
        if covered(digests, name, self.trust):
            self._verify(name, digest, digests)
        return data

    def save_index(self, data: bytes | None) -> None:
        """index.bin (seqrec.serving.index) written and recorded, or removed (None)."""
        if data is None:
            (self.path / INDEX).unlink(missing_ok=True)
        else:
            self._replace({INDEX: data})

    def check_items(self, item_ids: Sequence[Any], where: str | None = None) -> None:
        """The run was trained on these items (in this order), or one ConfigError line."""
        ids.check_items(self.vocab()["items"], item_ids, where or self.path)

    def metrics(self) -> dict[str, Any] | None:
        """A finished run's metrics.json; None while the run has not finished."""
        return self._read_json(METRICS) if self.finished else None

    def log(self) -> list[dict[str, Any]]:
        """One dict per epoch logged (none before the first)."""
        path = self.path / LOG
        if not path.exists() and not path.is_symlink():
            return []
        text = read_checked(path, bound("log"), root=self.path, error=RunError)
        rows = []
        for number, line in enumerate(text.decode(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                raise RunError(f"{path} line {number}: damaged (not an epoch's JSON object)")
            rows.append(row)
        return rows

    def code_diff(self) -> str | None:
        """The uncommitted change the run started from, if any."""
        path = self.path / CODE_DIFF
        if not path.exists() and not path.is_symlink():
            return None
        data = read_checked(path, bound("log"), root=self.path, error=RunError)
        return data.decode(errors="replace")  # shown as text, whatever bytes it holds

    def checkpoint(self) -> dict[str, Any] | None:
        """The last good checkpoint: checkpoint.pt, or, when it is damaged or was being written
        when the process died, the epoch before it (checkpoint.prev.pt, with a one-line notice
        on stderr). None when the run has none; a RunError when none is good."""
        if not self.has_checkpoint:
            return None
        errors = []
        for name in (CHECKPOINT, PREVIOUS):
            if not (self.path / name).exists():
                continue
            try:
                state = self._weights(name)
                if not isinstance(state, dict):
                    raise RunError(f"{self.path / name}: damaged (not a checkpoint)")
            except RunError as err:
                errors.append(str(err))
                continue
            if errors:
                print(f"{errors[0]}; using {name} (epoch {state.get('epoch')})", file=sys.stderr)
            return state
        raise RunError(
            errors[0] if len(errors) == 1 else f"{self.path}: no good checkpoint ({errors[0]})"
        )

    def best_weights(self) -> tuple[Any, Path]:
        """The weights to score with and the file they come from: model.pt, or the best state
        of an unfinished run's checkpoint."""
        if (self.path / WEIGHTS).exists():
            return self._weights(WEIGHTS), self.path / WEIGHTS
        ckpt = self.checkpoint()
        if ckpt is None:
            raise ConfigError(f"{self.path}: the run has no weights yet ({WEIGHTS}, {CHECKPOINT})")
        return ckpt.get("best_state") or ckpt.get("model"), self.path / CHECKPOINT

    def _weights(self, name: str) -> Any:
        """A weight file, looked at before it is read (no symlink out of the run, a regular
        file, no larger than the run's config implies), hashed as it streams and loaded from
        the same open file: never a second copy in memory."""
        path = self.path / name
        limit = self._weights_bound(name)
        hint = "the bound the run's config implies for it"
        digests = self._digests(trust=self.trust)  # before the file: a writer records first
        with checked_open(path, limit, root=self.path, error=RunError, hint=hint) as f:
            if covered(digests, name, self.trust):
                self._verify(name, hash_file(f), digests)
            return load_tensors(path, f)

    def _weights_bound(self, name: str) -> int:
        """The most bytes weight file `name` can hold for this run's config: its parameters as
        float32 (seqrec.training.sizes), four times over in a checkpoint (the weights, the best
        state, the optimiser's two moments), with room for the rest of a checkpoint (and for
        item features)."""
        if self._parameter_bytes is None:  # config and vocab are written once, at the start
            vocab = self.vocab()
            n_items, n_users = len(vocab["items"]), int(vocab.get("n_users", 0))
            self._parameter_bytes = memory(self.config(), n_items, n_users).parameters
        size = self._parameter_bytes
        # item features: in the weights too (the towers' buffers), with the towers' layers
        if (self.path / ITEMS).is_file():
            size += 2 * (self.path / ITEMS).stat().st_size
        return (1 if name == WEIGHTS else 4) * size + size // 20 + (64 << 20)

    def _read_json(self, name: str) -> dict[str, Any]:
        return json_object(self._read_verified(name), self.path / name, RunError)

    def _read_verified(self, name: str) -> bytes:
        """A JSON file's bytes, looked at before they are read (seqrec.files: no symlink out of
        the run, a regular file within its kind's bound), and only if their sha256 is the one
        the manifest records for the name."""
        digests = self._digests(trust=self.trust)  # before the file: a writer records first
        data = read_checked(self.path / name, bound(_KINDS[name]), root=self.path, error=RunError)
        if covered(digests, name, self.trust):
            self._verify(name, hashlib.sha256(data).hexdigest(), digests)
        return data

    def _verify(self, name: str, digest: str, digests: dict[str, Any] | None) -> None:
        verify(self.path, name, digest, digests)

    def _digests(self, *, trust: bool) -> dict[str, Any] | None:
        return read_digests(self.path, trust=trust)

    # ---------------------------------------------------------------------------------- lock

    def lock(
        self, *, break_lock: bool = False, wait: float = 0.0, what: str = "training"
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the directory for one writer (a training, a catalogue change: `what`): a second
        one waits up to `wait` seconds, then is refused in one line naming the holder
        (seqrec.training.lock.hold); half-written files a killed writer left are removed."""
        names = (CONFIG, VOCAB, ITEMS, INDEX, CHECKPOINT, WEIGHTS, METRICS, LOG, LOG_CSV, CODE_DIFF)
        return hold(
            self.path, self.path / LOCK, break_lock, (*names, DIGESTS), wait=wait, what=what
        )

    def catalogue_stamp(self) -> tuple[int, int, int] | None:
        """What identifies the catalogue on disk now (vocab.json's `identity`: every change
        replaces it): a reader that recorded it when it loaded sees another writer's change."""
        return identity(self.path / VOCAB)
