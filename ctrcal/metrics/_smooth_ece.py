"""Smooth ECE: a bin-free calibration error with a kernel bandwidth chosen by the data.

Błasiok and Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing"
(ICLR 2024). The residuals r_i = p_i − y_i are smoothed over the predicted probability with a
Gaussian kernel of bandwidth σ, reflected at 0 and 1 so no mass leaves [0, 1]:

    r̂_σ(t) = Σ_i K_σ(t, p_i) r_i / Σ_i K_σ(t, p_i),     δ̂_σ(t) = Σ_i K_σ(t, p_i),

    smECE_σ = ∫ |r̂_σ(t)| δ̂_σ(t) dt / ∫ δ̂_σ(t) dt,

and σ* is the fixed point smECE_σ* = σ* (the bandwidth no larger than the error it reports:
smoothing hides at most σ of miscalibration). smECE_σ decreases in σ, so σ* is found by
bisection. smooth ECE is consistent (unlike binned ECE it does not jump when a prediction
crosses a bin edge) and needs no bin count.

The numbers equal the authors' package ``relplot`` (``relplot.smECE``; Apple, MIT licence) on
the same inputs: the same discretisation (the rows are split linearly onto a grid of
``max(2000, round(20/σ)) // 2 + 1`` points, the kernel is applied by convolution on that grid
with the reflected data, and the integral is read on ``max(200, round(10/σ))`` points with
``1e-4`` added to the density), and the same 10-step bisection of σ on (0, 1]. It is
vectorised: one sort of the rows, after which every grid's cell sums are differences of running
sums (no pass over the rows per bandwidth), and FFT convolution: O(n log n), then O(G log G)
per bandwidth.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import check_probs_labels
from ctrcal.metrics._registry import declare_metric

__all__ = ["SmoothECE", "smooth_ece", "smooth_ece_at"]

_MESH = 200  # points the integral is read on (at least)
_DENSITY_EPS = 1e-4  # added to the smoothed density before dividing (as relplot does)
_MIN_SIGMA = 1e-3  # the bisection accepts any bandwidth below this
_BISECTIONS = 10


class SmoothECE(float):
    """smooth ECE as a float, with the bandwidth it was read at in ``.sigma``."""

    sigma: float

    def __new__(cls, value: float, sigma: float) -> SmoothECE:
        obj = super().__new__(cls, value)
        obj.sigma = float(sigma)
        return obj


class _Sorted:
    """Rows sorted by p once, with running sums of (1, p, r, r·p): every grid's cell sums are
    then differences of running sums at the cell edges (a search of g edges, no pass over
    the rows), for as many bandwidths as the search tries."""

    def __init__(self, p: np.ndarray, r: np.ndarray) -> None:
        order = np.argsort(p)  # sums over runs of equal p do not depend on their order
        self.p, rs = p[order], r[order]
        cols = np.stack([np.ones_like(self.p), self.p, rs, rs * self.p])
        self.sums = np.concatenate([np.zeros((4, 1)), np.cumsum(cols, axis=1)], axis=1)

    def cells(self, g: int) -> np.ndarray:
        """[4, 1, g − 1] the sums Σ1, Σp, Σr, Σr·p of the rows in each cell of the g-point
        grid (:func:`cell_edges`)."""
        edges = np.append(cell_edges(self.p, g), self.p.shape[0])
        return (self.sums[:, edges[1:]] - self.sums[:, edges[:-1]])[:, None, :]


def grid_points(sigma: float) -> int:
    """The grid of bandwidth σ: ``max(2000, round(20/σ)) // 2 + 1`` points (relplot's)."""
    return max(2000, round(20.0 / sigma)) // 2 + 1


def bisection_grids() -> list[int]:
    """Every grid the bisection of :func:`smooth_ece` can evaluate (its bandwidths are 1 and
    the dyadic fractions j / 2^10 from ``_MIN_SIGMA`` on)."""
    steps = 1 << _BISECTIONS
    sigmas = [j / steps for j in range(1, steps + 1) if j / steps >= _MIN_SIGMA]
    return sorted({grid_points(s) for s in sigmas})


def cell_edges(p: np.ndarray, g: int) -> np.ndarray:
    """[g - 1] the first of the sorted rows ``p`` in each cell of the g-point grid (cell j
    holds the rows with j / (g − 1) <= p < (j + 1) / (g − 1); p = 1 falls in the last)."""
    return np.searchsorted(p, np.arange(g - 1) / (g - 1), side="left")


