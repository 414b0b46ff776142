"""Post-hoc calibration of click logits: temperature, Platt, isotonic and field-aware.

Every calibrator is fitted on *clean validation* logits and labels, then applied unchanged to
any test logits (clean or shifted); scikit-learn conventions: the constructor stores
parameters, ``fit`` learns state ending in ``_`` and returns ``self``, ``transform`` maps
logits to calibrated logits and ``predict_proba`` to calibrated click probabilities.

* :class:`TemperatureScaling` (Guo et al. 2017): ``z / T``, one scalar T > 0. It rescales
  confidence without moving the decision order, so AUC is unchanged.
* :class:`PlattScaling` (Platt 1999): ``a · z + b``, two scalars; also corrects a shift of
  the base rate (the intercept). AUC is unchanged when a > 0.
* :class:`IsotonicCalibration` (Zadrozny and Elkan 2002): the non-decreasing step function of
  z that minimises the squared error to the labels (pool-adjacent-violators, scikit-learn's),
  interpolated linearly between its steps; no parametric shape, so it also fixes
  miscalibration that is not a logit-linear distortion.
* :class:`~ctrcal.eval.field_aware.FieldAwareCalibration` (in its own module, re-exported
  here): one Platt or isotonic calibrator per value of a chosen field, shrunk toward the global
  one by the value's row count (see there).

The NLL of a logistic model in one or two scalars is convex, so temperature and Platt are
fitted by Newton's method with a backtracking line search in float64 (a handful of
iterations, exact to ``tol``), with no learning rate to tune.

To calibrate a predictor that outputs probabilities (e.g. MC integration, which averages
sigmoid outputs), pass ``logit(p)``.

Example::

    ts = TemperatureScaling().fit(valid_logits, valid_labels)
    probs = ts.predict_proba(test_logits)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "IsotonicCalibration",
    "PlattScaling",
    "TemperatureScaling",
    "logit",
]


def _to_float64(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def logit(probs: Any, eps: float = 1e-7) -> Any:
    """log(p / (1 − p)) with p clipped to [eps, 1 − eps]; keeps tensors tensors."""
    if hasattr(probs, "detach"):
        p = probs.clamp(eps, 1.0 - eps)
        return (p / (1.0 - p)).log()
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1.0 - eps)
    return np.log(p / (1.0 - p))


def _nll(t: np.ndarray, y: np.ndarray) -> float:
    # mean of log(1 + e^t) − y·t, stable for large |t|
    return float(np.mean(np.logaddexp(0.0, t) - y * t))


def _newton_logistic(
    x: np.ndarray, y: np.ndarray, w0: np.ndarray, max_iter: int, tol: float
) -> tuple[np.ndarray, int]:
    """Minimise mean NLL of sigmoid(x @ w) for a tiny design matrix x [n, k] (k ≤ 2)."""
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


def _fit_inputs(logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    z = _to_float64(logits, "logits")
    y = _to_float64(labels, "labels")
    if z.shape != y.shape:
        raise ValueError(f"logits and labels differ in length: {z.size} vs {y.size}")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    if y.min() == y.max():
        raise ValueError("calibration needs both clicks and non-clicks in the fitting set")
    return z, y


def _sigmoid_like(z: Any) -> Any:
    if hasattr(z, "detach"):
        return z.sigmoid()
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))


class _Scaler:
    def _check_fitted(self) -> None:
        missing = [k for k in self._learned if not hasattr(self, k)]
        if missing:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() first")

    _learned: tuple[str, ...] = ()

    def fit_transform(self, logits: Any, labels: Any) -> Any:
        return self.fit(logits, labels).transform(logits)

    def predict_proba(self, logits: Any) -> Any:
        """sigmoid(transform(logits)): calibrated click probabilities [n]."""
        return _sigmoid_like(self.transform(logits))


class TemperatureScaling(_Scaler):
    """Divide logits by one temperature T > 0 fitted by NLL on validation data.

    Args:
        max_iter: Newton iterations at most.
        tol: stop when the parameter step is below this.

    Attributes:
        temperature_: the fitted T (> 1 softens over-confident predictions).
        n_iter_: Newton iterations used.
    """

    _learned = ("temperature_",)

    def __init__(self, max_iter: int = 100, tol: float = 1e-10) -> None:
        self.max_iter = max_iter
        self.tol = tol

    def fit(self, logits: Any, labels: Any) -> TemperatureScaling:
        """Fit T on logits [n] and 0/1 labels [n]; returns self."""
        z, y = _fit_inputs(logits, labels)
        # NLL is convex in the inverse temperature β = 1/T (a logistic slope without intercept)
        beta, self.n_iter_ = _newton_logistic(z[:, None], y, np.ones(1), self.max_iter, self.tol)
        if not beta[0] > 0:
            raise ValueError(
                "temperature scaling needs logits that rank clicks above non-clicks "
                f"(fitted inverse temperature {beta[0]:.4g} <= 0)"
            )
        self.temperature_ = float(1.0 / beta[0])
        return self

    def transform(self, logits: Any) -> Any:
        """logits / T, same type (array or tensor) and shape as the input."""
        self._check_fitted()
        if hasattr(logits, "detach"):
            return logits / self.temperature_
        return np.asarray(logits, dtype=np.float64) / self.temperature_


class PlattScaling(_Scaler):
    """Map logits through ``a · z + b`` with (a, b) fitted by NLL on validation data.

    Args:
        max_iter: Newton iterations at most.
        tol: stop when the parameter step is below this.

    Attributes:
        coef_: the fitted slope a.
        intercept_: the fitted intercept b.
        n_iter_: Newton iterations used.
    """

    _learned = ("coef_", "intercept_")

    def __init__(self, max_iter: int = 100, tol: float = 1e-10) -> None:
        self.max_iter = max_iter
        self.tol = tol

    def fit(self, logits: Any, labels: Any) -> PlattScaling:
        """Fit (a, b) on logits [n] and 0/1 labels [n]; returns self."""
        z, y = _fit_inputs(logits, labels)
        x = np.stack([z, np.ones_like(z)], axis=1)
        w, self.n_iter_ = _newton_logistic(x, y, np.array([1.0, 0.0]), self.max_iter, self.tol)
        self.coef_, self.intercept_ = float(w[0]), float(w[1])
        return self

    def transform(self, logits: Any) -> Any:
        """a · logits + b, same type (array or tensor) and shape as the input."""
        self._check_fitted()
        if hasattr(logits, "detach"):
            return logits * self.coef_ + self.intercept_
        return np.asarray(logits, dtype=np.float64) * self.coef_ + self.intercept_


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


class IsotonicCalibration(_Scaler):
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

    def fit(self, logits: Any, labels: Any) -> IsotonicCalibration:
        """Fit on logits [n] and 0/1 labels [n]; returns self."""
        from sklearn.isotonic import IsotonicRegression

        z, y = _fit_inputs(logits, labels)
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

    def predict_proba(self, logits: Any) -> Any:
        """Calibrated click probabilities [n], same type as the input."""
        self._check_fitted()
        return _interp(logits, self.x_thresholds_, self.y_thresholds_)

    def transform(self, logits: Any) -> Any:
        """``logit(predict_proba(logits))`` with p clipped to [eps, 1 − eps]."""
        return logit(self.predict_proba(logits), eps=self.eps)


def __getattr__(name: str) -> Any:
    # the field-aware calibrator lives in its own module (it needs field handling)
    if name == "FieldAwareCalibration":
        from ctrcal.eval.field_aware import FieldAwareCalibration

        return FieldAwareCalibration
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
