"""The Triton MC-LayerNorm (under Triton's CPU interpreter), the grouped per-field layer on
every backend, torch.library registration, fallbacks and bad input."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.core.norm_spec import mc_subset_size
from ctrcal.layers.embedding import FieldNorm
from ctrcal.layers.kernels import mcln_triton
from ctrcal.layers.kernels.mcln_kernel import kernel_available
from ctrcal.layers.mc_layernorm import dispatch
from ctrcal.layers.mc_layernorm.functional import (
    mc_grouped_layer_norm,
    mc_layer_norm,
    sample_subset_mask,
)
from ctrcal.layers.mc_layernorm.module import MCLayerNorm

needs_triton = pytest.mark.skipif(
    not (mcln_triton.HAVE_TRITON and mcln_triton.interpreting()),
    reason="triton is not installed, or TRITON_INTERPRET is off (see tests/conftest.py)",
)


@pytest.fixture(params=["c", "torch", "triton"])
def backend(request):
    if request.param == "c" and not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    if request.param == "triton" and not (mcln_triton.HAVE_TRITON and mcln_triton.interpreting()):
        pytest.skip("triton is not installed, or TRITON_INTERPRET is off")
    return request.param


def _masked_reference(x, mask, w, b, eps):
    """Float64 MC-LayerNorm of x [R, G, D] given a 0/1 mask [R * G, D] and [G, D] affine."""
    r, g, d = x.shape
    m = mask.reshape(r, g, d).double()
    xd = x.double()
    k = m.sum(-1, keepdim=True)
    mu = (xd * m).sum(-1, keepdim=True) / k
    var = ((xd - mu) ** 2 * m).sum(-1, keepdim=True) / k
    y = (xd - mu) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


# ---------------------------------------------------------------------------------------------
# the Triton kernel against the masked formula: forward and all gradients


@needs_triton
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize(("rows", "groups", "d", "f"), [(50, 1, 37, 0.8), (20, 5, 16, 0.75)])
def test_triton_matches_masked_formula_and_gradients(rows, groups, d, f, affine):
    torch.manual_seed(0)
    k = mc_subset_size(d, f)
    x = (torch.randn(rows, groups, d) * 3 + 2).requires_grad_()
    w = torch.randn(groups, d, requires_grad=True) if affine[0] else None
    b = torch.randn(groups, d, requires_grad=True) if affine[1] else None
    # the same generator state draws the same seed, so the sampler shows the kernel's subsets
    mask = sample_subset_mask(
        rows * groups, d, k, generator=torch.Generator().manual_seed(7), backend="triton"
    )
    assert (mask.sum(1) == k).all()
    out = mc_grouped_layer_norm(
        x, w, b, 1e-5, f, generator=torch.Generator().manual_seed(7), backend="triton"
    )
    assert out.dtype == torch.float32 and out.shape == x.shape
    leaves = [t for t in (x, w, b) if t is not None]
    ref = _masked_reference(x, mask, w, b, 1e-5)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    ref_grads = torch.autograd.grad(ref, leaves, g.double())
    for a, r in zip(grads, ref_grads, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), r.double(), atol=1e-4, rtol=1e-4)
    if groups == 1:  # the row entry point draws the same subsets as the grouped one
        out_row = mc_layer_norm(
            x.reshape(rows, d),
            d,
            None if w is None else w.reshape(d),
            None if b is None else b.reshape(d),
            1e-5,
            f,
            generator=torch.Generator().manual_seed(7),
            backend="triton",
        )
        torch.testing.assert_close(out_row, out.reshape(rows, d))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_inputs_accumulate_in_float32(dtype):
    torch.manual_seed(1)
    x = torch.randn(64, 40) * 4 + 3
    w, b = torch.randn(40), torch.randn(40)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    xh = x.to(dtype).requires_grad_()
    out = mc_layer_norm(xh, 40, w, b, 1e-5, 0.5, generator=gen(), backend="triton")
    assert out.dtype == dtype
    # the same subsets on the float32 copy of the rounded input
    x32 = xh.detach().float().requires_grad_()
    ref = mc_layer_norm(x32, 40, w, b, 1e-5, 0.5, generator=gen(), backend="triton")
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.02)
    (gx,) = torch.autograd.grad(out.float().square().sum(), xh)
    (rx,) = torch.autograd.grad(ref.square().sum(), x32)
    assert gx.dtype == dtype
    torch.testing.assert_close(gx.float(), rx, atol=0.1, rtol=0.05)


@pytest.mark.slow
@needs_triton
def test_triton_tie_breaking_keeps_k_exact_and_uniform(monkeypatch):
    # Coarse high words (2 bits) force the low-word branch in almost every row; coarse low
    # words too force the column-index branch. k stays exact; with only the high word
    # coarse, subsets stay uniform.
    torch.manual_seed(2)
    monkeypatch.setattr(mcln_triton, "_HI_SHIFT", 30)
    # Rows: the chi-square bound (z = 5) fails uniform subsets with probability 2e-7 at any
    # size. The defect it is for, ties settled by column order instead of the low word, has
    # w^2 = sum (p - p0)^2 / p0 = 0.16 here (simulated): 660 rows detect it with power 0.999.
    # 8,192 rows, one of the interpreter's tiles (it pays per tile), give it a noncentrality
    # of 1,300 against a bound at 68, and detect any w^2 >= 0.013 with power 0.999.
    rows = 8192
    mask = sample_subset_mask(rows, 6, 3, backend="triton")
    assert (mask.sum(1) == 3).all()
    code = (mask * (2 ** torch.arange(6))).sum(1).long()
    counts = torch.bincount(code, minlength=64).double()
    counts = counts[counts > 0]
    assert counts.numel() == math.comb(6, 3)
    expected = rows / 20
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 19 * (1 - 2 / 171 + 5 * math.sqrt(2 / 171)) ** 3  # z = 5 quantile, 19 df
    monkeypatch.setattr(mcln_triton, "_LO_SHIFT", 31)
    # exactness is per row, and with 2-bit high and 1-bit low words 4 rows in 5 settle their
    # ties by column index (simulated): one tile of 1,024 rows holds some 800 such rows
    mask = sample_subset_mask(1024, 37, 29, backend="triton")
    assert (mask.sum(1) == 29).all()


@needs_triton
def test_triton_grouped_rows_are_independent_per_field():
    # identical inputs in every field and row: each (row, field) still draws its own subset
    torch.manual_seed(3)
    x = torch.randn(1, 1, 16).expand(64, 6, 16).contiguous()
    y = mc_grouped_layer_norm(x, eps=1e-5, fraction=0.5, backend="triton")
    flat = y.reshape(-1, 16)
    assert torch.unique(flat, dim=0).shape[0] > 0.9 * flat.shape[0]


# ---------------------------------------------------------------------------------------------
# grouped per-field layer: same arithmetic as F separate MCLayerNorm layers, every backend


def test_grouped_equals_per_field_layers_given_the_mask(backend):
    torch.manual_seed(4)
    x = torch.randn(30, 7, 12, dtype=torch.float64)
    w = torch.randn(7, 12, dtype=torch.float64)
    b = torch.randn(7, 12, dtype=torch.float64)
    mask = sample_subset_mask(30 * 7, 12, 5, dtype=torch.float64)
    out = mc_grouped_layer_norm(x, w, b, 1e-5, mask=mask, backend=backend)
    m = mask.reshape(30, 7, 12)
    per_field = torch.stack(
        [mc_layer_norm(x[:, g], 12, w[g], b[g], 1e-5, mask=m[:, g]) for g in range(7)], dim=1
    )
    torch.testing.assert_close(out, per_field)


def test_grouped_draws_exact_k_per_row_and_field(backend):
    # spike at feature j of every field: the other outputs reveal whether j was drawn and k
    torch.manual_seed(5)
    rows, fields, d, f = 800, 5, 16, 0.5
    k = mc_subset_size(d, f)
    x = torch.zeros(rows, fields, d, dtype=torch.float64)
    x[..., 3] = 1.0
    w = torch.rand(fields, d, dtype=torch.float64) + 0.5
    b = torch.randn(fields, d, dtype=torch.float64)
    with torch.no_grad():
        y = mc_grouped_layer_norm(x, w, b, 1e-30, f, backend=backend)
    others = (y[..., 0] - b[:, 0]) / w[:, 0]  # [rows, fields]
    hit = others.abs() > 1e-6
    k_hat = 1 + 1 / others[hit] ** 2
    torch.testing.assert_close(k_hat, torch.full_like(k_hat, float(k)), rtol=1e-3, atol=1e-3)
    share = hit.double().mean(0)  # per field: P(j in S) = k / d
    se = math.sqrt(k / d * (1 - k / d) / rows)
    assert ((share - k / d).abs() < 5 * se).all()


def test_grouped_gradients_reach_every_field(backend):
    torch.manual_seed(6)
    weight = torch.empty(4, 8).uniform_(0.5, 2).requires_grad_()
    bias = torch.zeros(4, 8, requires_grad=True)

    def layer(x):
        return mc_grouped_layer_norm(x, weight, bias, 1e-5, 0.5, backend=backend)

    x = torch.randn(32, 4, 8, requires_grad=True)
    y = layer(x)
    y.square().sum().backward()
    assert weight.grad.shape == (4, 8) and (weight.grad.abs().sum(1) > 0).all()
    # d(sum y)/d bias = number of rows, exactly, for every field
    torch.testing.assert_close(
        torch.autograd.grad(layer(x).sum(), bias)[0], torch.full((4, 8), 32.0)
    )
    assert torch.isfinite(x.grad).all()


def test_field_norm_takes_one_grouped_call(monkeypatch):
    torch.manual_seed(8)
    norm = FieldNorm(6, 8, "mclayernorm")
    calls = []
    import ctrcal.layers.embedding as embedding

    real = embedding.mc_grouped_layer_norm
    monkeypatch.setattr(
        embedding, "mc_grouped_layer_norm", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    x = torch.randn(16, 6, 8, requires_grad=True)
    y = norm.train()(x)
    assert len(calls) == 1 and y.shape == x.shape
    y.sum().backward()
    assert all(n.weight.grad is not None and n.bias.grad is not None for n in norm.norms)
    # evaluation: one-shot per-field LayerNorm, equal to the per-field modules
    norm.eval()
    loop = torch.stack([n(x[:, i]) for i, n in enumerate(norm.norms)], dim=1)
    torch.testing.assert_close(norm(x), loop)
    assert len(calls) == 1
    # state dict keys stay per field (checkpoints of per-field runs still load)
    assert "norms.5.weight" in norm.state_dict()
    # differently configured fields fall back to the per-field loop
    norm.norms[2] = MCLayerNorm(8, fraction=0.75)
    norm.train()(x)
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------
# torch.library registration and torch.compile


@needs_triton
def test_ops_pass_opcheck():
    x = torch.randn(12, 10)
    w, b = torch.randn(3, 10), torch.randn(3, 10)
    seed = torch.tensor([5], dtype=torch.int64)
    torch.library.opcheck(
        torch.ops.ctrcal.mc_layer_norm_fwd.default,
        (x, w, b, seed, 3, 6, 1e-5),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )


@needs_triton
def test_compile_keeps_the_triton_op():
    from torch._dynamo.testing import CompileCounterWithBackend

    layer = MCLayerNorm(24, fraction=0.5, backend="triton").train()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    x = torch.randn(8, 24, requires_grad=True)
    y = compiled(x)
    y.square().sum().backward()
    assert counter.frame_count == 1
    ops = [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    assert any("mc_layer_norm_fwd" in op for op in ops), ops
    assert x.grad is not None and layer.weight.grad is not None


class _GroupedTriton(nn.Module):
    """Per-field MC-LayerNorm of G fields of width D as one grouped call (affine [G, D])."""

    def __init__(self, groups: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(groups, dim))
        self.bias = nn.Parameter(torch.zeros(groups, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mc_grouped_layer_norm(x, self.weight, self.bias, 1e-5, 0.5, backend="triton")


@needs_triton
@pytest.mark.parametrize("per_field", [False, True])
def test_decomposed_compiled_graph_draws_the_kernels_subsets(monkeypatch, per_field):
    """CTRCAL_MCLN_COMPILED=decomposed: the graph keeps only the subset draw as an op and
    equals the fused kernel (same RNG state, so the same subsets) in outputs and gradients."""
    from compiled import compiled_and_eager

    monkeypatch.setenv("CTRCAL_MCLN_COMPILED", "decomposed")
    torch.manual_seed(0)
    if per_field:
        layer = _GroupedTriton(5, 16).train()
        x = torch.randn(9, 5, 16)
    else:
        layer, x = MCLayerNorm(24, fraction=0.5, backend="triton").train(), torch.randn(9, 24)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p))
    frames, ops, results = compiled_and_eager(layer, x, lambda y: (y * torch.cos(y)).sum())
    assert frames == 1
    assert any("mc_subset_mask" in op for op in ops), ops
    assert not any("mc_layer_norm_fwd" in op for op in ops), ops
    (y_c, g_c), (y_e, g_e) = results
    torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_c, g_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_triton
def test_subset_mask_op_registration():
    torch.library.opcheck(
        torch.ops.ctrcal.mc_subset_mask.default,
        (torch.tensor([3], dtype=torch.int64), 10, 12, 5),
        test_utils=("test_schema", "test_faketensor"),
    )
    mask = mcln_triton.mc_subset_mask(torch.tensor([3], dtype=torch.int64), 10, 12, 5)
    assert mask.dtype == torch.uint8 and (mask.sum(1) == 5).all()


def test_unknown_compiled_mode_is_a_clear_error(monkeypatch):
    from ctrcal.core.errors import ConfigError

    monkeypatch.setenv("CTRCAL_MCLN_COMPILED", "fused-ish")
    with pytest.raises(ConfigError, match="CTRCAL_MCLN_COMPILED must be one of kernel, decomposed"):
        dispatch.compiled_mode()


# ---------------------------------------------------------------------------------------------
# bad input and fallbacks


@needs_triton
def test_failed_triton_launch_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setitem(mcln_triton._state, "broken", None)

    def broken(*args, **kwargs):
        raise RuntimeError("PTX assembly failed")

    monkeypatch.setattr(mcln_triton, "_forward_impl", broken)
    monkeypatch.setattr(mcln_triton, "triton_usable", _usable_on_cpu)
    # `auto` picks Triton for CUDA tensors; stand CPU tensors in for them
    monkeypatch.setattr(
        dispatch,
        "choose_backend",
        lambda backend, rows: (
            "triton"
            if backend == "triton" or mcln_triton.triton_usable(rows.device, rows.shape[-1])
            else "torch"
        ),
    )
    layer = MCLayerNorm(16, fraction=0.5).train()
    x = torch.randn(40, 16)
    with pytest.warns(UserWarning, match="PTX assembly failed"):
        y = mc_layer_norm(x, 16, layer.weight, layer.bias, fraction=0.5, backend="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mc_layer_norm(x, 16, fraction=0.5, backend="auto")  # no second warning
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert mcln_triton._state["broken"] is not None
    # an explicit triton backend reports the failure instead
    monkeypatch.setitem(mcln_triton._state, "broken", None)
    with pytest.raises(RuntimeError, match="PTX"):
        mc_layer_norm(x, 16, fraction=0.5, backend="triton")


def _usable_on_cpu(device, width):
    return mcln_triton._state["broken"] is None and width <= mcln_triton.MAX_WIDTH


@needs_triton
def test_rows_too_wide_for_one_program_take_the_torch_path(monkeypatch):
    monkeypatch.setattr(mcln_triton, "MAX_WIDTH", 32)
    calls = []
    real = mcln_triton._forward_impl
    monkeypatch.setattr(
        mcln_triton, "_forward_impl", lambda *a: calls.append(a[0].shape) or real(*a)
    )
    torch.manual_seed(9)
    x = torch.zeros(500, 40, dtype=torch.float64)
    x[:, 3] = 1.0
    y = mc_layer_norm(x, 40, None, None, 1e-30, 0.5, backend="triton")
    assert calls == []  # not the kernel
    others = y[:, 0][y[:, 0] != 0]
    k_hat = 1 + 1 / others**2
    torch.testing.assert_close(k_hat, torch.full_like(k_hat, 20.0))
    mc_layer_norm(torch.randn(4, 16), 16, fraction=0.5, backend="triton")
    assert calls == [(4, 16)]


def test_weight_on_another_device_is_a_clear_error():
    x = torch.randn(4, 8)
    w = torch.ones(8, device="meta")
    with pytest.raises(ValueError, match="input is on cpu but its weight/bias on meta"):
        mc_layer_norm(x, 8, w, None, fraction=0.5)
    with pytest.raises(ValueError, match="on meta"):
        mc_grouped_layer_norm(torch.randn(2, 3, 8), torch.ones(3, 8, device="meta"))
    with pytest.raises(ValueError, match=r"weight must have shape \[3, 8\]"):
        mc_grouped_layer_norm(torch.randn(2, 3, 8), torch.ones(8))


def test_triton_backend_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises((ValueError, RuntimeError), match="triton"):
        mc_layer_norm(torch.randn(4, 8), 8, fraction=0.5, backend="triton")


@pytest.mark.slow
def test_everything_works_without_triton(tmp_path):
    # a fresh interpreter where `import triton` fails, as on an install without the extra
    code = """