def _split_onto_grid(w: np.ndarray, wp: np.ndarray, g: int) -> np.ndarray:
    """[m, g]: a value w of every row split linearly onto the two grid points around its p
    (point j at j / (g − 1)), from its per-cell sums Σw and Σw·p [m, g − 1]."""
    j = np.arange(g - 1)
    out = np.zeros((w.shape[0], g))
    # Σ w·frac over a cell, frac = p·(g − 1) − j
    frac = (g - 1) * wp - j * w
    out[:, :-1] += w - frac
    out[:, 1:] += frac
    return out


def _kernel(g: int, sigma: float) -> np.ndarray:
    t = np.linspace(0.0, 1.0, g)
    return np.exp(-((t - 0.5) ** 2) / (2.0 * sigma**2)) / (np.sqrt(2.0 * np.pi) * sigma)


def _mesh(sigma: float) -> np.ndarray:
    """The points the integral is read on."""
    return np.linspace(0.0, 1.0, max(round(10.0 / sigma), _MESH))


@functools.lru_cache(maxsize=64)
def _density_weights(g: int, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(α, β) [g − 1] with Σ_t δ̂_σ(t) = Σ_cells α·Σ1 + β·Σp over the mesh, and w [g] with
    Σ_t δ̂_σ(t) = w·(the ones split onto the grid): the smoothed density enters smooth ECE
    only through its sum, a linear function of the grid, so its weights are the transposed
    chain (reflect, convolve, interpolate) applied to ones once per bandwidth, instead of a
    smoothing per weighting."""
    t = _mesh(sigma)
    idx = np.clip((t * (g - 1)).astype(np.intp), 0, g - 2)
    frac = (t - idx / (g - 1)) * (g - 1)
    read = np.bincount(idx, 1.0 - frac, minlength=g) + np.bincount(idx + 1, frac, minlength=g)
    # the smoothing keeps the full convolution's values from `start`; its transpose
    # correlates them with the kernel
    start = g - 1 + g // 2
    full = np.zeros(4 * g - 3)
    full[start : start + g] = read
    n = _fast_length(full.shape[0] + g - 1)
    corr = np.fft.irfft(np.fft.rfft(full, n) * np.conj(np.fft.rfft(_kernel(g, sigma), n)), n)
    ext = corr[: 3 * g - 2]  # the reflected rows: v[g-1..1], v[0..g-1], v[g-2..0]
    w = ext[g - 1 : 2 * g - 1].copy()
    w[1:] += ext[g - 2 :: -1][: g - 1]
    w[:-1] += ext[2 * g - 1 :][::-1]
    j = np.arange(g - 1)
    step = w[1:] - w[:-1]
    return w[:-1] - j * step, (g - 1) * step, w


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing of grid values [k, g], the data reflected at both ends.

    One FFT convolution of the [k, 3g - 2] reflected rows with the [g] kernel; the g values
    kept are those of the full convolution from ``g - 1 + g // 2`` on (numpy's FFT: scipy's
    ``fftconvolve`` gave the same to 1e-15 and cost a 0.8-1.1 s import)."""
    g = values.shape[1]
    kernel = _kernel(g, sigma)
    flipped = values[:, ::-1]
    ext = np.concatenate([flipped[:, :-1], values, flipped[:, 1:]], axis=1)
    n = _fast_length(ext.shape[1] + g - 1)
    full = np.fft.irfft(np.fft.rfft(ext, n, axis=1) * np.fft.rfft(kernel, n), n, axis=1)
    start = g - 1 + g // 2
    return full[:, start : start + g]


def _fast_length(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n: an FFT length whose transform is fast."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _interpolate(t: np.ndarray, grid: np.ndarray) -> np.ndarray:
    g = grid.shape[1]
    idx = np.clip((t * (g - 1)).astype(np.intp), 0, g - 2)
    frac = (t - idx / (g - 1)) * (g - 1)
    return grid[:, idx] * (1.0 - frac) + grid[:, idx + 1] * frac


def _smooth_ece(cells: np.ndarray, sigma: float, wide: bool = False) -> np.ndarray:
    """[m] smooth ECE at bandwidth σ of m weightings of the rows, from their cell sums
    (Σ1, Σp, Σr, Σr·p), each [m, g − 1] on the grid of σ.

    ``wide``: NaN, without smoothing, where σ is surely not too narrow: the smoothing,
    reflection and interpolation are sums with weights >= 0, so Σ_t |r̂(t)| is at most the
    same chain applied to |r|, whose sum is w·|r| (:func:`_density_weights`); σ above that
    bound over Σ δ̂ (by more than rounding) is above the error itself.
    """
    g = cells[0].shape[1] + 1
    resid = _split_onto_grid(cells[2], cells[3], g)
    alpha, beta, w = _density_weights(g, sigma)
    t = _mesh(sigma)
    dens = cells[0] @ alpha + cells[1] @ beta + t.shape[0] * _DENSITY_EPS
    out = np.full(resid.shape[0], np.nan)
    todo = slice(None)
    if wide:
        todo = np.flatnonzero(sigma < (np.abs(resid) @ w) / dens * (1.0 + 1e-9))
        if todo.size == 0:
            return out
    rs = _interpolate(t, _smooth(resid[todo], sigma))
    # Σ |r̂|·δ̂ / Σ δ̂ with r̂ = rs / δ̂
    out[todo] = np.abs(rs).sum(axis=1) / dens[todo]
    return out


def _prepare(probs: Any, labels: Any) -> _Sorted:
    p, y = check_probs_labels(probs, labels)
    p = p.astype(np.float64, copy=False)
    return _Sorted(p, p - y)


def smooth_ece_at(probs: Any, labels: Any, sigma: float) -> float:
    """smooth ECE at a fixed bandwidth σ (``relplot.smECE_sigma``).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        sigma: kernel bandwidth in probability units, > 0.
    """
    if not (isinstance(sigma, (int, float)) and 0.0 < float(sigma)):
        raise ValueError(f"sigma: expected a bandwidth > 0, got {sigma!r}")
    sigma = float(sigma)
    return float(_smooth_ece(_prepare(probs, labels).cells(grid_points(sigma)), sigma)[0])


def smooth_ece(probs: Any, labels: Any) -> SmoothECE:
    """smooth ECE at its own bandwidth σ* (smECE_σ* = σ*; module docstring).

    Equals ``relplot.smECE(probs, labels)``.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.

    Returns:
        A :class:`SmoothECE` (a float; ``.sigma`` is the bandwidth σ*).
    """
    rows = _prepare(probs, labels)
    value, sigma = fixed_points(lambda g, which: rows.cells(g), 1)
    return SmoothECE(float(value[0]), float(sigma[0]))


def fixed_points(
    cells: Callable[[int, np.ndarray], np.ndarray], count: int
) -> tuple[np.ndarray, np.ndarray]:
    """smooth ECE at σ* of ``count`` weightings of the same rows (bootstrap replicates' row
    counts), their bisections run together: the weightings at one σ share a grid and one
    FFT.

    Args:
        cells: ``cells(g, which) -> (Σw, Σw·p, Σw·r, Σw·r·p)``, each [len(which), g − 1]:
            the weightings' sums over the rows of each cell of the g-point grid
            (:func:`cell_edges`).
        count: the number of weightings.

    Returns:
        ``(smooth ECE [count], σ* [count])``.
    """

    def errors(sigma: np.ndarray, which: np.ndarray, wide: bool) -> np.ndarray:
        out = np.empty(which.shape[0])
        for s in np.unique(sigma):  # dyadic fractions: equal bandwidths compare equal
            at = np.flatnonzero(sigma == s)
            out[at] = _smooth_ece(cells(grid_points(float(s)), which[at]), float(s), wide)
        return out

    # NaN: the error at hi is below hi by its bound, not yet computed
    every = np.arange(count)
    hi = np.ones(count)
    value = errors(hi, every, True)
    # too narrow (the error exceeds the bandwidth) at σ = 1: kept there
    search = ~((hi < _MIN_SIGMA) | (hi < value))
    lo = np.zeros(count)
    for _ in range(_BISECTIONS):
        which = np.flatnonzero(search)
        mid = (hi[which] + lo[which]) / 2.0
        narrow = mid < _MIN_SIGMA
        err = np.full(which.shape[0], np.nan)
        if (~narrow).any():
            err[~narrow] = errors(mid[~narrow], which[~narrow], True)
        narrow |= mid < err
        lo[which[narrow]] = mid[narrow]
        wide = which[~narrow]
        hi[wide], value[wide] = mid[~narrow], err[~narrow]
    pending = np.flatnonzero(np.isnan(value))
    if pending.size:
        value[pending] = errors(hi[pending], pending, False)
    return value, hi


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

declare_metric(
    "smooth_ece",
    label="Smooth ECE",
    definition="smooth ECE (Błasiok and Nakkiran 2023; equals relplot.smECE): kernel-smoothed "
    "|p − y| over p, at the bandwidth σ that equals the error; no bins; lower is better.",
    better="lower",
    compute=smooth_ece,
    tables=("calibration",),
    bounds=(0.0, 1.0),
)
declare_metric(
    "smooth_ece_sigma",
    label="Smooth ECE's bandwidth",
    definition="the bandwidth σ that smooth ECE was read at.",
    better=None,
    computed_by="smooth_ece (its .sigma)",
)
