"""Fused ReLU + inverted dropout: a correct dropout in law, exact gradients, seeded masks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ctrcal.layers.dropout import dropout_keep_mask, relu_dropout
from ctrcal.layers.mask_block import MaskBlock


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9, 0.01])
def test_keep_rate_is_one_minus_p(p):
    torch.manual_seed(0)
    n = 2_000_000
    kept = int(dropout_keep_mask((n,), p).sum())
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd  # a binomial count within 5 standard deviations


def test_mask_elements_are_independent_and_unbiased_over_positions():
    torch.manual_seed(1)
    rows, cols, p = 4000, 400, 0.2
    keep = dropout_keep_mask((rows, cols), p).float()
    # neighbours (the two halves of one 64-bit draw, and adjacent words) are uncorrelated
    a, b = keep[:, :-1].flatten(), keep[:, 1:].flatten()
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1]
    assert abs(float(corr)) < 5 / math.sqrt(a.numel())
    # every column keeps its share: a chi-square over columns is not extreme
    counts = keep.sum(0)
    expected, var = rows * (1 - p), rows * p * (1 - p)
    chi2 = float(((counts - expected) ** 2 / var).sum())
    assert chi2 < cols + 6 * math.sqrt(2 * cols)


def test_kept_values_are_scaled_and_dropped_ones_zero():
    torch.manual_seed(2)
    p = 0.2
    x = torch.rand(1000, 300) + 0.1  # all positive: only dropout zeroes
    y = relu_dropout(x, p, training=True)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
    assert abs(kept.float().mean().item() - 0.8) < 0.01
    # inverted dropout preserves the mean
    assert abs(y.mean().item() / x.mean().item() - 1) < 0.01


def test_relu_is_applied_before_dropout():
    torch.manual_seed(3)
    x = torch.randn(500, 100)
    y = relu_dropout(x, 0.3, training=True)
    assert (y[x <= 0] == 0).all()
    assert (y >= 0).all()


def test_gradient_is_the_gradient_of_relu_then_masked_scaling():
    torch.manual_seed(4)
    p = 0.25
    x = torch.randn(64, 50, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    y = relu_dropout(x, p, training=True)
    torch.manual_seed(5)
    keep = dropout_keep_mask(x.shape, p)  # the same draw: the same mask
    reference = F.relu(x) * keep / (1 - p)
    torch.testing.assert_close(y, reference)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    (gref,) = torch.autograd.grad(reference, x, g)
    torch.testing.assert_close(gx, gref)


def test_same_seed_same_mask_other_seed_other_mask():
    x = torch.randn(200, 64).abs() + 0.1
    torch.manual_seed(7)
    a = relu_dropout(x, 0.5, training=True)
    b = relu_dropout(x, 0.5, training=True)  # the next call draws a new mask
    torch.manual_seed(7)
    c = relu_dropout(x, 0.5, training=True)
    torch.manual_seed(8)
    d = relu_dropout(x, 0.5, training=True)
    assert torch.equal(a, c)
    assert not torch.equal(a, b) and not torch.equal(a, d)


def test_eval_mode_and_zero_rate_are_a_plain_relu():
    x = torch.randn(10, 7)
    torch.testing.assert_close(relu_dropout(x, 0.4, training=False), F.relu(x))
    torch.testing.assert_close(relu_dropout(x, 0.0, training=True), F.relu(x))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_invalid_rate_is_an_error(p):
    with pytest.raises(ValueError, match="dropout"):
        relu_dropout(torch.randn(3), p)


def test_bf16_input_keeps_its_dtype():
    torch.manual_seed(9)
    x = torch.randn(100, 40, dtype=torch.bfloat16, requires_grad=True)
    y = relu_dropout(x, 0.2, training=True)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16


def test_mask_block_uses_its_dropout_module_rate_and_mode():
    torch.manual_seed(10)
    blk = MaskBlock(8, 8, 400, dropout=0.5)
    v = torch.randn(2000, 8)
    blk.eval()
    clean = blk(v, v)
    blk.train()
    noisy = blk(v, v)
    positive = clean > 0
    dropped = (noisy[positive] == 0).float().mean().item()
    assert abs(dropped - 0.5) < 0.02
    # kept activations are the eval ones scaled by 1 / (1 - p) (same weights, LayerNorm has
    # no batch state)
    kept = positive & (noisy != 0)
    torch.testing.assert_close(noisy[kept], clean[kept] * 2, rtol=1e-5, atol=1e-6)
    # switching the nn.Dropout module alone (as MC-Dropout does) turns the noise on
    blk.eval()
    blk.dropout.train()
    assert (blk(v, v)[positive] == 0).any()


def test_run_sequential_fuses_relu_dropout_pairs_only():
    from torch import nn

    from ctrcal.layers.dropout import run_sequential

    torch.manual_seed(11)
    seq = nn.Sequential(
        nn.Linear(6, 300),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(300, 300),
        nn.ReLU(),
        nn.Linear(300, 2),
    )
    x = torch.randn(400, 6)
    seq.eval()
    torch.testing.assert_close(run_sequential(seq, x), seq(x))
    seq.train()
    torch.manual_seed(12)
    out = run_sequential(seq, x)
    torch.manual_seed(12)
    h = relu_dropout(seq[0](x), 0.5, training=True)
    torch.testing.assert_close(out, seq[5](torch.relu(seq[3](h))))


def test_mlp_runs_its_relu_dropout_pairs_fused_with_dropout_semantics():
    from ctrcal.layers.mlp import MLP

    torch.manual_seed(0)
    mlp = MLP(8, [64], "layernorm", dropout=0.25, output_dim=None)
    x = torch.randn(4096, 8)
    mlp.eval()
    torch.testing.assert_close(mlp(x), mlp.layers(x))  # inference: exactly the plain tower
    mlp.train()
    out = mlp(x)
    post = torch.relu(mlp.layers[:2](x))  # Linear -> LayerNorm, deterministic; then ReLU
    positive = post > 0
    kept = out[positive] != 0
    # inverted dropout: keep rate 1 - p, kept values scaled by 1 / (1 - p)
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    torch.testing.assert_close(out[positive][kept], post[positive][kept] / 0.75)


# The C kernel and the torch fallback compute the same function of (key, element index).


def _kernel_or_skip():
    from ctrcal.layers import dropout
    from ctrcal.layers.kernels import cpu_kernels

    lib = cpu_kernels.cpu_kernels()
    if lib is None:
        pytest.skip(f"no C kernel here: {cpu_kernels.kernel_error()}")
    return dropout, lib


@pytest.mark.parametrize("n", [1, 7, 70_001])
@pytest.mark.parametrize("key", [0, 12345, (1 << 63) - 2])
def test_kernel_mask_equals_the_torch_formula(n, key):
    dropout, lib = _kernel_or_skip()
    for threshold in (0, 1, dropout._keep_threshold(0.2), 1 << 32):
        keep = torch.empty(n, dtype=torch.uint8)
        bounds = torch.tensor([0, n // 3, n])  # two chunks, the kernels' calling convention
        lib.dropout_keep_mask(keep.data_ptr(), key, threshold, bounds.data_ptr(), 0, 2)
        ref = dropout._keep_mask_torch(n, key, threshold)
        assert torch.equal(keep.bool(), ref), threshold
    assert bool(ref.all())  # threshold 2**32 keeps everything, 0 nothing (checked above)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_and_torch_fallback_give_the_same_outputs_and_gradients(dtype, monkeypatch):
    dropout, _ = _kernel_or_skip()
    x = torch.randn(300, 257, dtype=dtype)  # 77100 elements: more than one chunk
    x[0, :3] = torch.tensor([float("nan"), 0.0, -0.0], dtype=dtype)
    g = torch.randn_like(x)

    def run():
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(21)
        y = relu_dropout(xi, 0.3, training=True)
        (gx,) = torch.autograd.grad(y, xi, g)
        return y, gx

    y_kernel, gx_kernel = run()
    monkeypatch.setattr(dropout, "cpu_kernels", lambda: None)
    y_torch, gx_torch = run()
    torch.testing.assert_close(y_kernel, y_torch, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(gx_kernel, gx_torch, equal_nan=True, rtol=0, atol=0)
    assert torch.isnan(y_kernel[0, 0]) or y_kernel[0, 0] == 0  # NaN passes where kept
    assert (y_kernel[0, 1:3] == 0).all()


def test_mask_does_not_depend_on_the_thread_split():
    dropout, _ = _kernel_or_skip()
    x = torch.randn(1000, 400)
    old = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            torch.manual_seed(5)
            outs.append(relu_dropout(x, 0.2, training=True))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# LayerNorm -> ReLU -> dropout as one kernel: the same function as the three modules.


def _affine_layernorm(n: int) -> torch.nn.LayerNorm:
    ln = torch.nn.LayerNorm(n, eps=1e-3)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    return ln


def test_fused_layernorm_relu_dropout_equals_the_modules(monkeypatch):
    from ctrcal.layers.dropout import layer_norm_relu_dropout

    _, _ = _kernel_or_skip()
    torch.manual_seed(30)
    ln = _affine_layernorm(96)
    x = torch.randn(700, 96) * 3 + 1  # several row chunks, rows with a far-from-zero mean
    g = torch.randn(700, 96)
    results = []
    for fused in (True, False):
        xi = x.clone().requires_grad_(True)
        ln.zero_grad()
        torch.manual_seed(31)
        if fused:
            y = layer_norm_relu_dropout(xi, ln, 0.3, training=True)
        else:
            y = relu_dropout(ln(xi), 0.3, training=True)
        y.backward(g)
        results.append((y.detach(), xi.grad, ln.weight.grad.clone(), ln.bias.grad.clone()))
    (y_f, dx_f, dw_f, db_f), (y_u, dx_u, dw_u, db_u) = results
    assert torch.equal(y_f == 0, y_u == 0)  # the same mask and the same ReLU zeros
    # float32 rounding of a differently ordered row reduction, and of sums over 700 rows
    torch.testing.assert_close(y_f, y_u, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx_f, dx_u, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw_f, dw_u, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db_f, db_u, rtol=1e-4, atol=1e-4)


def test_fused_layernorm_path_falls_back_where_it_does_not_apply():
    from ctrcal.layers import dropout

    torch.manual_seed(32)
    x = torch.randn(50, 16)
    ln = _affine_layernorm(16)
    calls = []
    real = dropout._LayerNormReLUDropoutFn.apply
    dropout._LayerNormReLUDropoutFn.apply = lambda *a: calls.append(1) or real(*a)
    try:
        out = dropout.layer_norm_relu_dropout(x, ln, 0.2, training=False)  # eval: no dropout
        torch.testing.assert_close(out, torch.relu(ln(x)))
        no_affine = torch.nn.LayerNorm(16, elementwise_affine=False)
        torch.manual_seed(1)
        a = dropout.layer_norm_relu_dropout(x, no_affine, 0.2, training=True)
        torch.manual_seed(1)
        torch.testing.assert_close(a, relu_dropout(no_affine(x), 0.2, training=True))
        dropout.layer_norm_relu_dropout(x.double(), ln.double(), 0.2, training=True)
        assert calls == []
    finally:
        dropout._LayerNormReLUDropoutFn.apply = real


def test_mask_block_with_layernorm_trains_like_the_unfused_modules(monkeypatch):
    from ctrcal.layers import dropout, mask_block

    _kernel_or_skip()
    torch.manual_seed(33)
    blk = MaskBlock(12, 12, 64, dropout=0.25)
    v = torch.randn(300, 12)
    torch.manual_seed(34)
    fused = blk(v, v)
    fused.sum().backward()
    grads = {n: p.grad.clone() for n, p in blk.named_parameters()}
    blk.zero_grad()
    monkeypatch.setattr(
        mask_block,
        "layer_norm_relu_dropout",
        lambda x, norm, p, t: dropout.relu_dropout(norm(x), p, t),
    )
    torch.manual_seed(34)
    plain = blk(v, v)
    plain.sum().backward()
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    for n, p in blk.named_parameters():
        # sums over 300 rows of gradients up to ~200 in float32, in another order: the error
        # scales with the largest element, not with each element (one near 0 differs by 4e-5)
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(grads[n], p.grad, rtol=0, atol=1e-5 * scale, msg=n)