import sys
sys.modules["triton"] = None
import torch
import ctrcal
from ctrcal.layers.kernels import mcln_triton
from ctrcal.layers.mc_layernorm.functional import mc_grouped_layer_norm, mc_layer_norm
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.layers.embedding import FieldNorm
assert not mcln_triton.HAVE_TRITON
torch.manual_seed(0)
y = MCLayerNorm(16, fraction=0.5).train()(torch.randn(8, 16))
z = FieldNorm(3, 8, "mclayernorm").train()(torch.randn(4, 3, 8))
g = mc_grouped_layer_norm(torch.randn(4, 3, 8), backend="torch")
assert y.shape == (8, 16) and z.shape == (4, 3, 8) and g.shape == (4, 3, 8)
try:
    mc_layer_norm(torch.randn(2, 8), 8, fraction=0.5, backend="triton")
except RuntimeError as exc:
    assert "needs triton installed" in str(exc), exc
else:
    raise SystemExit("expected an error for backend='triton'")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def test_layer_norm_semantics_of_fraction_one_grouped():
    x = torch.randn(6, 3, 8)
    w, b = torch.randn(3, 8), torch.randn(3, 8)
    out = mc_grouped_layer_norm(x, w, b, 1e-5, 1.0)
    ref = torch.stack([F.layer_norm(x[:, g], (8,), w[g], b[g], 1e-5) for g in range(3)], 1)
    torch.testing.assert_close(out, ref)
