"""Writing a prepared directory: every file into a temporary folder beside it, then the folder
moved into place (a prepared dataset it replaces is moved aside first), so that a reader sees
the old directory or the new one, never a mixture."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec.data.prepared_items import ITEMS_FILE
from seqrec.data.preprocess import Preprocessed
from seqrec.files import write_failed
from seqrec.outputs import check_out_dir

__all__ = ["write_atomically"]


def write_atomically(
    out: Path,
    pre: Preprocessed,
    manifest: dict[str, Any],
    negatives: dict[str, np.ndarray],
    before: np.ndarray | None = None,
    items: bytes | None = None,
) -> None:
    """`out` made to hold the prepared files (`items`: the bytes of its items file, if any)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    except OSError as err:
        raise write_failed(err, out) from None
    try:
        write_files(tmp, out, pre, manifest, negatives, before, items)
    except (OSError, pl.exceptions.PolarsError) as err:  # a full disk, a lost mount: one line
        raise write_failed(err, out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_files(
    tmp: Path,
    out: Path,
    pre: Preprocessed,
    manifest: dict[str, Any],
    negatives: dict[str, np.ndarray],
    before: np.ndarray | None,
    items: bytes | None,
) -> None:
    """The prepared files into `tmp`, then `tmp` moved to `out`."""
    seqs = pre.sequences
    columns: dict[str, np.ndarray] = {
        "user": seqs.user_index().astype(np.int32),
        "item": seqs.items.astype(np.int32),
    }
    if seqs.times is not None:  # the log's timestamps (a time-aware model reads them)
        columns["timestamp"] = seqs.times.astype(np.int64)
    if before is not None:  # the time split: whether each item comes after the cut
        columns["after_cut"] = seqs.position_index() >= np.repeat(before, seqs.lengths)
    pl.DataFrame(columns).write_parquet(tmp / "sequences.parquet")
    vocab = {"users": pre.user_ids.to_list(), "items": pre.item_ids.to_list()}
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    (tmp / "stats.json").write_text(json.dumps(manifest["stats"], indent=2) + "\n")
    with (tmp / "negatives.npz").open("wb") as f:
        arrays: dict[str, Any] = {k: v.astype(np.int32, copy=False) for k, v in negatives.items()}
        np.savez(f, **arrays)
    if items is not None:
        (tmp / ITEMS_FILE).write_bytes(items)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists() and any(out.iterdir()):
        # only a prepared dataset is ever replaced (checked again: nothing was added to it)
        check_out_dir(out, "prepared")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)  # a new name, or an empty directory's
