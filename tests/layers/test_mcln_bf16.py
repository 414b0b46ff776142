"""MC-LayerNorm's C kernel on bf16 rows: the float32 kernel's numbers on the widened rows,
rounded once, with the same subsets; the layer keeps bf16 in and out."""

from __future__ import annotations

import pytest
import torch

from ctrcal.layers.kernels import mcln_kernel
from ctrcal.layers.mc_layernorm.module import MCLayerNorm

pytestmark = pytest.mark.skipif(
    not mcln_kernel.kernel_available(), reason="the C kernel does not build here"
)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize(("groups", "n"), [(1, 400), (1, 37), (39, 16), (1, 8)])
def test_bf16_rows_are_the_float32_kernel_rounded_once(groups, n):
    torch.manual_seed(0)
    k = max(2, (4 * n) // 5)
    x = torch.randn(256 * groups, n).bfloat16()
    w, b = torch.randn(groups, n), torch.randn(groups, n)
    y, bits, mean, rstd = mcln_kernel.forward(x, w, b, k, 1e-5, 123, groups)
    y32, bits32, mean32, rstd32 = mcln_kernel.forward(x.float(), w, b, k, 1e-5, 123, groups)
    assert y.dtype == torch.bfloat16 and mean.dtype == rstd.dtype == torch.float32
    assert torch.equal(bits, bits32)  # the same subsets
    torch.testing.assert_close(mean, mean32, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd, rstd32, rtol=1e-5, atol=0)
    assert _relative(y, y32) < 2**-8  # one rounding to bf16
    g = torch.randn(x.shape).bfloat16()
    dx, dw, db = mcln_kernel.backward(g, x, w, bits, mean, rstd, k, groups)
    dx32, dw32, db32 = mcln_kernel.backward(
        g.float(), x.float(), w, bits32, mean32, rstd32, k, groups
    )
    assert dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    assert _relative(dx, dx32) < 2**-7
    torch.testing.assert_close(dw, dw32, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, db32, rtol=1e-4, atol=1e-4)


def test_the_layer_takes_bf16_rows_in_and_out_with_float32_parameters():
    torch.manual_seed(1)
    layer = MCLayerNorm(400, fraction=0.8, backend="c").train()
    x = torch.randn(64, 400).bfloat16().requires_grad_()
    torch.manual_seed(2)
    y = layer(x)
    x32 = x.detach().float().requires_grad_()
    torch.manual_seed(2)  # the same subsets
    y32 = layer(x32)
    assert y.dtype == torch.bfloat16
    assert _relative(y, y32) < 2**-7
    y.float().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32
