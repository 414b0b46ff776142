"""Calibration slope and intercept: logistic recalibration of the model's logit.

Fit ``P(y = 1) = sigmoid(a + b · logit(p))`` by maximum likelihood on the evaluated rows (Cox
1958; the "weak calibration" of Van Calster et al., J. Clin. Epidemiol. 2016):

* **slope** b: 1 for a calibrated model; b < 1 means the predictions are too extreme (over-
  confident: the logits must shrink), b > 1 too moderate.
* **intercept** a, fitted jointly with b.
* **intercept_in_the_large**: a with b fixed at 1 (the logit as an offset), i.e. the one logit
  shift that makes Σ p = Σ y. 0 for a model calibrated on average; > 0 means it under-predicts.
  This is the number usually reported as "calibration intercept" beside the slope.

The joint fit is Platt scaling's (two-parameter Newton in float64), the offset fit
calibration-free NE's logit shift: each rule has one owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import check_probs_labels
from ctrcal.metrics._metrics import DEFAULT_EPS, _logit_shift
from ctrcal.metrics._registry import declare_metric

__all__ = ["Recalibration", "calibration_slope_intercept"]


@dataclass(frozen=True)
class Recalibration:
    """Logistic recalibration of the logit (module docstring).

    Attributes:
        slope: b of ``sigmoid(a + b · logit p)``.
        intercept: a, fitted jointly with b.
        intercept_in_the_large: a with b fixed at 1.
    """

    slope: float
    intercept: float
    intercept_in_the_large: float

    def as_dict(self) -> dict[str, float]:
        return {
            "cal_slope": self.slope,
            "cal_intercept": self.intercept,
            "cal_intercept_large": self.intercept_in_the_large,
        }


def _nll(t: np.ndarray, y: np.ndarray) -> float:
    # mean of log(1 + e^t) − y·t, stable for large |t|
    return float(np.mean(np.logaddexp(0.0, t) - y * t))


def newton_logistic(
    x: np.ndarray, y: np.ndarray, w0: np.ndarray, max_iter: int, tol: float
) -> tuple[np.ndarray, int]:
    """Minimise mean NLL of sigmoid(x @ w) for a tiny design matrix x [n, k] (k ≤ 2).

    Newton's method with a backtracking line search in float64; returns (w, iterations).
    The calibration slope below and the scaling calibrators of :mod:`ctrcal.calibration`
    are this one fit.
    """
    w = w0.astype(np.float64).copy()
    n = x.shape[0]
    loss = _nll(x @ w, y)
    for it in range(1, max_iter + 1):
        t = x @ w
        s = 0.5 * (1.0 + np.tanh(0.5 * t))  # sigmoid without overflow warnings
        grad = x.T @ (s - y) / n
        hess = (x * (s * (1.0 - s))[:, None]).T @ x / n
        hess += 1e-12 * np.eye(len(w))  # keeps a separable / degenerate set solvable
        step = np.linalg.solve(hess, grad)
        lr = 1.0
        while True:
            cand = w - lr * step
            new_loss = _nll(x @ cand, y)
            if new_loss <= loss + 1e-4 * lr * float(grad @ -step) or lr < 1e-10:
                break
            lr *= 0.5
        w, improvement, loss = cand, loss - new_loss, new_loss
        if np.max(np.abs(lr * step)) < tol or abs(improvement) < tol * 1e-3:
            return w, it
    return w, max_iter


def calibration_slope_intercept(probs: Any, labels: Any, eps: float = DEFAULT_EPS) -> Recalibration:
    """Calibration slope and intercepts of predicted click probabilities.

    Args:
        probs: [n] predicted click probabilities (clipped to [eps, 1 − eps] for the logit).
        labels: [n] clicks, 0/1.
        eps: logit clipping.

    Returns:
        A :class:`Recalibration`; NaN fields when the rows hold a single class (no finite
        maximum-likelihood fit exists).
    """
    p, y = check_probs_labels(probs, labels)
    clicks = float(y.sum())
    if clicks == 0.0 or clicks == y.shape[0]:
        nan = float("nan")
        return Recalibration(nan, nan, nan)
    pc = np.clip(p.astype(np.float64), eps, 1.0 - eps)
    z = np.log(pc) - np.log1p(-pc)
    x = np.stack([z, np.ones_like(z)], axis=1)
    w, _ = newton_logistic(x, y.astype(np.float64), np.array([1.0, 0.0]), 100, 1e-10)
    offset = _logit_shift(z, clicks, 0.0, max_iter=100, tol=1e-10)
    return Recalibration(float(w[0]), float(w[1]), float(offset))


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

declare_metric(
    "cal_slope",
    label="Calibration slope",
    definition="calibration slope b of sigmoid(a + b·logit p) fitted to the clicks; 1 is "
    "calibrated, < 1 over-confident, > 1 under-confident.",
    better=None,
    computed_by="calibration_slope_intercept",
    tables=("calibration",),
)
declare_metric(
    "cal_intercept",
    label="Calibration intercept",
    definition="its intercept a, fitted jointly with b.",
    better=None,
    computed_by="calibration_slope_intercept",
    tables=("calibration",),
)
declare_metric(
    "cal_intercept_large",
    label="Calibration-in-the-large",
    definition="calibration-in-the-large: a with b fixed at 1 (the logit shift that makes "
    "Σp = Σy); 0 is calibrated on average, > 0 under-predicts.",
    better=None,
    computed_by="calibration_slope_intercept",
    tables=("calibration",),
)
