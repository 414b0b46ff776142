"""Isotonic calibration: a non-decreasing map from logit to click probability.

Isotonic regression (Zadrozny and Elkan 2002) has no parametric shape, so it also fixes
miscalibration that is not a logit-linear distortion; see :class:`IsotonicCalibration`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ctrcal.calibration.base import Calibrator, Segments, fit_inputs, logit

__all__ = ["IsotonicCalibration"]


def _interp(x: Any, xp: np.ndarray, fp: np.ndarray) -> Any:
    """Piecewise-linear interpolation clipped at the ends, numpy or torch (keeps the type)."""
    if not hasattr(x, "detach"):
        return np.interp(np.asarray(x, dtype=np.float64), xp, fp)
    import torch

    xt = x.detach().double()
    xpt = torch.as_tensor(xp, dtype=torch.float64, device=xt.device)
    fpt = torch.as_tensor(fp, dtype=torch.float64, device=xt.device)
    if xpt.numel() == 1:
        return torch.full_like(xt, float(fp[0])).to(x.dtype)
    xc = xt.clamp(xpt[0], xpt[-1])
    hi = torch.searchsorted(xpt, xc).clamp(1, xpt.numel() - 1)
    lo = hi - 1
    span = xpt[hi] - xpt[lo]
    t = torch.where(span > 0, (xc - xpt[lo]) / span, torch.zeros_like(xc))
    return (fpt[lo] + t * (fpt[hi] - fpt[lo])).to(x.dtype)


class IsotonicCalibration(Calibrator):
    """A non-decreasing map from logit to click probability, fitted by isotonic regression.

    Fitting pools adjacent violators (scikit-learn's ``IsotonicRegression``) on the
    validation logits, O(n log n). Plain isotonic regression gives a block of rows without a
    single click the probability 0 (and a block of only clicks 1): a click there on new data
    costs ``-log(eps)`` of log-loss, however few rows the block held. So each block's rate is
    then shrunk toward the fitting set's base rate p₀ by ``prior_strength`` pseudo-rows,
    ``(clicks_b + a·p₀) / (n_b + a)`` (a Beta prior with mean p₀), and the shrunk rates are
    pooled again, weighted by ``n_b + a``, so the map stays non-decreasing. Large blocks barely
    move; ``prior_strength=0`` is scikit-learn's fit exactly. The steps are kept as two arrays
    and applied by linear interpolation, clipped to the fitted range of logits (numpy or
    torch).

    Args:
        eps: ``transform`` returns ``logit(p)`` with p clipped to [eps, 1 − eps].
        prior_strength: a ≥ 0, pseudo-rows at the base rate added to every block.

    Attributes:
        x_thresholds_: [k] logits of the step ends, increasing.
        y_thresholds_: [k] calibrated probabilities there, non-decreasing (in (0, 1) when
            ``prior_strength > 0``).
    """

    _learned = ("x_thresholds_", "y_thresholds_")

    def __init__(self, eps: float = 1e-7, prior_strength: float = 1.0) -> None:
        if not (math.isfinite(prior_strength) and prior_strength >= 0):
            raise ValueError(f"prior_strength must be a finite number ≥ 0, got {prior_strength}")
        self.eps = eps
        self.prior_strength = prior_strength

    def fit(
        self, logits: Any, labels: Any, segments: Segments | None = None
    ) -> IsotonicCalibration:
        """Fit on logits [n] and 0/1 labels [n]; returns self."""
        from sklearn.isotonic import IsotonicRegression

        z, y = fit_inputs(logits, labels)
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(z, y)
        if self.prior_strength == 0:
            self.x_thresholds_ = np.asarray(iso.X_thresholds_, dtype=np.float64)
            self.y_thresholds_ = np.asarray(iso.y_thresholds_, dtype=np.float64)
            return self
        # the blocks: runs of rows (in logit order) sharing one fitted value
        order = np.argsort(z, kind="stable")
        zs, ys, fs = z[order], y[order], iso.predict(z[order])
        starts = np.flatnonzero(np.r_[True, fs[1:] != fs[:-1]])
        ends = np.r_[starts[1:], zs.size]
        n_b = (ends - starts).astype(np.float64)
        clicks_b = np.add.reduceat(ys, starts)
        a, base = float(self.prior_strength), float(y.mean())
        shrunk = (clicks_b + a * base) / (n_b + a)
        # pooling again keeps the map non-decreasing (shrinkage can reorder small blocks)
        pooled = IsotonicRegression().fit(
            np.arange(shrunk.size, dtype=np.float64), shrunk, sample_weight=n_b + a
        )
        rate = pooled.predict(np.arange(shrunk.size, dtype=np.float64))
        lo, hi = zs[starts], zs[ends - 1]
        # each block spans [lo, hi] at its rate; one point where the block is one logit value
        x = np.column_stack([lo, hi]).ravel()
        f = np.repeat(rate, 2)
        keep = np.r_[True, x[1:] != x[:-1]]
        self.x_thresholds_, self.y_thresholds_ = x[keep], f[keep]
        return self

    def predict_proba(self, logits: Any, segments: Segments | None = None) -> Any:
        """Calibrated click probabilities [n], same type as the input."""
        self._check_fitted()
        return _interp(logits, self.x_thresholds_, self.y_thresholds_)

    def transform(self, logits: Any, segments: Segments | None = None) -> Any:
        """``logit(predict_proba(logits))`` with p clipped to [eps, 1 − eps]."""
        return logit(self.predict_proba(logits), eps=self.eps)
