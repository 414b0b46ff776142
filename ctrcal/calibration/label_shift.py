"""Label-shift (base-rate) correction: re-estimate the click rate on unlabelled target rows.

Under label shift the click rate moves while P(x | click) and P(x | no click) stay put (a
campaign, a season, a new traffic mix). Bayes' rule then fixes the posterior exactly by one
logit shift:

    logit p_t(x) = logit p_s(x) + logit π_t − logit π_s,

with π_s the click rate the model was calibrated for and π_t the new one. π_t is unknown, but
the unlabelled target rows determine it: Saerens, Latinne and Decaestecker ("Adjusting the
outputs of a classifier to new a priori probabilities: a simple procedure", Neural Computation
14(1), 2002) maximise the target likelihood in π_t by EM,

    π_t ← mean_i sigmoid(logit p_s(x_i) + logit π_t − logit π_s),

starting from π_s; each step cannot decrease the likelihood, which is concave in π_t, so the
iteration converges to the maximum-likelihood click rate.

``fit`` learns π_s from validation; ``transform`` estimates π_t on the rows it is given (the
unlabelled target window, hence ``needs_unlabelled_target``) and shifts their logits. The EM
assumes the source posteriors are calibrated (Alexandari et al., ICML 2020, find it works best
after calibration): ``calibrate`` names a calibrator applied first, fitted on the same
validation rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ctrcal.calibration.base import Calibrator, Segments, create_calibrator
from ctrcal.metrics import as_numpy

__all__ = ["LabelShiftCalibrator"]


def _logits(x: Any, name: str) -> np.ndarray:
    z = as_numpy(x, name).astype(np.float64)
    if z.size == 0 or not np.isfinite(z).all():
        raise ValueError(f"{name}: expected finite logits, at least one")
    return z


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class LabelShiftCalibrator(Calibrator):
    """EM re-estimation of the click rate on the target rows and the matching logit shift.

    Args:
        calibrate: a calibrator spec applied before the shift (fitted on the same validation
            rows), or None to trust the model's own probabilities.
        max_iter: EM iterations at most.
        tol: stop when the click rate moves less than this.

    Attributes:
        source_rate_: π_s, the mean calibrated probability on validation (equal to the click
            rate for a calibrated model; it is the rate the posteriors are calibrated *for*).
        base_: the fitted ``calibrate`` calibrator, or None.
    """

    needs_unlabelled_target = True

    def __init__(
        self,
        calibrate: str | Mapping[str, Any] | None = None,
        max_iter: int = 1000,
        tol: float = 1e-10,
    ) -> None:
        if not (isinstance(max_iter, int) and max_iter >= 1):
            raise ValueError(f"max_iter: expected an integer >= 1, got {max_iter!r}")
        if not (isinstance(tol, (int, float)) and tol > 0):
            raise ValueError(f"tol: expected a number > 0, got {tol!r}")
        self.calibrate = calibrate
        self.max_iter = max_iter
        self.tol = float(tol)

    def needed_fields(self) -> tuple[str, ...]:
        """The fields of the ``calibrate`` calibrator (none without one)."""
        return () if self.calibrate is None else create_calibrator(self.calibrate).needed_fields()

    def _source_logits(self, z: np.ndarray, segments: Segments | None) -> np.ndarray:
        if self.base_ is None:
            return z
        return np.asarray(self.base_.transform(z, segments), dtype=np.float64)

    def fit(self, logits: Any, labels: Any, segments: Segments | None = None):
        """Learn π_s from validation logits [n] and 0/1 labels [n]; returns self."""
        z = _logits(logits, "logits")
        y = as_numpy(labels, "labels").astype(np.float64)
        if y.shape != z.shape:
            raise ValueError(f"logits and labels differ in length: {z.size} vs {y.size}")
        if not np.isin(y, (0.0, 1.0)).all() or y.min() == y.max():
            raise ValueError("labels: expected 0/1 clicks with both classes present")
        self.base_ = None
        if self.calibrate is not None:
            self.base_ = create_calibrator(self.calibrate).fit(z, y, segments)
        p = _sigmoid(self._source_logits(z, segments))
        self.source_rate_ = float(np.clip(p.mean(), 1e-12, 1.0 - 1e-12))
        return self

    def target_rate(self, logits: Any, segments: Segments | None = None) -> float:
        """π_t: the EM estimate of the click rate of these (unlabelled) rows."""
        if not hasattr(self, "source_rate_"):
            raise RuntimeError("LabelShiftCalibrator is not fitted; call fit() first")
        zs = self._source_logits(_logits(logits, "logits"), segments)
        return self._em(zs)

    def _em(self, zs: np.ndarray) -> float:
        c = math.log(self.source_rate_ / (1.0 - self.source_rate_))
        rate = self.source_rate_
        for _ in range(self.max_iter):
            r = min(max(rate, 1e-12), 1.0 - 1e-12)
            new = float(_sigmoid(zs + (math.log(r / (1.0 - r)) - c)).mean())
            done = abs(new - rate) < self.tol
            rate = new
            if done:
                break
        return min(max(rate, 1e-12), 1.0 - 1e-12)

    def transform(self, logits: Any, segments: Segments | None = None) -> np.ndarray:
        """Logits [n] shifted to the click rate EM estimates on these rows."""
        if not hasattr(self, "source_rate_"):
            raise RuntimeError("LabelShiftCalibrator is not fitted; call fit() first")
        zs = self._source_logits(_logits(logits, "logits"), segments)
        rate = self._em(zs)
        shift = math.log(rate / (1.0 - rate)) - math.log(
            self.source_rate_ / (1.0 - self.source_rate_)
        )
        return zs + shift
