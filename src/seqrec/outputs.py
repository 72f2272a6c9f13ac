"""Where a command may write: the one check every `--out` goes through before anything is read
or written, so that seqrec never deletes or overwrites what it did not create.

A directory seqrec made is recognised by its kind's marker file and by holding nothing but that
kind's own files (a user's file dropped into it makes it the user's again):

    prepared   manifest.json (with its "key") + sequences.parquet, vocab.json, stats.json,
               negatives.npz, and items.npz when prepared with an items table
    run        its config (+ the run files of seqrec.training.rundir)

Rules (docs/design/reliability.md lists the test of each):
- an output directory that exists must be empty or a directory of the same kind; one of the same
  kind is replaced only when the caller says so (`--force`);
- an output, directory or file, may not be or contain a path the command reads (the data file,
  a run directory) and may not be a file inside a seqrec directory;
- an output file that exists is replaced only when the caller says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from seqrec.errors import ConfigError
from seqrec.files import bound, read_checked

__all__ = ["PREPARED_FILES", "check_out_dir", "check_out_file", "dir_kind"]

Kind = Literal["prepared", "run"]

# the files of a run directory (seqrec.training.rundir.RunDir owns them)
CONFIG, VOCAB, CHECKPOINT, PREVIOUS, WEIGHTS = (
    "config.json",
    "vocab.json",
    "checkpoint.pt",
    "checkpoint.prev.pt",
    "model.pt",
)
METRICS, LOG, LOG_CSV, CODE_DIFF, DIGESTS, LOCK = (
    "metrics.json",
    "log.jsonl",
    "log.csv",
    "code.diff",
    "sha256.json",
    ".lock",
)
ITEMS = "items.npz"  # the item features' encoder and the run's items' features
INDEX = "index.bin"  # an HNSW index of the output item vectors (seqrec.serving.index)
EVENTS = "tensorboard"  # a folder: TensorBoard's event files (train.tensorboard)
PENDING = ".pending"  # in the manifest: the digests of files being put in place (_commit)
RUN_MARKER = CONFIG  # the file that makes a directory a run's
# what commands on a run write into it as outputs: seqrec's own, replaced freely
RUN_OUTPUTS = frozenset(
    {"attention.png", "attention.json", "model.onnx", "model.ts", "curves.png"}
    | {"model.int8.onnx", "model.fp16.onnx"}
)
# everything seqrec writes into a run directory (this module tells a run
# from a user's folder)
RUN_FILES = frozenset(
    {CONFIG, VOCAB, CHECKPOINT, PREVIOUS, WEIGHTS, METRICS, LOG, LOG_CSV, CODE_DIFF, DIGESTS, LOCK}
    | {EVENTS, ITEMS, INDEX}
    | RUN_OUTPUTS
)


PREPARED_FILES = frozenset(
    {"manifest.json", "sequences.parquet", "vocab.json", "stats.json", "negatives.npz", "items.npz"}
)
_MARKERS: dict[Kind, str] = {"prepared": "manifest.json", "run": RUN_MARKER}
_FILES: dict[Kind, frozenset[str]] = {"prepared": PREPARED_FILES, "run": RUN_FILES}


def _is_marker(path: Path, kind: Kind) -> bool:
    if kind == "run":
        return path.is_file()
    try:  # a prepared dataset's manifest records the key it was prepared under
        manifest = read_checked(path, bound("config"), root=path.parent)
        return isinstance(json.loads(manifest).get("key"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def dir_kind(path: Path) -> Kind | None:
    """The kind of seqrec directory `path` is, or None (not a directory, empty, or holding
    anything seqrec did not write there). Temporary files of an interrupted write (`.name.*`)
    count as the kind's own."""
    if not path.is_dir():
        return None
    names = {p.name for p in path.iterdir()}
    for kind, marker in _MARKERS.items():
        own = _FILES[kind]
        if marker in names and _is_marker(path / marker, kind):
            strays = [n for n in names if n not in own and not _temporary(n, own)]
            if not strays:
                return kind
    return None


def _unstarted_run(out: Path, names: set[str]) -> bool:
    """A run killed before its config was written: its lock, the temporary files of the writes
    it was making and, at most, its manifest with the config pending (seqrec's leftovers only,
    which the next training there takes over)."""
    rest = {n for n in names if n != LOCK and not _temporary(n, RUN_FILES)}
    if not rest:
        return True
    if rest != {DIGESTS}:
        return False
    try:
        manifest = json.loads(read_checked(out / DIGESTS, bound("manifest"), root=out))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and set(manifest) <= {*RUN_FILES, PENDING}


def _temporary(name: str, own: frozenset[str]) -> bool:
    return name.startswith(".") and any(name.lstrip(".").startswith(f"{n}.") for n in own)


def _overlap(out: Path, inputs: Iterable[Path | str | None]) -> Path | None:
    """The first input that `out` is, or contains."""
    target = out.resolve()
    for p in inputs:
        if p is None:
            continue
        src = Path(p).resolve()
        if src == target or target in src.parents:
            return Path(p)
    return None


def check_out_dir(out: Path, kind: Kind, *, inputs: Iterable[Path | str | None] = ()) -> bool:
    """Refuse (ConfigError, one line) an output directory that a command may not write; True
    when `out` already is a directory of `kind` (the caller reuses it, or replaces it when told
    to), False when it is new or empty."""
    hit = _overlap(out, inputs)
    if hit is not None:
        raise ConfigError(
            f"--out {out}: is or contains {hit}, which this command reads; choose another --out"
        )
    if not out.exists():
        _check_parent(out)
        return False
    if not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory; choose another --out")
    names = {p.name for p in out.iterdir()}
    if not names or (kind == "run" and _unstarted_run(out, names)):
        return False  # empty, or a run that was killed before its config was written
    found = dir_kind(out)
    if found == kind:
        return True
    what = f"a seqrec {found} directory" if found else "files seqrec did not write"
    raise ConfigError(
        f"--out {out}: holds {what}, not a {kind} directory; seqrec replaces only its own "
        "(choose a new or empty --out)"
    )


def check_out_file(
    out: Path, *, replace: bool = False, inputs: Iterable[Path | str | None] = ()
) -> None:
    """Refuse (ConfigError, one line) an output file that a command may not write: a directory,
    an input, one of a seqrec directory's own data files, or an existing file without
    `replace`. The outputs that commands write into a run (attention.png, model.onnx, ...)
    are seqrec's own there and are replaced."""
    hit = _overlap(out, inputs)
    if hit is not None:
        raise ConfigError(f"{out}: is {hit}, which this command reads; choose another path")
    if out.is_dir():
        raise ConfigError(f"{out}: is a directory; expected a file path")
    kind = dir_kind(out.parent)
    if kind is not None and out.name in _FILES[kind]:
        if out.name not in _OUTPUTS_IN[kind]:
            raise ConfigError(
                f"{out}: is a file of the seqrec {kind} directory {out.parent}; choose another path"
            )
    elif out.exists() and not replace:
        raise ConfigError(f"{out}: exists; --force replaces it")
    _check_parent(out)


_OUTPUTS_IN: dict[Kind, frozenset[str]] = {"prepared": frozenset(), "run": RUN_OUTPUTS}


def _check_parent(out: Path) -> None:
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{out}: {parent} is a file, not a directory")
