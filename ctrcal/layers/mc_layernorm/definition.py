"""What MC-LayerNorm computes, in plain torch: the statement of its semantics.

Per row (a *row* is one index of the leading dimensions, the ``N = prod(normalized_shape)``
trailing elements are its features)::

    S  ~ uniform random subset of {1..N} with exactly k = max(2, floor(f * N)) elements
    mu = 1/k * sum_{i in S} x_i                     (subset mean)
    v  = 1/k * sum_{i in S} (x_i - mu)^2            (biased subset variance)
    y_i = (x_i - mu) / sqrt(v + eps) * weight_i + bias_i       for ALL i in 1..N

Every row draws its own subset, independently of every other row and of every other layer
(algorithm 1 of the paper). ``k`` is computed in exact rational arithmetic
(:func:`~ctrcal.core.norm_spec.mc_subset_size`, beside the other norm facts a config holds):
``f * N`` within 1e-9 of an integer counts as that integer, so ``f=0.3, N=10`` gives 3
although the float 0.3 is slightly below 0.3 (and ``int(0.29 * 100)`` is 28, not 29).

This module holds the formula (:func:`masked_rows`: rows normalised by the statistics of a
0/1 mask, then the affine) and the pure-torch sampler of the subsets
(:func:`torch_subset_mask`). The fused kernels compute the same function with their own
random bits: :mod:`ctrcal.layers.kernels.mcln_kernel` (C, CPU) and
:mod:`ctrcal.layers.kernels.mcln_triton` (Triton); the tests hold both to :func:`masked_rows`
on the subsets they draw. A change of the per-row computation therefore touches this module
and those two kernels (see the package docstring for the rest).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ctrcal.layers.kernels.mcln_kernel import small_side

__all__ = [
    "compute_dtype",
    "masked_rows",
    "torch_subset_mask",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the statistics for input of ``dtype``: float64 for float64, else float32
    (bfloat16 and float16 rows are normalised in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_k(n: int, k: int) -> None:
    """Raise ValueError unless ``0 <= k <= n``."""
    if not 0 <= k <= n:
        raise ValueError(f"subset size k={k} must be in [0, {n}]")


# All subsets of a small row as a table: one uniform index per row picks one exactly.
_TABLE_LIMIT = 4096
_tables: dict[tuple[int, int, str], Tensor] = {}


def _subset_table(n: int, d: int, device: torch.device) -> Tensor:
    key = (n, d, str(device))
    table = _tables.get(key)
    if table is None:
        if d == 0:
            table = torch.zeros(1, n)
        else:
            combos = torch.combinations(torch.arange(n), d).reshape(-1, d)
            table = torch.zeros(combos.shape[0], n).scatter_(1, combos, 1.0)
        table = table.to(device)
        _tables[key] = table
    return table


def torch_subset_mask(
    rows: int,
    n: int,
    k: int,
    generator: torch.Generator | None,
    device: torch.device,
    dtype: torch.dtype,
) -> Tensor:
    """Independent uniform k-subsets of ``{0..n-1}``, one per row, as a 0/1 mask ``[rows, n]``.

    The smaller side ``d = min(k, n - k)`` is drawn (the complement when k > n/2): when there
    are at most 4096 subsets of size d, a row of a table of all of them picked by
    ``floor(u * C)`` with a 53-bit u; otherwise the d smallest of i.i.d. float64 uniform keys
    (``topk``; a tie, probability about n^2 * 2^-54 per row, is the only departure from
    uniform). Per-row selection: slow on the CPU, fine on a GPU.
    """
    d, invert = small_side(n, k)
    if math.comb(n, d) <= _TABLE_LIMIT:
        table = _subset_table(n, d, device)
        u = torch.rand(rows, generator=generator, device=device, dtype=torch.float64)
        # floor(u * C) with a 53-bit u: each subset within C * 2**-53 of probability 1/C
        idx = (u * table.shape[0]).long().clamp_(max=table.shape[0] - 1)
        mask = F.embedding(idx, table)
    else:
        # the d smallest of i.i.d. float64 keys: a uniform d-subset (ties ~ n**2 * 2**-54)
        keys = torch.rand(rows, n, generator=generator, device=device, dtype=torch.float64)
        idx = keys.topk(d, dim=1, largest=False, sorted=False).indices
        mask = torch.zeros(rows, n, device=device).scatter_(1, idx, 1.0)
    if invert:
        mask = 1.0 - mask
    return mask.to(dtype)


def masked_rows(
    x: Tensor,
    mask: Tensor | None,
    counts: int | Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    groups: int,
    eps: float,
) -> Tensor:
    """The formula of the module docstring on rows ``x [R, N]``.

    Args:
        x: ``[R, N]``; row r takes affine row ``r % groups``.
        mask: ``[R, N]`` 0/1 in the compute dtype (the subsets), or None: every feature
            (LayerNorm).
        counts: features per row in the mask: an int, or ``[R, 1]``.
        weight: ``[groups, N]`` (or ``[N]``) or None.
        bias: like weight.
        groups: affine rows (1: the row layer; F: the per-field layer on ``[B * F, D]``).
        eps: added to the subset variance inside the square root.

    Returns:
        ``[R, N]`` in x's dtype; statistics in float32 (float64 for float64 input), outside
        autocast.
    """
    rows, n = x.shape
    compute = compute_dtype(x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        xf = x.to(compute)
        masked = xf if mask is None else xf * mask
        mu = masked.sum(dim=1, keepdim=True) / counts
        xc = xf - mu
        sq = xc * xc if mask is None else xc * xc * mask
        var = sq.sum(dim=1, keepdim=True) / counts
        y = (xc * torch.rsqrt(var + eps)).reshape(-1, groups, n)
        if weight is not None:
            y = y * weight.to(compute)
        if bias is not None:
            y = y + bias.to(compute)
    return y.reshape(rows, n).to(x.dtype)
