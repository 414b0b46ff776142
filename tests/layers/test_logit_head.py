"""linear_logit: a one-output Linear as a matrix-vector product, same values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrcal.layers.logit_head import linear_logit


def _grads(layer: nn.Linear, x: torch.Tensor, fn) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.detach().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    out = fn(layer, x)
    (out * torch.linspace(-1, 2, out.numel(), dtype=out.dtype)).sum().backward()
    params = [p.grad.clone() for p in layer.parameters()]
    return out.detach(), [x.grad.clone(), *params]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_equals_the_linear_layer(bias, dtype, tol):
    torch.manual_seed(0)
    layer = nn.Linear(37, 1, bias=bias).to(dtype)
    if bias:
        nn.init.normal_(layer.bias)
    x = torch.randn(53, 37, dtype=dtype)
    out, grads = _grads(layer, x, linear_logit)
    ref_out, ref_grads = _grads(layer, x, lambda lay, v: lay(v).squeeze(-1))
    assert out.shape == (53,)
    torch.testing.assert_close(out, ref_out, rtol=tol, atol=tol)
    assert len(grads) == len(ref_grads) == (3 if bias else 2)
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_a_hooked_layer_still_runs_its_hooks():
    layer = nn.Linear(5, 1)
    seen = []
    layer.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    out = linear_logit(layer, torch.randn(4, 5))
    assert seen == [(4, 1)] and out.shape == (4,)


def test_other_layers_take_their_own_forward():
    head = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 1))
    x = torch.randn(4, 5)
    torch.testing.assert_close(linear_logit(head, x), head(x).squeeze(-1))


def test_autocast_keeps_the_layers_own_precision():
    layer = nn.Linear(8, 1)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear_logit(layer, x).dtype == layer(x).squeeze(-1).dtype == torch.bfloat16
