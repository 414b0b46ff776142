"""MaskBlock: FuxiCTR semantics, pluggable norms by name / NormSpec / class."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from ctrcal.core.norm_spec import NormSpec
from ctrcal.layers.mask_block import MaskBlock, reduced_width
from ctrcal.layers.mc_layernorm.module import MCLayerNorm


def test_reduced_width_is_an_exact_floor():
    assert reduced_width(624, 0.2) == 124
    assert reduced_width(400, 0.2) == 80
    assert reduced_width(100, 0.29) == 29  # int(100 * 0.29) would give 28
    assert reduced_width(10, 0.01) == 1


def test_structure_and_shapes():
    blk = MaskBlock(input_dim=30, hidden_dim=20, output_dim=12, reduction_ratio=0.5)
    first, act, second = blk.mask_layer
    assert (first.in_features, first.out_features) == (30, 10)
    assert isinstance(act, nn.ReLU)
    assert (second.in_features, second.out_features) == (10, 20)
    assert blk.hidden_layer.bias is None and blk.hidden_layer.in_features == 20
    assert isinstance(blk.norm, nn.LayerNorm) and blk.norm.normalized_shape == (12,)
    out = blk(torch.randn(4, 30), torch.randn(4, 20))
    assert out.shape == (4, 12) and (out >= 0).all()  # ends in ReLU


def test_forward_matches_the_formula():
    torch.manual_seed(0)
    blk = MaskBlock(6, 5, 3, reduction_ratio=2.0).eval()
    v_emb, v_hidden = torch.randn(2, 6), torch.randn(2, 5)
    w1, w2 = blk.mask_layer[0], blk.mask_layer[2]
    mask = w2(torch.relu(w1(v_emb)))  # no sigmoid on the mask
    expected = torch.relu(blk.norm(blk.hidden_layer(mask * v_hidden)))
    torch.testing.assert_close(blk(v_emb, v_hidden), expected)


def test_mask_reads_v_emb():
    torch.manual_seed(0)
    blk = MaskBlock(6, 5, 3)
    v_hidden = torch.randn(2, 5)
    a = blk(torch.randn(2, 6), v_hidden)
    b = blk(torch.randn(2, 6), v_hidden)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(
    "spec, cls",
    [
        ("layernorm", nn.LayerNorm),
        ("MC_LayerNorm", MCLayerNorm),
        ("mc-layernorm", MCLayerNorm),
        (NormSpec("mclayernorm", {"fraction": 0.5}), MCLayerNorm),
        (functools.partial(MCLayerNorm, fraction=0.5), MCLayerNorm),
        ("none", nn.Identity),
        (NormSpec("none"), nn.Identity),
    ],
)
def test_norm_is_pluggable(spec, cls):
    blk = MaskBlock(8, 8, 10, norm_layer=spec)
    assert type(blk.norm) is cls
    if isinstance(blk.norm, MCLayerNorm) and not isinstance(spec, str):
        assert blk.norm.fraction == 0.5
    assert blk(torch.randn(3, 8), torch.randn(3, 8)).shape == (3, 10)


def test_unknown_norm_lists_valid_names():
    with pytest.raises(ValueError, match="layernorm"):
        MaskBlock(8, 8, 8, norm_layer="layrnorm")


def test_dropout_only_in_training():
    torch.manual_seed(0)
    blk = MaskBlock(8, 8, 64, dropout=0.5)
    x, h = torch.randn(16, 8), torch.randn(16, 8)
    assert (blk(x, h) == 0).float().mean() > 0.5  # ReLU zeros plus dropped units
    blk.eval()
    torch.testing.assert_close(blk(x, h), blk(x, h))


@pytest.mark.parametrize("kwargs", [{"output_dim": 0}, {"reduction_ratio": 0.0}, {"dropout": 1.0}])
def test_bad_arguments(kwargs):
    args = {"input_dim": 4, "hidden_dim": 4, "output_dim": 4, **kwargs}
    with pytest.raises(ValueError):
        MaskBlock(**args)
