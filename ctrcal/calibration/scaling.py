"""Temperature and Platt scaling: one or two scalars on the logit, fitted by Newton's method.

Both are fitted on *clean validation* logits and labels and then applied unchanged to any
test logits (clean or shifted); see :class:`~ctrcal.calibration.base.Calibrator`.

* :class:`TemperatureScaling` (Guo et al. 2017): ``z / T``, one scalar T > 0. It rescales
  confidence without moving the decision order, so AUC is unchanged.
* :class:`PlattScaling` (Platt 1999): ``a · z + b``, two scalars; also corrects a shift of
  the base rate (the intercept). AUC is unchanged when a > 0.

The NLL of a logistic model in one or two scalars is convex, so both are fitted by Newton's
method with a backtracking line search in float64 (a handful of iterations, exact to
``tol``), with no learning rate to tune.

To calibrate a predictor that outputs probabilities (e.g. MC integration, which averages
sigmoid outputs), pass ``logit(p)``.

Example::

    ts = TemperatureScaling().fit(valid_logits, valid_labels)
    probs = ts.predict_proba(test_logits)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctrcal.calibration.base import Calibrator, Segments, fit_inputs
from ctrcal.metrics import newton_logistic

__all__ = [
    "PlattScaling",
    "TemperatureScaling",
]


class TemperatureScaling(Calibrator):
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

    def fit(self, logits: Any, labels: Any, segments: Segments | None = None) -> TemperatureScaling:
        """Fit T on logits [n] and 0/1 labels [n]; returns self."""
        z, y = fit_inputs(logits, labels)
        # NLL is convex in the inverse temperature β = 1/T (a logistic slope without intercept)
        beta, self.n_iter_ = newton_logistic(z[:, None], y, np.ones(1), self.max_iter, self.tol)
        if not beta[0] > 0:
            raise ValueError(
                "temperature scaling needs logits that rank clicks above non-clicks "
                f"(fitted inverse temperature {beta[0]:.4g} <= 0)"
            )
        self.temperature_ = float(1.0 / beta[0])
        return self

    def transform(self, logits: Any, segments: Segments | None = None) -> Any:
        """logits / T, same type (array or tensor) and shape as the input."""
        self._check_fitted()
        if hasattr(logits, "detach"):
            return logits / self.temperature_
        return np.asarray(logits, dtype=np.float64) / self.temperature_


class PlattScaling(Calibrator):
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

    def fit(self, logits: Any, labels: Any, segments: Segments | None = None) -> PlattScaling:
        """Fit (a, b) on logits [n] and 0/1 labels [n]; returns self."""
        z, y = fit_inputs(logits, labels)
        x = np.stack([z, np.ones_like(z)], axis=1)
        w, self.n_iter_ = newton_logistic(x, y, np.array([1.0, 0.0]), self.max_iter, self.tol)
        self.coef_, self.intercept_ = float(w[0]), float(w[1])
        return self

    def transform(self, logits: Any, segments: Segments | None = None) -> Any:
        """a · logits + b, same type (array or tensor) and shape as the input."""
        self._check_fitted()
        if hasattr(logits, "detach"):
            return logits * self.coef_ + self.intercept_
        return np.asarray(logits, dtype=np.float64) * self.coef_ + self.intercept_
