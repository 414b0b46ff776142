"""MC-LayerNorm: exact subset size, uniform independent subsets, moments, modes, gradients."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import mc_subset_size
from ctrcal.layers.kernels import mcln_kernel, mcln_triton
from ctrcal.layers.kernels.mcln_kernel import kernel_available
from ctrcal.layers.mc_layernorm import dispatch
from ctrcal.layers.mc_layernorm.functional import mc_layer_norm, sample_subset_mask
from ctrcal.layers.mc_layernorm.module import MCLayerNorm, mc_mode
from ctrcal.layers.mc_layernorm.predict import mc_predict


def triton_interpreted() -> bool:
    return mcln_triton.HAVE_TRITON and mcln_triton.interpreting()


@pytest.fixture(params=["c", "torch", "triton"])
def backend(request):
    """Every statistical test runs on the C kernel, the Triton kernel (through Triton's CPU
    interpreter, see tests/conftest.py) and the pure-torch path."""
    if request.param == "c" and not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    if request.param == "triton" and not triton_interpreted():
        pytest.skip("triton is not installed, or TRITON_INTERPRET is off")
    return request.param


# ---------------------------------------------------------------------------------------------
# subset size


@pytest.mark.parametrize(
    ("n", "f", "k"),
    [
        (10, 0.3, 3),
        (100, 0.29, 29),
        (100, 0.57, 57),
        (400, 0.8, 320),
        (624, 0.8, 499),
        (10, 1.0, 10),
        (10, 0.2, 2),
        (7, 0.5, 3),
        (3, 2 / 3, 2),
        (30, 1 / 3, 10),
        (10, Fraction(3, 10), 3),
    ],
)
def test_subset_size_exact(n, f, k):
    assert mc_subset_size(n, f) == k


def test_subset_size_matches_float_pitfall_cases():
    # the naive float product loses one here
    assert int(0.29 * 100) == 28 and mc_subset_size(100, 0.29) == 29
    assert all(
        mc_subset_size(n, p / 100) == n * p // 100 for n in (100, 200) for p in range(2, 101)
    )


@pytest.mark.parametrize("f", [0.0, -0.1, 1.5, float("nan"), float("inf"), "0.5", True])
def test_subset_size_rejects_bad_fraction(f):
    with pytest.raises(ConfigError):
        mc_subset_size(10, f)


def test_subset_size_too_small_names_n_and_f():
    with pytest.raises(ValueError, match=r"fraction=0.1 with N=10"):
        mc_subset_size(10, 0.1)
    with pytest.raises(ValueError, match="N=10"):
        MCLayerNorm(10, fraction=0.15)


# ---------------------------------------------------------------------------------------------
# sampler: exact k, uniform, independent


@pytest.mark.parametrize(("n", "k"), [(5, 2), (10, 3), (400, 320), (400, 200), (624, 499), (9, 9)])
def test_sampler_exact_k_per_row(n, k, backend):
    torch.manual_seed(0)
    # The interpreter is slow, and pays per tile of rows (64 rows of N = 624, 128 of N = 400):
    # 200 rows are up to 4 tiles, the last one partial. Exactness is per row, so what the rows are
    # for is the search's paths: the fallback to bisection after the interpolated probes is
    # taken by 8-17 % of rows at these widths (simulated), so 200 rows all stop short of it
    # with probability < 0.92^200 = 6e-8. The tie branches are forced in test_mcln_triton.py.
    rows = 200 if backend == "triton" else 3000
    mask = sample_subset_mask(rows, n, k, backend=backend)
    assert mask.shape == (rows, n)
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    assert (mask.sum(1) == k).all()


def _chi2_threshold(df: int, z: float = 5.0) -> float:
    # Wilson-Hilferty: the chi-square quantile at standard-normal z (z=5: p ~ 3e-7)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(("n", "k"), [(6, 3), (6, 4)])
def test_sampler_uniform_over_all_subsets(n, k, backend):
    torch.manual_seed(1)
    # The chi-square bound at z = 5 fails a uniform sampler with probability 2e-7 at any size.
    # C and torch draw 40,000 rows (cheap): power 0.999 from w^2 = sum (p - p0)^2 / p0 of
    # 0.0027. The Triton draws are the k smallest of Philox keys of (seed, row * N + col), so
    # a bug skews them structurally: two columns sharing a key (a wrong offset) gives w^2 =
    # 0.65 for (6, 4) and 0.73 for (6, 3) (simulated), which 155 rows detect with power
    # 0.999. 16,384 rows, two of the interpreter's tiles, detect w^2 >= 0.0065 with power
    # 0.999 (one column in the subset 54 % of the time instead of 50 %, at (6, 3)).
    rows = 16_384 if backend == "triton" else 40_000
    mask = sample_subset_mask(rows, n, k, backend=backend)
    code = (mask * (2 ** torch.arange(n))).sum(1).long()
    counts = torch.bincount(code, minlength=2**n).double()
    counts = counts[counts > 0]
    assert counts.numel() == math.comb(n, k)
    expected = rows / math.comb(n, k)
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < _chi2_threshold(math.comb(n, k) - 1)


@pytest.mark.slow
def test_sampler_rows_independent(backend):
    # joint distribution of the subsets of two rows of the same draw: uniform on all pairs
    torch.manual_seed(2)
    # The chi-square bound at z = 5 fails independent rows with probability 2.6e-7 at any
    # size. C and torch draw 60,000 rows (cheap): power 0.999 from w^2 = sum (p - p0)^2 / p0
    # of 0.0057 (a copied subset in 2.5 % of the pairs: w^2 = 9 * rate^2). The Triton draws
    # are Philox keys of (seed, row * N + col), so dependence between rows is a structural
    # bug: rows sharing keys (a row stride off by one shares 1 of the 5: w^2 = 0.27,
    # simulated) or copying subsets. 16,384 rows (8,192 pairs, two of the interpreter's tiles)
    # detect w^2 >= 0.021 with power 0.999 (copies from a rate of 4.8 %; the shared key gives
    # a noncentrality of 2,200 against a bound at 186).
    n, k = 5, 2
    rows = 16_384 if backend == "triton" else 60_000
    mask = sample_subset_mask(rows, n, k, backend=backend)
    code = (mask * (2 ** torch.arange(n))).sum(1).long()
    ids = torch.unique(code, return_inverse=True)[1]
    c = math.comb(n, k)
    pairs = ids[0::2] * c + ids[1::2]
    counts = torch.bincount(pairs, minlength=c * c).double()
    expected = (rows // 2) / (c * c)
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < _chi2_threshold(c * c - 1)
    # wide rows: overlap of neighbouring rows is hypergeometric (mean k^2/n), no duplicates.
    # Every row is compared with the next: for independent rows the overlaps of (r, r + 1)
    # are i.i.d. (|S_r & S_r+1| is hypergeometric whatever S_r is, so independent of rows
    # 0..r), so 2,001 rows give the 2,000 overlaps that 4,000 rows in disjoint pairs gave:
    # the same bounds, false alarms and power, and neighbours across every boundary (of the
    # pairs, tiles and threads' chunks) compared too.
    n, k, rows = 400, 320, 2001
    mask = sample_subset_mask(rows, n, k, dtype=torch.float64, backend=backend)
    overlap = (mask[:-1] * mask[1:]).sum(1)
    mean = k * k / n
    var = k * (k / n) * ((n - k) / n) * ((n - k) / (n - 1))
    se = math.sqrt(var / overlap.numel())
    assert abs(overlap.mean().item() - mean) < 5 * se
    assert abs(overlap.var().item() / var - 1) < 5 * math.sqrt(2 / overlap.numel()) * 1.5
    assert (overlap < k).all()


def test_sampler_generator_reproducible(backend):
    g1 = torch.Generator().manual_seed(123)
    g2 = torch.Generator().manual_seed(123)
    a = sample_subset_mask(64, 50, 20, generator=g1, backend=backend)
    b = sample_subset_mask(64, 50, 20, generator=g2, backend=backend)
    assert torch.equal(a, b)
    assert not torch.equal(a, sample_subset_mask(64, 50, 20, generator=g1, backend=backend))


# ---------------------------------------------------------------------------------------------
# the layer in training mode


def test_layer_uses_exactly_k_per_row(backend):
    # A single spike at position j: if j is in the row's subset S, every other output equals
    # -1/sqrt(k-1) (subset mean 1/k, subset variance (k-1)/k^2); otherwise they are 0. So the
    # outputs reveal k for each row, and the share of rows with j in S estimates k/N.
    torch.manual_seed(3)
    n, f, rows = 50, 0.3, 4000
    # a tiny eps keeps rows without j (zero subset variance) finite: their outputs are 0
    # (the Triton kernel computes in float32, where 1e-200 would be 0)
    eps = 1e-30 if backend == "triton" else 1e-200
    layer = MCLayerNorm(n, eps=eps, elementwise_affine=False, fraction=f, backend=backend)
    layer = layer.double().train()
    k = layer.subset_size
    assert k == 15
    x = torch.zeros(rows, n, dtype=torch.float64)
    x[:, 7] = 1.0
    with torch.no_grad():
        y = layer(x)
    others = y[:, 0]
    hit = others != 0
    k_rows = 1 + 1 / others[hit] ** 2
    tol = 1e-4 if backend == "triton" else None
    torch.testing.assert_close(k_rows, torch.full_like(k_rows, float(k)), rtol=tol, atol=tol)
    share = hit.double().mean().item()
    se = math.sqrt(k / n * (1 - k / n) / rows)
    assert abs(share - k / n) < 5 * se


@pytest.mark.slow
def test_subset_mean_variance_matches_theory(backend):
    # Var(subset mean) = sigma^2 (N-k) / (k (N-1)) for a uniform k-subset without replacement.
    torch.manual_seed(4)
    # Every bound is 5 standard errors (false alarm ~6e-7 each, at any size). C and torch
    # draw 20,000 rows (cheap). The Triton kernel's arithmetic given its subsets, and its
    # subsets against the sampler's, are checked exactly in test_mcln_triton.py; here, under
    # the slow interpreter, 8,192 rows (eight tiles) keep these defects' failure probability
    # above 0.9999 (simulated): subsets of k - 1 or k + 1 elements (Var(subset mean) +15 % /
    # -12 %, relative s.e. 1.5 %), drawn with replacement (+30 %), or a subset variance
    # divided by k - 1 (E[v] +11 %, relative s.e. 0.34 %).
    n, f = 40, 0.25
    rows = 8192 if backend == "triton" else 20_000
    base = torch.randn(n, dtype=torch.float64) * 2 + 1
    layer = MCLayerNorm(n, eps=0.0, elementwise_affine=False, fraction=f, backend=backend)
    layer = layer.double().train()
    k = layer.subset_size
    with torch.no_grad():
        y = layer(base.expand(rows, n))
    # y = (x - mu) / s for every element: two elements give s and mu
    s = (base[0] - base[1]) / (y[:, 0] - y[:, 1])
    mu = base[0] - y[:, 0] * s
    sigma2 = base.var(unbiased=False).item()
    theory = sigma2 * (n - k) / (k * (n - 1))
    centred = mu - base.mean()
    assert abs(centred.mean().item()) < 5 * math.sqrt(theory / rows)
    var_hat = centred.pow(2).mean().item()
    # standard error of a variance estimate from the sample's own fourth moment
    se = math.sqrt((centred.pow(4).mean().item() - var_hat**2) / rows)
    assert abs(var_hat - theory) < 5 * se, (var_hat, theory, se)
    # the subset variance is biased (divisor k) and averages sigma^2 (N/(N-1)) (k-1)/k
    v = s.pow(2)
    expected_v = sigma2 * n / (n - 1) * (k - 1) / k
    assert abs(v.mean().item() - expected_v) < 5 * v.std().item() / math.sqrt(rows)


def test_fraction_one_equals_layer_norm():
    torch.manual_seed(5)
    x = torch.randn(32, 3, 20)
    layer = MCLayerNorm(20, fraction=1.0).train()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 2)
        layer.bias.uniform_(-1, 1)
    ref = F.layer_norm(x, (20,), layer.weight, layer.bias, layer.eps)
    torch.testing.assert_close(layer(x), ref)
    # the masked computation itself, with an all-ones mask, is LayerNorm too
    ones = torch.ones(96, 20)
    out = mc_layer_norm(x, 20, layer.weight, layer.bias, layer.eps, mask=ones)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_masked_matches_reference_on_subset():
    torch.manual_seed(6)
    x = torch.randn(16, 12, dtype=torch.float64)
    mask = sample_subset_mask(16, 12, 5, dtype=torch.float64)
    w = torch.randn(12, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64)
    out = mc_layer_norm(x, 12, w, b, 1e-5, mask=mask)
    sel = x[mask.bool()].reshape(16, 5)
    mu = sel.mean(1, keepdim=True)
    var = sel.var(1, unbiased=False, keepdim=True)
    torch.testing.assert_close(out, (x - mu) / torch.sqrt(var + 1e-5) * w + b)


def test_training_is_stochastic_and_per_row(backend):
    torch.manual_seed(7)
    layer = MCLayerNorm(30, fraction=0.5, backend=backend).train()
    x = torch.randn(1, 30).expand(64, 30)
    y = layer(x)
    # identical input rows get different subsets
    assert torch.unique(y.detach(), dim=0).shape[0] > 60
    assert not torch.allclose(layer(x), y)


# ---------------------------------------------------------------------------------------------
# evaluation modes


def test_eval_one_shot_is_layer_norm_and_deterministic():
    torch.manual_seed(8)
    layer = MCLayerNorm((3, 8), fraction=0.5)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 2)
        layer.bias.uniform_(-1, 1)
    layer.eval()
    x = torch.randn(10, 3, 8)
    ref = F.layer_norm(x, (3, 8), layer.weight, layer.bias, layer.eps)
    assert torch.equal(layer(x), ref)
    assert torch.equal(layer(x), layer(x))


def test_mc_mode_samples_at_eval_and_restores():
    torch.manual_seed(9)
    model = nn.Sequential(
        nn.Linear(6, 16), MCLayerNorm(16, fraction=0.5), nn.ReLU(), nn.Linear(16, 1)
    )
    model.eval()
    x = torch.randn(8, 6)
    with torch.no_grad():
        ref = model(x)
        with mc_mode(model) as mode:
            assert mode.count == 1 and model[1].mc_sampling
            assert not torch.allclose(model(x), model(x))
        assert not model[1].mc_sampling
        assert torch.equal(model(x), ref)
        # also usable as a plain call, like torch.set_grad_enabled
        mc_mode(model)
        assert model[1].mc_sampling
        mc_mode(model, enabled=False)
        assert torch.equal(model(x), ref)


# ---------------------------------------------------------------------------------------------
# gradients, shapes, dtypes, state dict, reproducibility


def test_gradcheck_float64(backend):
    torch.manual_seed(10)
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, requires_grad=True)
    mask = sample_subset_mask(6, 9, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, w, b: mc_layer_norm(x, 9, w, b, 1e-5, mask=mask), (x, w, b)
    )

    if backend == "triton":
        return  # float32 kernel: its gradients are checked against the masked formula below

    def seeded(x, w, b):
        g = torch.Generator().manual_seed(0)
        return mc_layer_norm(x, 9, w, b, 1e-5, fraction=0.5, generator=g, backend=backend)

    assert torch.autograd.gradcheck(seeded, (x, w, b))


@pytest.mark.parametrize(
    ("shape", "normalized"),
    [((4, 20), 20), ((4, 5, 8), 8), ((4, 5, 8), (5, 8)), ((2, 3, 4, 6), (4, 6))],
)
def test_shapes(shape, normalized, backend):
    layer = MCLayerNorm(normalized, fraction=0.5, backend=backend).train()
    x = torch.randn(shape, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape
    with pytest.raises(ValueError, match="trailing shape"):
        layer(torch.randn(4, 7))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_under_autocast(dtype, backend):
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(12, 24), MCLayerNorm(24, fraction=1.0)).train()
    x = torch.randn(8, 12)
    with torch.autocast("cpu", dtype=dtype):
        ref_lin = model[0](x)
        y = model(x)
        ref = F.layer_norm(ref_lin, (24,), model[1].weight, model[1].bias, model[1].eps)
    assert y.dtype == ref.dtype
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
    model[1] = MCLayerNorm(24, fraction=0.5, backend=backend).train()
    with torch.autocast("cpu", dtype=dtype):
        y = model(x)
    assert torch.isfinite(y.float()).all()
    y.float().sum().backward()
    assert torch.isfinite(model[0].weight.grad).all()
    # half input without autocast keeps its dtype
    out = MCLayerNorm(24, fraction=0.5, backend=backend).train()(torch.randn(4, 24).to(dtype))
    assert out.dtype == dtype and torch.isfinite(out.float()).all()


def test_state_dict_round_trip_with_layernorm():
    ln = nn.LayerNorm((3, 4))
    with torch.no_grad():
        ln.weight.uniform_()
        ln.bias.uniform_()
    mc = MCLayerNorm((3, 4), fraction=0.5)
    mc.load_state_dict(ln.state_dict())
    back = nn.LayerNorm((3, 4))
    back.load_state_dict(mc.state_dict())
    assert mc.state_dict().keys() == ln.state_dict().keys()
    for key, value in ln.state_dict().items():
        assert torch.equal(back.state_dict()[key], value)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(mc.eval()(x), ln(x))
    # no bias / no affine variants line up too
    for kwargs in ({"bias": False}, {"elementwise_affine": False}):
        MCLayerNorm(5, fraction=0.6, **kwargs).load_state_dict(
            nn.LayerNorm(5, **kwargs).state_dict()
        )


def test_manual_seed_and_generator_reproducible(backend):
    layer = MCLayerNorm(40, fraction=0.5, backend=backend).train()
    x = torch.randn(16, 40)
    torch.manual_seed(12)
    a = layer(x)
    torch.manual_seed(12)
    b = layer(x)
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(5)
    layer_g = MCLayerNorm(40, fraction=0.5, generator=g, backend=backend).train()
    c = layer_g(x)
    g.manual_seed(5)
    assert torch.equal(layer_g(x), c)


def test_repr_mentions_fraction_and_k():
    assert "fraction=0.8, k=320" in repr(MCLayerNorm(400))


# ---------------------------------------------------------------------------------------------
# the C kernel against the torch formula


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize(("n", "f"), [(37, 0.8), (16, 0.3), (50, 0.5)])
def test_kernel_matches_masked_formula_and_gradients(affine, n, f):
    if not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    torch.manual_seed(15)
    rows = 300
    k = mc_subset_size(n, f)
    x = torch.randn(rows, n, dtype=torch.float64) * 3 + 2
    w = torch.randn(n, dtype=torch.float64) if affine[0] else None
    b = torch.randn(n, dtype=torch.float64) if affine[1] else None
    # the same generator state gives the kernel's forward and its sampler the same subsets
    mask = sample_subset_mask(
        rows, n, k, generator=torch.Generator().manual_seed(3), dtype=torch.float64, backend="c"
    )
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
    out = mc_layer_norm(
        x, n, w, b, 1e-5, f, generator=torch.Generator().manual_seed(3), backend="c"
    )
    ref = mc_layer_norm(x, n, w, b, 1e-5, mask=mask)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    ref_grads = torch.autograd.grad(ref, leaves, g)
    for a, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, r)
    # float32 agrees with float64 to float32 precision
    out32 = mc_layer_norm(
        x.float(),
        n,
        None if w is None else w.float(),
        None if b is None else b.float(),
        1e-5,
        f,
        generator=torch.Generator().manual_seed(3),
        backend="c",
    )
    torch.testing.assert_close(out32.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("n", "k"), [(70, 2), (70, 68)])
def test_kernel_wide_rows_uniform_over_all_pairs(n, k):
    # rows wider than 64 take the kernel's byte-set path of Floyd's algorithm (narrow rows a
    # register): the 2 drawn positions (k = 2, or the 2 left out of k = n - 2) are uniform
    # over all C(n, 2) pairs, including the steps that draw the new top position itself
    if not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    rows = 200_000
    mask = sample_subset_mask(
        rows, n, k, generator=torch.Generator().manual_seed(4), dtype=torch.uint8, backend="c"
    )
    assert (mask.sum(1, dtype=torch.int64) == k).all()
    drawn = mask if k == 2 else 1 - mask
    pos = drawn.nonzero()[:, 1].reshape(rows, 2)
    code = pos[:, 0] * n + pos[:, 1]
    counts = torch.bincount(code, minlength=n * n).double()
    pairs = math.comb(n, 2)
    assert int((counts > 0).sum()) == pairs
    expected = rows / pairs
    chi2 = ((counts[counts > 0] - expected) ** 2 / expected).sum().item()
    assert chi2 < _chi2_threshold(pairs - 1)


def test_kernel_result_independent_of_thread_count():
    if not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    x = torch.randn(3000, 64, requires_grad=True)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = mc_layer_norm(x, 64, generator=torch.Generator().manual_seed(1), backend="c")
            (gx,) = torch.autograd.grad(y.square().sum(), x)
            outs.append((y, gx))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


def test_kernel_ops_pass_opcheck():
    if not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    x = torch.randn(12, 10)
    w, b = torch.randn(3, 10), torch.randn(3, 10)
    key = torch.tensor([5], dtype=torch.int64)
    for weight, bias in ((w, b), (None, b), (None, None)):
        torch.library.opcheck(
            torch.ops.ctrcal.mc_layer_norm_cpu_fwd.default,
            (x, weight, bias, key, 3, 6, 1e-5),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
        )


@pytest.mark.slow
@pytest.mark.parametrize("per_field", [False, True])
def test_compiled_graph_keeps_the_kernel_and_equals_eager(monkeypatch, per_field):
    """torch.compile on CPU keeps the C kernel's op in the graph (the traced torch path would
    be 10-20x slower) and draws the same subsets as eager from the same RNG state."""
    if not kernel_available():
        pytest.skip("no C compiler: the MC-LayerNorm C kernel cannot be built here")
    from compiled import compiled_and_eager

    from ctrcal.layers.embedding import FieldNorm

    monkeypatch.delenv("CTRCAL_MCLN_BACKEND", raising=False)
    torch.manual_seed(0)
    if per_field:
        layer, x = FieldNorm(5, 16, "mclayernorm").train(), torch.randn(9, 5, 16)
    else:
        layer, x = MCLayerNorm(24, fraction=0.5).train(), torch.randn(9, 24)
    frames, ops, results = compiled_and_eager(layer, x, lambda y: y.square().sum())
    assert frames == 1
    assert any("mc_layer_norm_cpu_fwd" in op for op in ops), ops
    (y_c, g_c), (y_e, g_e) = results
    assert torch.equal(y_c, y_e)
    for a, b in zip(g_c, g_e, strict=True):
        assert torch.equal(a, b)


def test_backend_validation_and_fallback(monkeypatch):
    with pytest.raises(ConfigError, match="backend"):
        MCLayerNorm(8, backend="cuda")
    with pytest.raises(ConfigError, match="backend"):
        mc_layer_norm(torch.randn(2, 8), 8, backend="fast")
    monkeypatch.setenv("CTRCAL_MCLN_BACKEND", "torch")
    assert dispatch.choose_backend(None, torch.randn(2, 8)) == "torch"
    monkeypatch.delenv("CTRCAL_MCLN_BACKEND")
    # a kernel that cannot be built: auto warns once and falls back, "c" raises
    library = mcln_kernel._LIBRARY
    monkeypatch.setattr(library, "_lib", None)
    monkeypatch.setattr(library, "_tried", True)
    monkeypatch.setattr(library, "error", "no C compiler found")
    monkeypatch.setattr(dispatch, "_warned", [])
    with pytest.warns(UserWarning, match="pure-torch"):
        y = MCLayerNorm(8, fraction=0.5).train()(torch.randn(4, 8))
    assert y.shape == (4, 8)
    with pytest.raises(RuntimeError, match="no C compiler"):
        mc_layer_norm(torch.randn(2, 8), 8, backend="c")


# ---------------------------------------------------------------------------------------------
# mc_predict


class _TwoInput(nn.Module):
    def __init__(self, fraction=0.5, keep_dim=False):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.lin = nn.Linear(8 + 3, 32)
        self.norm = MCLayerNorm(32, fraction=fraction)
        self.out = nn.Linear(32, 1)
        self.keep_dim = keep_dim

    def forward(self, cat, num):
        h = torch.cat([self.emb(cat).sum(1), num], dim=1)
        logits = self.out(torch.relu(self.norm(self.lin(h))))
        return logits if self.keep_dim else logits.squeeze(1)


@pytest.mark.parametrize("keep_dim", [False, True])
def test_mc_predict_matches_loop_and_restores_mode(keep_dim):
    torch.manual_seed(13)
    model = _TwoInput(keep_dim=keep_dim).train()
    cat = torch.randint(0, 10, (7, 4))
    num = torch.randn(7, 3)
    mean, std = mc_predict(model, cat, num, n_samples=200)
    assert model.training and not model.norm.mc_sampling
    assert mean.shape == (7,) and std.shape == (7,)
    assert (std > 0).all()
    # reference: a Python loop of stochastic passes averaging probabilities
    model.eval()
    with torch.no_grad(), mc_mode(model):
        probs = torch.stack([torch.sigmoid(model(cat, num).reshape(-1)) for _ in range(400)])
    ref_mean = probs.mean(0)
    assert ((mean - ref_mean).abs() < 5 * probs.std(0) * math.sqrt(1 / 200 + 1 / 400) + 1e-6).all()
    # probabilities, not logits, are averaged: the mean of sigmoids differs from sigmoid of mean
    assert torch.all((mean >= 0) & (mean <= 1))


def test_mc_predict_chunked_equals_unchunked():
    cat = torch.randint(0, 10, (9, 4), generator=torch.Generator().manual_seed(0))
    num = torch.randn(9, 3, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(14)
    model = _TwoInput()
    with torch.no_grad():  # spread the rows' probabilities, so a row mixed up shows
        model.out.weight.mul_(4)
    # fraction 1: every pass is exact LayerNorm, so the chunked path must give the same
    # numbers row for row (a chunk assembled in the wrong order or repeated would not)
    model.norm = MCLayerNorm(32, fraction=1.0)
    full_mean, full_std = mc_predict(model, cat, num, n_samples=5)
    model.eval()
    with torch.no_grad():
        ref = torch.sigmoid(model(cat, num))
    torch.testing.assert_close(full_mean, ref)
    assert full_std.abs().max() < 1e-6
    for max_rows in (1, 4, 7, 20):  # one row, uneven chunks, several samples per pass
        mean, std = mc_predict(model, cat, num, n_samples=5, max_rows=max_rows)
        torch.testing.assert_close(mean, full_mean)
        torch.testing.assert_close(std, full_std, atol=1e-6, rtol=0)
    # fraction 0.5, same seed: chunked and unchunked draw different subsets, but estimate the
    # same per-row mean and std (within 5 standard errors of n samples each)
    model.norm = MCLayerNorm(32, fraction=0.5)
    n = 400
    torch.manual_seed(15)
    full_mean, full_std = mc_predict(model, cat, num, n_samples=n)
    torch.manual_seed(15)
    mean, std = mc_predict(model, cat, num, n_samples=n, max_rows=4)
    assert (full_std > 1e-3).all()
    assert not torch.equal(mean, full_mean)  # the passes really are different samples
    se_mean = full_std * math.sqrt(2 / n)
    assert ((mean - full_mean).abs() < 5 * se_mean).all(), (mean - full_mean) / se_mean
    # two std estimates from n samples each: relative error ~ sqrt(2 / (2n)) = 5 % for normal
    # samples; 30 % leaves room for skewed per-row distributions of probabilities
    assert ((std / full_std - 1).abs() < 0.3).all(), std / full_std


def test_mc_predict_argument_checks_and_plain_models():
    model = _TwoInput()
    cat = torch.randint(0, 10, (9, 4))
    num = torch.randn(9, 3)
    # one-shot model (no MC layers): warns, runs one pass, std is exactly zero
    plain = nn.Sequential(nn.Linear(3, 1))
    rows = []
    plain.register_forward_hook(lambda m, args, out: rows.append(len(args[0])))
    with pytest.warns(UserWarning, match="no MC layers"):
        mean, std = mc_predict(plain, num, n_samples=3)
    assert rows == [9] and torch.equal(std, torch.zeros(9))
    with torch.no_grad():
        torch.testing.assert_close(mean, torch.sigmoid(plain(num)).squeeze(1))
    with pytest.raises(ValueError):
        mc_predict(model, cat, num[:3])
    with pytest.raises(ValueError):
        mc_predict(model, cat, num, n_samples=0)


class _BatchInput(_TwoInput):
    """The same network called as a ctrcal model: ``forward(batch)``; it records labels."""

    def forward(self, batch):
        self.labels_seen = getattr(self, "labels_seen", []) + [batch.label]
        return super().forward(batch.categorical, batch.numeric)


def test_mc_predict_on_a_batch_equals_the_tensors_and_hides_the_label():
    from ctrcal.core.batch import Batch

    cat = torch.randint(0, 10, (9, 4), generator=torch.Generator().manual_seed(2))
    num = torch.randn(9, 3, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(16)
    model = _BatchInput()
    twin = _TwoInput()
    twin.load_state_dict(model.state_dict())
    batch = Batch(cat, num, torch.ones(9))
    for max_rows in (None, 4):  # one pass, and uneven chunks of repeated rows
        torch.manual_seed(17)
        mean, std = mc_predict(model, batch, n_samples=6, max_rows=max_rows)
        torch.manual_seed(17)
        ref_mean, ref_std = mc_predict(twin, cat, num, n_samples=6, max_rows=max_rows)
        torch.testing.assert_close(mean, ref_mean, rtol=0, atol=0)
        torch.testing.assert_close(std, ref_std, rtol=0, atol=0)
    assert model.labels_seen and all(label is None for label in model.labels_seen)
    with pytest.raises(ValueError, match="same batch size"):
        mc_predict(model, Batch(cat, num[:3], None))


# One fresh process serves two checks of a CPU run: it loads the C kernel libraries (the
# OpenMP check of tests/layers/test_chunks.py's subject), then trains a step with them.
_CPU_PROCESS = """
import json, sys
from pathlib import Path
import torch
from ctrcal.layers.kernels import chunks, cpu_kernels, mcln_kernel

