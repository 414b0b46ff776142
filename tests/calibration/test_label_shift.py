"""Label-shift correction: EM recovers a known change of the click rate from unlabelled rows."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.calibration.base import create_calibrator
from ctrcal.calibration.label_shift import LabelShiftCalibrator
from ctrcal.metrics import ece


def _rows(rate: float, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """x | y ~ N(±1, 1): the same class-conditional distributions at any click rate."""
    y = (rng.random(n) < rate).astype(np.float64)
    x = rng.normal(np.where(y == 1, 1.0, -1.0), 1.0)
    return x, y


def _true_logit(x: np.ndarray, rate: float) -> np.ndarray:
    # log N(x; 1, 1) / N(x; -1, 1) = 2x, plus the prior odds
    return 2.0 * x + np.log(rate / (1.0 - rate))


def test_em_recovers_a_known_base_rate_change_and_the_true_posterior():
    rng = np.random.default_rng(0)
    x_s, y_s = _rows(0.1, 50_000, rng)
    x_t, y_t = _rows(0.3, 50_000, rng)
    z_s, z_t = _true_logit(x_s, 0.1), _true_logit(x_t, 0.1)  # the model knows the old rate
    cal = create_calibrator("label_shift").fit(z_s, y_s)
    assert isinstance(cal, LabelShiftCalibrator) and cal.needs_unlabelled_target
    assert cal.source_rate_ == pytest.approx(0.1, abs=0.005)
    assert cal.target_rate(z_t) == pytest.approx(0.3, abs=0.01)
    fixed = cal.transform(z_t)
    # the shifted logits are the Bayes posterior at the new rate, up to the estimate's noise
    np.testing.assert_allclose(fixed, _true_logit(x_t, 0.3), atol=0.1)
    p_old, p_new = 1 / (1 + np.exp(-z_t)), 1 / (1 + np.exp(-fixed))
    assert ece(p_new, y_t) < 0.02 < 0.1 < ece(p_old, y_t)


def test_no_shift_leaves_the_logits_nearly_unchanged():
    rng = np.random.default_rng(1)
    x, y = _rows(0.2, 40_000, rng)
    z = _true_logit(x, 0.2)
    cal = LabelShiftCalibrator().fit(z[:20_000], y[:20_000])
    np.testing.assert_allclose(cal.transform(z[20_000:]), z[20_000:], atol=0.05)


def test_calibrate_first_fits_the_named_calibrator_on_validation():
    from ctrcal.calibration.base import Calibrator, register_calibrator

    class Halve(Calibrator):  # a fixed map, so the test owns what "calibrated" means
        def fit(self, logits, labels, segments=None):
            self.fitted_ = True
            return self

        def transform(self, logits, segments=None):
            return np.asarray(logits) / 2.0

    register_calibrator("test_halve", Halve, overwrite=True)
    rng = np.random.default_rng(2)
    x_s, y_s = _rows(0.1, 30_000, rng)
    x_t, _ = _rows(0.25, 30_000, rng)
    doubled = 2.0 * _true_logit(x_s, 0.1)  # over-confident by a factor 2
    cal = LabelShiftCalibrator(calibrate="test_halve").fit(doubled, y_s)
    assert cal.base_.fitted_
    assert cal.target_rate(2.0 * _true_logit(x_t, 0.1)) == pytest.approx(0.25, abs=0.015)


def test_bad_input_and_unfitted_use_raise():
    with pytest.raises(RuntimeError, match="not fitted"):
        LabelShiftCalibrator().transform(np.zeros(3))
    with pytest.raises(ValueError, match="both classes"):
        LabelShiftCalibrator().fit(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="differ in length"):
        LabelShiftCalibrator().fit(np.zeros(3), np.array([0, 1]))
    with pytest.raises(ValueError, match="max_iter"):
        LabelShiftCalibrator(max_iter=0)


def test_em_reaches_the_maximum_likelihood_click_rate():
    """The EM fixed point is the MLE of the target rate under label shift (scipy as reference)."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(3)
    x_s, y_s = _rows(0.15, 20_000, rng)
    x_t, _ = _rows(0.05, 20_000, rng)
    cal = LabelShiftCalibrator(tol=1e-13).fit(_true_logit(x_s, 0.15), y_s)
    p = 1.0 / (1.0 + np.exp(-_true_logit(x_t, 0.15)))
    a, b = p / cal.source_rate_, (1.0 - p) / (1.0 - cal.source_rate_)

    def nll(rate):
        return -np.log(rate * a + (1.0 - rate) * b).sum()

    ref = minimize_scalar(nll, bounds=(1e-6, 1 - 1e-6), method="bounded", options={"xatol": 1e-12})
    assert cal.target_rate(_true_logit(x_t, 0.15)) == pytest.approx(ref.x, abs=1e-6)
