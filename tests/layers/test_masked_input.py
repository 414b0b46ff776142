"""MaskBlock's masked input, ``layer(a) * v``, as one C pass each way: the same values."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrcal.layers import mask_block as mask_block_module
from ctrcal.layers.kernels import cpu_kernels
from ctrcal.layers.mask_block import masked_input


@pytest.fixture
def kernels():
    if cpu_kernels.cpu_kernels() is None:
        pytest.skip(f"no C kernel here: {cpu_kernels.kernel_error()}")


def _case(rows: int = 500):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    with torch.no_grad():
        layer.bias.normal_()
    base = torch.randn(rows, 30)
    a = base[:, 3:27].clone().requires_grad_(True)  # any strides: columns of a wider tensor
    v = torch.randn(rows, 40, requires_grad=True)
    return layer, a, v


def test_equals_linear_then_product_with_all_gradients(kernels):
    layer, a, v = _case()
    g = torch.randn(a.shape[0], 40)
    results = []
    for fused in (True, False):
        layer.zero_grad()
        ai, vi = a.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True)
        z = masked_input(layer, ai, vi) if fused else layer(ai) * vi
        z.backward(g)
        results.append(
            (z.detach(), ai.grad, vi.grad, layer.weight.grad.clone(), layer.bias.grad.clone())
        )
    for name, got, want in zip(("z", "da", "dv", "dw", "db"), *results, strict=True):
        # float32 rounding: the bias joins after the product instead of inside it, and the
        # bias gradient sums per row chunk
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)


def test_the_kernel_runs_in_a_training_masknet(kernels, monkeypatch):
    from ctrcal.core.batch import Batch
    from ctrcal.models.masknet import MaskNet

    calls = []
    for fn in (mask_block_module._MaskedInputFn, mask_block_module._NormMaskedInputFn):
        monkeypatch.setattr(
            fn,
            "apply",
            lambda *args, real=fn.apply, name=fn.__name__: calls.append(name) or real(*args),
        )
    model = MaskNet([9, 7], 3, embedding_dim=4, hidden_units=[16, 8, 6], dropout=0.1)
    cat = torch.stack([torch.randint(0, 9, (32,)), torch.randint(0, 7, (32,))], 1)
    model(Batch(cat, torch.randn(32, 3), None)).sum().backward()
    # the first block's masked input reads the embedding; every later one reads the block
    # before it, whose LayerNorm, ReLU and dropout run in the same node
    assert calls == ["_MaskedInputFn", "_NormMaskedInputFn", "_NormMaskedInputFn"]
    calls.clear()
    model.eval()(Batch(cat, torch.randn(32, 3), None))  # no dropout: the masked inputs one by one
    assert calls == ["_MaskedInputFn"] * 3


def test_other_cases_run_the_modules(monkeypatch):
    layer, a, v = _case(20)
    monkeypatch.setattr(
        mask_block_module._MaskedInputFn, "apply", lambda *args: pytest.fail("fused path taken")
    )
    torch.testing.assert_close(
        masked_input(layer.double(), a.double(), v.double()), layer(a.double()) * v.double()
    )
    no_bias = nn.Linear(24, 40, bias=False)
    torch.testing.assert_close(masked_input(no_bias, a, v.float()), no_bias(a) * v)
