"""MC-LayerNorm's C kernel: the subsets it saves (exactly k a row, uniform) and its backward
against autograd through the reference formula on the same subsets."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from ctrcal.layers.kernels import mcln_kernel
from ctrcal.layers.mc_layernorm.definition import masked_rows

pytestmark = pytest.mark.skipif(
    not mcln_kernel.kernel_available(), reason="the C kernel does not build here"
)


def unpack(bits: torch.Tensor, n: int) -> torch.Tensor:
    """The forward's saved subsets [R, words] (int64) as a 0/1 mask [R, n]."""
    shifts = torch.arange(64, dtype=torch.int64)
    return ((bits.unsqueeze(-1) >> shifts) & 1).reshape(bits.shape[0], -1)[:, :n]


@pytest.mark.parametrize(
    ("n", "k"),
    [(8, 6), (16, 12), (37, 2), (64, 51), (65, 2), (65, 63), (100, 30), (400, 320), (1000, 999)],
)
def test_every_row_has_exactly_k_and_the_forward_saves_what_subset_mask_draws(n, k):
    rows, key = 3000, 1234
    mask = mcln_kernel.subset_mask(rows, n, k, key)
    assert (mask.sum(1) == k).all()
    x = torch.randn(rows, n)
    _y, bits, _mean, _rstd = mcln_kernel.forward(x, None, None, k, 1e-5, key)
    assert bits.shape == (rows, -(-n // 64)) and bits.dtype == torch.int64
    assert torch.equal(unpack(bits, n).to(torch.uint8), mask)
    shifts = torch.arange(64, dtype=torch.int64)
    assert not ((bits.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, n:].any()  # no stray bit


@pytest.mark.parametrize(("n", "k"), [(400, 320), (100, 30), (65, 2), (16, 12)])
def test_inclusion_frequencies_are_uniform(n, k):
    """Per-feature counts over many rows: chi-square with n - 1 degrees of freedom (rows are
    independent; within a row the k inclusions sum to k)."""
    rows = 40_000
    counts = mcln_kernel.subset_mask(rows, n, k, 99).double().sum(0)
    p = k / n
    chi2 = float(((counts - rows * p) ** 2).sum() / (rows * p * (1 - p)))
    assert stats.chi2.sf(chi2, n - 1) > 1e-4, chi2


@pytest.mark.parametrize(("n", "k"), [(65, 2), (65, 63), (66, 64)])
def test_every_subset_is_equally_likely(n, k):
    """All C(n, k) subsets (2080 or 2145) counted over many rows: chi-square goodness of fit
    to the uniform distribution. Rows wider than 64 draw a count-corrected Bernoulli mask; with
    k = 2 it adds features, with k = 63 it removes them."""
    total = math.comb(n, k)
    rows = 60 * total
    mask = mcln_kernel.subset_mask(rows, n, k, 7)
    small = mask if k <= n - k else 1 - mask  # the smaller side names the subset
    idx = small.nonzero()[:, 1].reshape(rows, -1)
    # the subset's index among all d-subsets (combinatorial number system)
    code = torch.zeros(rows, dtype=torch.int64)
    for j in range(idx.shape[1]):
        code += torch.tensor([math.comb(int(v), j + 1) for v in range(n)])[idx[:, j]]
    observed = torch.bincount(code, minlength=total).double()
    assert observed.numel() == total
    chi2 = float(((observed - rows / total) ** 2).sum() / (rows / total))
    assert stats.chi2.sf(chi2, total - 1) > 1e-4, chi2


def test_rows_and_keys_draw_independent_subsets():
    a = mcln_kernel.subset_mask(2000, 400, 320, 5).float()
    b = mcln_kernel.subset_mask(2000, 400, 320, 6).float()
    # overlap of two independent 320-subsets of 400: mean 256, sd about 3.6
    overlap = (a * b).sum(1)
    assert abs(float(overlap.mean()) - 256.0) < 0.5
    assert abs(float((a[1:] * a[:-1]).sum(1).mean()) - 256.0) < 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("groups", "n", "k"), [(1, 400, 320), (1, 100, 50), (39, 16, 12)])
@pytest.mark.parametrize("affine", [True, False])
def test_backward_is_autograd_of_the_reference_on_the_same_subsets(dtype, groups, n, k, affine):
    torch.manual_seed(0)
    rows = 64 * groups + (groups == 1)  # an odd count: the last row without a pair
    x = (torch.randn(rows, n, dtype=dtype) * 3 + 1).requires_grad_()
    w = torch.randn(groups, n, dtype=dtype) if affine else None
    b = torch.randn(groups, n, dtype=dtype) if affine else None
    g = torch.randn(rows, n, dtype=dtype)
    y, bits, mean, rstd = mcln_kernel.forward(x.detach(), w, b, k, 1e-5, 42, groups)
    dx, dw, db = mcln_kernel.backward(g, x.detach(), w, bits, mean, rstd, k, groups)

    mask = unpack(bits, n).to(dtype)
    wr = w.clone().requires_grad_() if affine else None
    br = b.clone().requires_grad_() if affine else None
    ref = masked_rows(x, mask, k, wr, br, groups, 1e-5)
    ref.backward(g)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    torch.testing.assert_close(y, ref.detach(), **tol)
    torch.testing.assert_close(dx, x.grad, **tol)
    if affine:
        torch.testing.assert_close(dw, wr.grad, **tol)
        torch.testing.assert_close(db, br.grad, **tol)
