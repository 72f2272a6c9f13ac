"""Export a run's model for serving without seqrec: a graph from padded histories to scores.

    seqrec export runs/sasrec --format onnx            # -> runs/sasrec/model.onnx
    seqrec export runs/sasrec --format torchscript     # -> runs/sasrec/model.ts
    seqrec export runs/sasrec --quantize int8          # -> runs/sasrec/model.int8.onnx

The exported graph takes `histories`, (B, L) int64, left-padded with 0, most recent item last,
1 <= L <= the model's max_len (a longer history: keep its last max_len items), and returns
`scores`, (B, n_items + 1) float32, where column i scores the item
`RunDir(run).vocab()["items"][i - 1]` and column 0 (padding) is -inf: exactly `model.score`,
what evaluation ranks by.

`quantize` (ONNX only) writes a smaller graph with ONNX Runtime's tools: "int8", its matrix
products' weights as 8-bit integers with activations quantized as they run
(`quantize_dynamic`, per channel); "fp16", every float weight and activation in half precision,
the input and output kept as they are. For a model whose score is a dot product with its output
layer, the quantized graph holds that layer as one (D, n_items) constant, so that the product
over the catalogue, the cost that grows with it, is the one quantized. What each costs in
quality and gains in speed is measured (`python benchmarks/speed.py quantized`,
docs/scaling.md).
"""

from __future__ import annotations

import io
import logging
import math
import tempfile
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

__all__ = ["FORMATS", "QUANTIZED", "export_run"]

FORMATS = {"onnx": "model.onnx", "torchscript": "model.ts"}  # format -> default file name
QUANTIZED = {"int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}  # quantize -> default file


class _Scores(nn.Module):
    """histories (B, L) -> scores (B, n_items + 1): the model's `score`, as a plain forward."""

    def __init__(self, model: SequenceModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, histories: torch.Tensor) -> torch.Tensor:
        scores: torch.Tensor = self.model.score(histories)
        return scores


class _ConstantOutput(nn.Module):
    """`_Scores` with the output layer as one (D, n_items) constant (and the bias): the product
    over the catalogue is then a MatMul of the features by a weight, what ONNX Runtime's
    quantization converts."""

    item_weights_t: torch.Tensor
    item_bias: torch.Tensor | None

    def __init__(self, model: SequenceModel) -> None:
        super().__init__()
        self.model = model
        weight, bias = model.output_weights()
        self.register_buffer("item_weights_t", weight.detach().T.contiguous().clone())
        self.register_buffer("item_bias", None if bias is None else bias.detach().clone())

    def forward(self, histories: torch.Tensor) -> torch.Tensor:
        features = self.model.output_features(self.model.user_vector(histories))
        scores = features @ self.item_weights_t
        if self.item_bias is not None:
            scores = scores + self.item_bias
        return torch.cat([torch.full_like(scores[:, :1], -math.inf), scores], dim=1)


def export_run(
    run_dir: str | Path,
    fmt: Literal["onnx", "torchscript"] = "onnx",
    out: str | Path | None = None,
    *,
    quantize: Literal["int8", "fp16"] | None = None,
    replace: bool = False,
    trust: bool = False,
) -> Path:
    """Write the run's best model in `fmt` (`quantize`: a quantized ONNX graph, see above);
    returns the file (default: inside the run, where it is replaced). An `out` elsewhere that
    exists is replaced only with `replace`; one of the run's own files is refused
    (seqrec.outputs)."""
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if quantize is not None and quantize not in QUANTIZED:
        raise ConfigError(f"quantize {quantize!r}: expected one of {', '.join(QUANTIZED)}")
    if quantize is not None and fmt != "onnx":
        raise ConfigError(f"--quantize {quantize} writes an ONNX graph: use --format onnx")
    default = QUANTIZED[quantize] if quantize else FORMATS[fmt]
    path = Path(out) if out else Path(run_dir) / default
    check_out_file(path, replace=replace)
    run = load_run(run_dir, trust=trust)
    if fmt == "onnx" and not run.model.onnx_export:
        raise ConfigError(
            f"{run_dir}: torch's ONNX exporter cannot convert a {run.config.model} model; "
            "export it with --format torchscript"
        )
    if run.model.uses_times:
        raise ConfigError(
            f"{run_dir}: a model of time ({run.config.model} with its time bias) reads each "
            "history's times, which an exported graph does not take; serve it with seqrec serve"
        )
    constant = quantize is not None and run.model.dot_product_output
    wrapper = (_ConstantOutput(run.model) if constant else _Scores(run.model)).eval()
    # a model that reads one item (FPMC) or none (BPR-MF, NCF) still takes (B, L) histories
    max_len = max(int(run.model.max_len), 2)
    example = torch.randint(1, len(run.item_ids) + 1, (2, min(8, max_len)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' progress chatter and deprecations
        if fmt == "onnx":
            data = _export_onnx(wrapper, example, max_len)
            if quantize is not None:
                data = _quantized(data, quantize)
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


def _quantized(data: bytes, kind: str) -> bytes:
    """An fp32 ONNX graph quantized by ONNX Runtime's tools (see the module's docstring)."""
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError:
        raise ConfigError(
            "a quantized export needs onnx and onnxruntime: pip install 'seqrec[export]'"
        ) from None
    if kind == "fp16":
        half = convert_float_to_float16(onnx.load_from_string(data), keep_io_types=True)
        return bytes(half.SerializeToString())
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(data)
        quant_log = logging.getLogger()  # its advice to pre-process goes to the root logger
        level = quant_log.level
        quant_log.setLevel(logging.ERROR)
        try:
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            quant_log.setLevel(level)
        return dst.read_bytes()
