"""linear_logit: a one-output Linear as a matrix-vector product, same values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ctrcal.layers.logit_head as logit_head_module
from ctrcal.layers.dropout import layer_norm_relu_dropout
from ctrcal.layers.logit_head import layer_norm_relu_dropout_logit, linear_logit


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


def _tail(n: int = 40) -> tuple[nn.LayerNorm, nn.Linear]:
    torch.manual_seed(0)
    norm, head = nn.LayerNorm(n), nn.Linear(n, 1)
    with torch.no_grad():  # non-trivial affine parameters, so a mixed-up one would show
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_(0.0, 0.3)
        head.bias.fill_(0.25)
    return norm, head


def _tail_grads(fn, x, norm, head, seed):
    x = x.detach().clone().requires_grad_(True)
    params = [norm.weight, norm.bias, head.weight, head.bias]
    torch.manual_seed(seed)  # the dropout mask's draw
    out = fn(x)
    grads = torch.autograd.grad((out * torch.linspace(-1, 2, out.numel())).sum(), [x, *params])
    return out.detach(), grads


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_tail_equals_the_layers_with_the_same_dropout_mask(threads, monkeypatch):
    norm, head = _tail()
    x = torch.randn(300, 40) * 2.0 + 0.5
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # row chunks per thread
    calls = []
    apply = logit_head_module._LayerNormReLUDropoutLogitFn.apply
    monkeypatch.setattr(
        logit_head_module._LayerNormReLUDropoutLogitFn,
        "apply",
        lambda *a: calls.append(1) or apply(*a),
    )
    out, grads = _tail_grads(
        lambda v: layer_norm_relu_dropout_logit(v, norm, 0.3, True, head), x, norm, head, 7
    )
    assert calls == [1]  # the fused kernel ran
    ref, ref_grads = _tail_grads(
        lambda v: linear_logit(head, layer_norm_relu_dropout(v, norm, 0.3, True)), x, norm, head, 7
    )
    assert out.shape == (300,)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(
        ["x", "norm.w", "norm.b", "head.w", "head.b"], grads, ref_grads, strict=True
    ):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    # another draw, another mask
    other, _ = _tail_grads(
        lambda v: layer_norm_relu_dropout_logit(v, norm, 0.3, True, head), x, norm, head, 8
    )
    assert not torch.allclose(out, other)


def test_fused_tail_without_dropout_or_kernel_runs_the_layers():
    norm, head = _tail()
    x = torch.randn(20, 40)
    expected = head(torch.relu(norm(x))).squeeze(-1)
    torch.testing.assert_close(layer_norm_relu_dropout_logit(x, norm, 0.3, False, head), expected)
    torch.testing.assert_close(layer_norm_relu_dropout_logit(x, norm, 0.0, True, head), expected)
    x64, norm64, head64 = x.double(), norm.double(), head.double()
    torch.testing.assert_close(
        layer_norm_relu_dropout_logit(x64, norm64, 0.3, False, head64),
        head64(torch.relu(norm64(x64))).squeeze(-1),
    )


def _tower(dropout: float) -> nn.Sequential:
    torch.manual_seed(3)
    layers: list[nn.Module] = []
    for width_in, width_out in ((24, 32), (32, 16)):
        layers += [nn.Linear(width_in, width_out), nn.ReLU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(16, 1))


def test_sequential_logit_equals_the_tower_in_eval_and_fuses_its_dropout_in_training():
    from ctrcal.layers.dropout import relu_dropout
    from ctrcal.layers.logit_head import sequential_logit

    head = _tower(0.3)
    x = torch.randn(200, 24, requires_grad=True)
    head.eval()
    torch.testing.assert_close(sequential_logit(head, x), head(x).squeeze(-1))
    head.train()
    torch.manual_seed(7)
    got = sequential_logit(head, x)
    torch.manual_seed(7)  # the same draws: the fused ReLU + dropout, not F.dropout's bernoulli
    h = relu_dropout(head[0](x), 0.3)
    h = relu_dropout(head[3](h), 0.3)
    want = head[6](h).squeeze(-1)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in head.parameters())


def test_sequential_logit_keeps_the_heads_hooks():
    from ctrcal.layers.logit_head import sequential_logit

    head = _tower(0.0).eval()
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    out = sequential_logit(head, torch.randn(5, 24))
    assert out.shape == (5,) and calls == [torch.Size([5, 1])]
