"""Attention heat-maps (BERT4Rec Figure 2): the weights recomputed from a layer's inputs are the
ones its fused attention used, causality and the [MASK] position show, and the command writes
the figure and its numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from seqrec.cli import main
from seqrec.experiments.attention import _weights, attention_maps
from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig, SelfAttention
from seqrec.models.sasrec import CausalSelfAttention, SASRec, SASRecConfig


def _bert() -> BERT4Rec:
    torch.manual_seed(0)
    return BERT4Rec(20, BERT4RecConfig(max_len=12, d_model=16, n_layers=2, n_heads=2)).eval()


def _sasrec() -> SASRec:
    torch.manual_seed(0)
    return SASRec(20, SASRecConfig(max_len=12, d_model=16, n_layers=2, n_heads=2)).eval()


def test_the_recomputed_weights_are_the_ones_the_layer_used() -> None:
    """weights @ values, through the layer's output projection, gives the layer's own output."""
    torch.manual_seed(1)
    bert = _bert()
    attn = bert.layers[0].attn
    assert isinstance(attn, SelfAttention)
    x = torch.randn(3, 12, 16)
    keep = torch.ones(3, 1, 1, 12, dtype=torch.bool)
    keep[0, ..., :4] = False  # a padded row
    w = _weights(attn, (x, keep))
    v = attn.qkv(x).view(3, 12, 3, 2, 8)[:, :, 2].transpose(1, 2)
    rebuilt = attn.out((w @ v).transpose(1, 2).reshape(3, 12, 16))
    assert torch.allclose(rebuilt, attn(x, keep), atol=1e-5)
    assert torch.all(w[0, :, :, :4] == 0)  # padding gets no weight

    sas = _sasrec()
    cattn = sas.layers[0].attn
    assert isinstance(cattn, CausalSelfAttention)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()[None, None].expand(3, 1, 12, 12)
    w = _weights(cattn, (x, x, causal))
    v = cattn.kv(x).view(3, 12, 2, 2, 8)[:, :, 1].transpose(1, 2)
    rebuilt = (w @ v).transpose(1, 2).reshape(3, 12, 16)
    assert torch.allclose(rebuilt, cattn(x, x, causal), atol=1e-5)


def test_maps_are_averages_whose_rows_sum_to_one_and_respect_causality() -> None:
    histories = torch.randint(1, 21, (5, 12))
    sas = attention_maps(_sasrec(), histories, last=12)
    assert sas.weights.shape == (2, 2, 12, 12) and sas.users == 5 and not sas.mask_last
    assert torch.allclose(torch.as_tensor(sas.weights).sum(-1), torch.ones(2, 2, 12), atol=1e-5)
    assert float(torch.as_tensor(sas.weights).triu(1).abs().max()) == 0.0  # no future key
    bert = attention_maps(_bert(), histories[:, 1:], last=12)  # 11 items + the [MASK]
    assert bert.mask_last and bert.users == 5
    weights = torch.as_tensor(bert.weights)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 12), atol=1e-5)
    assert float(weights.triu(1).max()) > 0.01  # bidirectional: later keys get weight


def test_only_inputs_that_fill_the_last_positions_are_averaged() -> None:
    histories = torch.randint(1, 21, (4, 12))
    histories[0, :8] = 0  # 4 items: too short for last = 6
    full = attention_maps(_sasrec(), histories[1:], last=6)
    mixed = attention_maps(_sasrec(), histories, last=6)
    assert (mixed.users, full.users) == (3, 3)
    assert torch.allclose(torch.as_tensor(mixed.weights), torch.as_tensor(full.weights))
    with pytest.raises(ValueError, match="no input fills the last 13 positions"):
        attention_maps(_sasrec(), histories, last=13)


def test_the_command_writes_the_figure_and_its_numbers(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    figure = tmp_path / "fig" / "attention.png"
    argv = ["attention", str(tiny_runs["bert4rec"]), "--data", str(tiny_runs["data"])]
    assert main([*argv, "--last", "5", "--figure", str(figure), "--quiet"]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    numbers = json.loads(figure.with_suffix(".json").read_text())
    assert numbers["mask_last"] is True and numbers["last"] == 5 and numbers["users"] > 0
    layers = numbers["weights"]
    assert all(len(h) == 5 and all(len(r) == 5 for r in h) for layer in layers for h in layer)
    assert all(
        0 <= x <= 1 + 1e-6 and not math.isnan(x)
        for layer in layers
        for h in layer
        for r in h
        for x in r
    )
    assert main([*argv, "--users", "no-such-user", "--figure", str(figure)]) == 2
