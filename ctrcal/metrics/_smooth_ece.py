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

    def __init__(self, p: np.ndarray, r: np.ndarray, weight: np.ndarray | None = None) -> None:
        """``weight``: [n] row counts (a bootstrap replicate's) of rows already sorted by p."""
        if weight is None:
            order = np.argsort(p)  # sums over runs of equal p do not depend on their order
            self.p, rs, w = p[order], r[order], np.ones_like(p)
        else:
            self.p, rs, w = p, r, weight
        cols = np.stack([w, w * self.p, w * rs, w * rs * self.p])
        self.sums = np.concatenate([np.zeros((4, 1)), np.cumsum(cols, axis=1)], axis=1)

    def on_grid(self, g: int) -> np.ndarray:
        """[2, g]: the residuals r and ones, each split linearly onto the two grid points
        around its p (point j at j / (g − 1); p = 1 falls in the last cell)."""
        n = self.p.shape[0]
        edges = np.searchsorted(self.p, np.arange(g - 1) / (g - 1), side="left")
        edges = np.append(edges, n)  # cell j: rows in [edges[j], edges[j + 1])
        cell = self.sums[:, edges[1:]] - self.sums[:, edges[:-1]]  # [4, g - 1]
        j = np.arange(g - 1)
        out = np.zeros((2, g))
        for k, (w, wp) in enumerate(((2, 3), (0, 1))):  # r: (Σr, Σr·p); ones: (Σ1, Σp)
            # Σ w·frac over a cell, frac = p·(g − 1) − j
            frac = (g - 1) * cell[wp] - j * cell[w]
            out[k, :-1] += cell[w] - frac
            out[k, 1:] += frac
        return out


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing of grid values [k, g], the data reflected at both ends.

    One FFT convolution of the [k, 3g - 2] reflected rows with the [g] kernel; the g values
    kept are those of the full convolution from ``g - 1 + g // 2`` on (numpy's FFT: scipy's
    ``fftconvolve`` gave the same to 1e-15 and cost a 0.8-1.1 s import)."""
    g = values.shape[1]
    t = np.linspace(0.0, 1.0, g)
    kernel = np.exp(-((t - 0.5) ** 2) / (2.0 * sigma**2)) / (np.sqrt(2.0 * np.pi) * sigma)
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


def _smooth_ece(rows: _Sorted, sigma: float, cache: dict) -> float:
    g = max(2000, round(20.0 / sigma)) // 2 + 1
    if g not in cache:  # the grid depends on σ only through g: shared by most σ
        cache[g] = rows.on_grid(g)
    smoothed = _smooth(cache[g], sigma)
    t = np.linspace(0.0, 1.0, max(round(10.0 / sigma), _MESH))
    rs, dens = _interpolate(t, smoothed)
    dens = dens + _DENSITY_EPS
    # Σ |r̂|·δ̂ / Σ δ̂ with r̂ = rs / δ̂
    return float(np.abs(rs).sum() / dens.sum())


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
    return _smooth_ece(_prepare(probs, labels), float(sigma), {})


def smooth_ece(probs: Any, labels: Any) -> SmoothECE:
    """smooth ECE at its own bandwidth σ* (smECE_σ* = σ*; module docstring).

    Equals ``relplot.smECE(probs, labels)``.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.

    Returns:
        A :class:`SmoothECE` (a float; ``.sigma`` is the bandwidth σ*).
    """
    return _fixed_point(_prepare(probs, labels))


def _fixed_point(rows: _Sorted) -> SmoothECE:
    """smooth ECE of sorted rows at σ* (the bisection of :func:`smooth_ece`); the rows' sums
    may be of weighted rows (a bootstrap replicate's row counts)."""
    cache: dict = {}

    def too_narrow(sigma: float) -> bool:  # the error exceeds the bandwidth: widen
        return sigma < _MIN_SIGMA or sigma < _smooth_ece(rows, sigma, cache)

    hi = 1.0
    if not too_narrow(hi):
        lo = 0.0
        for _ in range(_BISECTIONS):
            mid = (hi + lo) / 2.0
            if too_narrow(mid):
                lo = mid
            else:
                hi = mid
    return SmoothECE(_smooth_ece(rows, hi, cache), hi)


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
