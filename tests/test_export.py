"""Export: the ONNX graph run by onnxruntime, and the TorchScript module, give PyTorch's top-10
for real histories of the data the model was trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.data.prepared import load_prepared
from seqrec.errors import ConfigError
from seqrec.evaluation.protocols import pad_histories
from seqrec.serving.export import export_run
from seqrec.training.checkpoint import load_run


def _histories(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-split histories of 64 users (varied lengths) and the model's scores for them."""
    run = load_run(run_dir)
    ds = load_prepared(run.source["prepared"])
    eval_set = ds.split.eval_set("test")
    rows = np.arange(64)
    h = torch.from_numpy(pad_histories(eval_set.histories, rows, run.model.max_len))  # type: ignore[arg-type]
    return h, run.model.score(h)  # type: ignore[operator]


# caser, bpr-mf: models with a per-user term, exported as they score an anonymous history
@pytest.mark.parametrize("model", ["sasrec", "bert4rec", "caser", "bpr-mf"])
def test_onnx_top10_equals_pytorch(model: str, tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / f"{model}.onnx"
    assert main(["export", str(tiny_runs[model]), "--format", "onnx", "--out", str(out)]) == 0
    h, want = _histories(tiny_runs[model])
    session = ort.InferenceSession(str(out))
    for rows in (slice(0, 64), slice(5, 6)):  # a batch and a single history, other shapes
        got = session.run(["scores"], {"histories": h[rows].numpy()})[0]
        assert got.shape == (h[rows].shape[0], want.shape[1]) and np.isneginf(got[:, 0]).all()
        top_got = np.argsort(-got, axis=1, kind="stable")[:, :10]
        top_want = torch.topk(want[rows], 10).indices.numpy()
        assert (top_got == top_want).all()
        assert np.allclose(got[:, 1:], want[rows][:, 1:].numpy(), atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")
def test_torchscript_equals_pytorch(tiny_runs: dict[str, Path]) -> None:
    assert main(["export", str(tiny_runs["bert4rec"]), "--format", "torchscript"]) == 0
    path = tiny_runs["bert4rec"] / "model.ts"  # the default place: inside the run
    module = torch.jit.load(str(path))
    h, _ = _histories(tiny_runs["bert4rec"])
    h = h[:17, -7:]  # another batch size and width than the traced example
    want = load_run(tiny_runs["bert4rec"]).model.score(h)  # type: ignore[operator]
    got = module(h)
    assert torch.equal(torch.topk(got, 10).indices, torch.topk(want, 10).indices)
    assert torch.allclose(got[:, 1:], want[:, 1:], atol=1e-5)
    path.unlink()


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")
def test_gru4rec_exports_to_torchscript_and_says_onnx_cannot(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    run_dir = tiny_runs["gru4rec"]
    with pytest.raises(
        ConfigError, match="cannot convert a gru4rec model; export it with --format torchscript"
    ):
        export_run(run_dir, "onnx", tmp_path / "g.onnx")
    assert not (tmp_path / "g.onnx").exists()
    path = export_run(run_dir, "torchscript", tmp_path / "g.ts")
    h, want = _histories(run_dir)
    got = torch.jit.load(str(path))(h)
    assert torch.equal(torch.topk(got, 10).indices, torch.topk(want, 10).indices)


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_quantized_exports_score_as_pytorch_does_within_their_precision(
    model: str, tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    h, want = _histories(tiny_runs[model])
    scale = float(want[:, 1:].abs().max())
    for kind, tolerance in (("fp16", 5e-3), ("int8", 3e-2)):
        out = tmp_path / f"{model}.{kind}.onnx"
        argv = ["export", str(tiny_runs[model]), "--quantize", kind, "--out", str(out)]
        assert main(argv) == 0
        got = ort.InferenceSession(str(out)).run(["scores"], {"histories": h.numpy()})[0]
        assert got.dtype == np.float32 and got.shape == tuple(want.shape)
        assert np.isneginf(got[:, 0]).all()
        # within the precision's error of PyTorch's fp32 scores, relative to their scale
        assert np.abs(got[:, 1:] - want[:, 1:].numpy()).max() <= tolerance * scale, kind
        # the top item of each history is one of PyTorch's top 3
        top3 = torch.topk(want, 3).indices.numpy()
        assert np.mean([g in t for g, t in zip(got.argmax(1), top3, strict=True)]) >= 0.95
        graph = onnx.load(str(out))
        weights = {i.name: i for i in graph.graph.initializer}
        if kind == "int8":  # the output layer over the catalogue is the one quantized
            ops = {n.op_type for n in graph.graph.node}
            assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
            quantized = [w for name, w in weights.items() if name.startswith("item_weights_t")]
            assert any(w.data_type == onnx.TensorProto.INT8 for w in quantized)
        else:
            assert any(w.data_type == onnx.TensorProto.FLOAT16 for w in weights.values())


def test_a_quantized_export_goes_in_the_run_by_default_and_needs_onnx(
    tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    run = tiny_runs["sasrec"]
    assert main(["export", str(run), "--quantize", "int8"]) == 0
    assert (run / "model.int8.onnx").is_file()  # a run output: replaced freely
    assert main(["export", str(run), "--quantize", "int8"]) == 0
    (run / "model.int8.onnx").unlink()
    capsys.readouterr()
    assert main(["export", str(run), "--format", "torchscript", "--quantize", "fp16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--format onnx" in err
    with pytest.raises(ConfigError, match="quantize 'int4'"):
        export_run(run, quantize="int4")  # type: ignore[arg-type]
