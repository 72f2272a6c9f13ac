"""Export a run's model for serving without seqrec: a graph from padded histories to scores.

    seqrec export runs/sasrec --format onnx            # -> runs/sasrec/model.onnx
    seqrec export runs/sasrec --format torchscript     # -> runs/sasrec/model.ts

The exported graph takes `histories`, (B, L) int64, left-padded with 0, most recent item last,
1 <= L <= the model's max_len (a longer history: keep its last max_len items), and returns
`scores`, (B, n_items + 1) float32, where column i scores the item
`RunDir(run).vocab()["items"][i - 1]` and column 0 (padding) is -inf: exactly `model.score`,
what evaluation ranks by.
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from seqrec.errors import ConfigError
from seqrec.models.base import SequenceModel
from seqrec.outputs import check_out_file
from seqrec.provenance import atomic_write
from seqrec.training.checkpoint import load_run

__all__ = ["FORMATS", "export_run"]

FORMATS = {"onnx": "model.onnx", "torchscript": "model.ts"}  # format -> default file name


class _Scores(nn.Module):
    """histories (B, L) -> scores (B, n_items + 1): the model's `score`, as a plain forward."""

    def __init__(self, model: SequenceModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, histories: torch.Tensor) -> torch.Tensor:
        scores: torch.Tensor = self.model.score(histories)
        return scores


def export_run(
    run_dir: str | Path,
    fmt: Literal["onnx", "torchscript"] = "onnx",
    out: str | Path | None = None,
    *,
    replace: bool = False,
    trust: bool = False,
) -> Path:
    """Write the run's best model in `fmt`; returns the file (default: inside the run, where it
    is replaced). An `out` elsewhere that exists is replaced only with `replace`; one of the run's
    own files is refused (seqrec.outputs)."""
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    path = Path(out) if out else Path(run_dir) / FORMATS[fmt]
    check_out_file(path, replace=replace)
    run = load_run(run_dir, trust=trust)
    if fmt == "onnx" and not run.model.onnx_export:
        raise ConfigError(
            f"{run_dir}: torch's ONNX exporter cannot convert a {run.config.model} model; "
            "export it with --format torchscript"
        )
    wrapper = _Scores(run.model).eval()
    # a model that reads one item (FPMC) or none (BPR-MF, NCF) still takes (B, L) histories
    max_len = max(int(run.model.max_len), 2)
    example = torch.randint(1, len(run.item_ids) + 1, (2, min(8, max_len)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' progress chatter and deprecations
        if fmt == "onnx":
            data = _export_onnx(wrapper, example, max_len)
        else:
            buf = io.BytesIO()
            torch.jit.save(torch.jit.trace(wrapper, (example,), check_trace=False), buf)
            data = buf.getvalue()
    # serialised in memory, written by atomic_write: a full disk is one line naming the file,
    # never a half-written file (torch's own file writers abort the process on ENOSPC)
    atomic_write(path, lambda f: f.write(data))
    return path


def _export_onnx(model: nn.Module, example: torch.Tensor, max_len: int) -> bytes:
    try:
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError:
        raise ConfigError(
            "ONNX export needs onnx and onnxscript: pip install 'seqrec[export]'"
        ) from None
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    length = torch.export.Dim("length", min=1, max=max_len)
    # the exporter's own notices (torch 2.14 warns of every torchvision operator it cannot
    # register) are not the user's business: only errors reach the log while it runs
    onnx_log = logging.getLogger("torch.onnx")
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        program = torch.onnx.export(
            model,
            (example,),
            input_names=["histories"],
            output_names=["scores"],
            dynamic_shapes=({0: batch, 1: length},),
            dynamo=True,
            verbose=False,
        )
    finally:
        onnx_log.setLevel(level)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    return bytes(program.model_proto.SerializeToString())
