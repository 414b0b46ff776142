"""The one rule of when a fused CPU path may stand in for stock modules and ops, and that the
fused paths follow it (autocast, dtype, hooks, subclasses)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrcal.layers.dropout import run_sequential
from ctrcal.layers.embedding import FieldNorm
from ctrcal.layers.kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_layer_norm, is_stock
from ctrcal.layers.mask_block import MaskBlock, masked_input, serial_logits
from ctrcal.layers.mc_layernorm.module import MCLayerNorm


def _library():
    lib = cpu_kernels.cpu_kernels()
    if lib is None:
        pytest.skip(f"no C kernel here: {cpu_kernels.kernel_error()}")
    return cpu_kernels.cpu_kernels


def test_rule_on_tensors():
    kernels = _library()
    x, w = torch.randn(4, 3), torch.randn(3)
    assert fusable_on_cpu(x, w, kernels=kernels)
    assert not fusable_on_cpu(x.double(), w.double(), kernels=kernels)  # not the kernel's dtype
    assert not fusable_on_cpu(x, w.double(), kernels=kernels)  # mixed dtypes
    assert not fusable_on_cpu(x, torch.randn(3, device="meta"), kernels=kernels)  # off the CPU
    assert fusable_on_cpu(x.double(), dtypes=None, kernels=None)  # torch ops: any dtype
    assert not fusable_on_cpu(x, kernels=lambda: None)  # the kernel is not loaded
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fusable_on_cpu(x, w, kernels=kernels)
        assert fusable_on_cpu(x, w, autocast_free=True, kernels=kernels)
    with pytest.raises(ValueError, match="tensors"):
        fusable_on_cpu(kernels=kernels)


def test_stock_modules():
    ln = nn.LayerNorm(4)
    assert is_layer_norm(ln) and is_stock(ln, nn.LayerNorm)
    assert not is_layer_norm(MCLayerNorm(4))  # a subclass computes something else
    handle = ln.register_forward_hook(lambda *a: None)
    assert is_layer_norm(ln) and not is_stock(ln, nn.LayerNorm)  # a hook must see the call
    handle.remove()
    assert is_stock(ln, nn.LayerNorm) and not is_stock(None, nn.LayerNorm)


def test_fused_masked_input_steps_aside_under_autocast(monkeypatch):
    """Under CPU autocast the stock ``layer(a) * v`` runs (in bfloat16), not the float32
    kernel; outside it the kernel runs and gives the same numbers as the stock modules."""
    _library()
    from ctrcal.layers import mask_block

    calls = []
    real = mask_block._MaskedInputFn.apply
    monkeypatch.setattr(mask_block._MaskedInputFn, "apply", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    layer, a, v = nn.Linear(5, 6), torch.randn(8, 5), torch.randn(8, 6)
    torch.testing.assert_close(masked_input(layer, a, v), layer(a) * v)
    assert calls == [1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = masked_input(layer, a, v)
        ref = layer(a) * v  # the product in bfloat16, as autocast asks
    assert calls == [1]
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert not torch.allclose(out, layer(a) * v, rtol=0, atol=1e-6)  # not float32's numbers


def test_layer_norm_subclass_never_takes_the_layer_norm_kernels():
    """An MCLayerNorm is an nn.LayerNorm with the same parameters; the fused LayerNorm paths
    would silently drop its sampling."""
    _library()
    from ctrcal.layers.dropout import layer_norm_fusable

    x = torch.randn(8, 16)
    assert layer_norm_fusable(x, nn.LayerNorm(16), 0.1, True)
    assert not layer_norm_fusable(x, MCLayerNorm(16), 0.1, True)
    assert MaskBlock(8, 8, 16, dropout=0.1).fusable_tail()
    assert not MaskBlock(8, 8, 16, norm_layer="mclayernorm", dropout=0.1).fusable_tail()


@pytest.mark.parametrize("hooked", ["activation", "dropout"])
def test_a_hook_on_a_blocks_relu_or_dropout_sees_the_call(hooked):
    """Fused paths skip the modules they stand for; a hooked module is called instead."""
    torch.manual_seed(4)
    blk = MaskBlock(8, 8, 16, dropout=0.2).train()
    seen = []
    getattr(blk, hooked).register_forward_hook(lambda m, args, out: seen.append(out.shape))
    v = torch.randn(32, 8)
    blk(v, v).sum().backward()
    assert seen == [(32, 16)]
    nxt = MaskBlock(8, 16, 4, dropout=0.2).train()
    logits = serial_logits([blk, nxt], nn.Linear(4, 1), v, v, [None, None])
    assert len(seen) == 2 and logits.shape == (32,)


def test_a_hook_on_a_towers_relu_sees_the_call():
    layers = [nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 1)]
    seen = []
    layers[1].register_forward_hook(lambda m, args, out: seen.append(1))
    torch.manual_seed(5)
    out = run_sequential(layers, torch.randn(10, 6))
    assert seen == [1] and out.shape == (10, 1)


def test_a_hook_on_a_field_layer_norm_sees_the_call():
    norm = FieldNorm(3, 8, "layernorm")
    seen = []
    norm.norms[1].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    x = torch.randn(5, 3, 8)
    out = norm(x)
    assert seen == [(5, 8)]
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (8,)))