def runtimes():
    maps = Path("/proc/self/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if "gomp" in line})

openmp = None
if sys.platform.startswith("linux"):
    before = runtimes()  # before anything loads a kernel library
    libs = [cpu_kernels.cpu_kernels()]
    if mcln_kernel.kernel_available():
        libs.append(mcln_kernel.get_kernel())
    if None not in libs and len(libs) == 2:
        openmp = {
            "torch_on_loaded_gomp": chunks.torch_uses_loaded_openmp(),
            "libs_run_chunks": [chunks.runs_chunks_itself(lib) for lib in libs],
            "before": before,
            "after": runtimes(),
        }

from ctrcal.models.build import create_model
from ctrcal.config import ModelConfig
class FM:
    vocab_sizes = [7, 9]; numeric_fields = ['I1']; bucket_boundaries = None
m = create_model(ModelConfig('masknet', embedding_dim=4, hidden_units=[8],
    emb_norm='mclayernorm', net_norm='mclayernorm'), FM())
from ctrcal.core.batch import Batch
out = m(Batch(torch.randint(0, 7, (32, 2)), torch.randn(32, 1), None))
out.sum().backward()
assert 'triton' not in sys.modules, 'triton was imported'
print(json.dumps(openmp))
"""


@pytest.mark.slow
def test_cpu_training_does_not_import_triton_and_kernels_use_torchs_openmp():
    """In a fresh CPU process: triton is imported only for a CUDA tensor or the interpreter,
    so a CPU training step never pays its import; and the kernel libraries, built with
    -fopenmp, bind to the libgomp torch loaded: loading them maps no further OpenMP runtime
    (Linux, with the C kernels, where torch runs on a loaded GNU OpenMP)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _CPU_PROCESS], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    openmp = json.loads(proc.stdout.splitlines()[-1])
    if openmp is not None and openmp["torch_on_loaded_gomp"]:
        assert openmp["libs_run_chunks"] == [True, True], openmp
        assert openmp["before"] == openmp["after"], openmp  # the same OpenMP runtimes
