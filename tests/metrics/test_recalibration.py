"""Calibration slope and intercepts equal an unpenalised logistic regression on the logit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from ctrcal.metrics import calibration_slope_intercept


def _rows(a: float, b: float, n: int = 30_000, seed: int = 0):
    rng = np.random.default_rng(seed)
    z = rng.normal(-2.0, 1.5, n)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(a + b * z)))).astype(np.float64)
    return 1.0 / (1.0 + np.exp(-z)), y, z


@pytest.mark.parametrize("a, b", [(0.3, 0.7), (-0.5, 1.4), (0.0, 1.0)])
def test_slope_and_intercept_equal_sklearn_without_penalty(a, b):
    p, y, z = _rows(a, b)
    got = calibration_slope_intercept(p, y)
    ref = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(z[:, None], y)
    assert got.slope == pytest.approx(float(ref.coef_[0, 0]), abs=1e-6)
    assert got.intercept == pytest.approx(float(ref.intercept_[0]), abs=1e-6)
    # the generating values are recovered within sampling noise
    assert got.slope == pytest.approx(b, abs=0.08) and got.intercept == pytest.approx(a, abs=0.15)


def test_intercept_in_the_large_matches_predicted_to_observed_clicks():
    p, y, z = _rows(0.4, 1.0)
    got = calibration_slope_intercept(p, y)
    shifted = 1.0 / (1.0 + np.exp(-(z + got.intercept_in_the_large)))
    assert shifted.sum() == pytest.approx(y.sum(), rel=1e-9)
    assert got.intercept_in_the_large == pytest.approx(0.4, abs=0.1)
    assert set(got.as_dict()) == {"cal_slope", "cal_intercept", "cal_intercept_large"}


def test_a_single_class_has_no_fit():
    got = calibration_slope_intercept(np.array([0.2, 0.3]), np.array([0.0, 0.0]))
    assert all(math.isnan(v) for v in got.as_dict().values())
