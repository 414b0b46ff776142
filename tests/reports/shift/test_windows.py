"""Calibration over time: stale vs fresh calibrators per window, and the decay sentence."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.calibration.base import Calibrator, register_calibrator
from ctrcal.metrics import ece
from ctrcal.reports.shift.windows import calibration_over_time, decay_sentence, windows


class _Platt(Calibrator):
    """a·z + b by the library's Platt fit (registered here under a test name)."""

    def fit(self, logits, labels, segments=None):
        from ctrcal.calibration.scaling import PlattScaling

        self.platt_ = PlattScaling().fit(logits, labels)
        return self

    def transform(self, logits, segments=None):
        return self.platt_.transform(logits)


register_calibrator("test_platt", _Platt, overwrite=True)


def _drifting(n: int, drift: float, seed: int = 0):
    """A model whose logit misses a base-rate drift that grows linearly with time."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.random(n))
    z = rng.normal(-2.0, 1.0, n)
    site = rng.integers(0, 3, n)
    truth = z + drift * t + 0.3 * (site == 1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-truth))).astype(np.float64)
    return z, y, t, site


def test_windows_are_consecutive_equal_and_never_split_a_time():
    t = np.repeat(np.arange(10), 10)[::-1].copy()  # reversed order, 10 rows per time step
    parts = windows(t, 4)
    assert [p.size for p in parts] == [20, 30, 20, 30]  # cuts moved to whole time steps
    assert all(t[a].max() < t[b].min() for a, b in zip(parts[:-1], parts[1:], strict=True))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(100))
    with pytest.raises(ValueError, match="fewer windows"):
        windows(np.zeros(50), 3)
    with pytest.raises(ValueError, match="NaN"):
        windows(np.array([0.0, np.nan]), 1)


def test_stale_calibrator_decays_under_drift_and_the_sentence_says_when():
    z, y, t, site = _drifting(60_000, drift=1.5)
    res = calibration_over_time(z, y, t, 5, "test_platt", segments={"site": site}, n_boot=50)
    assert res.fitted_on == "first window" and [w.window for w in res.windows] == [1, 2, 3, 4, 5]
    assert {v.metric for v in res.metrics} == {"ece", "pcoc", "ne", "field_rce_mean"}
    stale = [res.value(w, "stale", "ece") for w in range(1, 6)]
    fresh = [res.value(w, "fresh", "ece") for w in range(1, 6)]
    assert stale[0] == fresh[0]  # the same calibrator in the first window
    assert stale[-1] > 2 * fresh[-1] and stale[-1] > stale[1]
    assert res.value(5, "stale", "pcoc") < res.value(5, "fresh", "pcoc") < 1.05
    first = res.first_detectable()
    assert first is not None and 2 <= first <= 5
    assert np.isnan(res.windows[0].detectable)
    assert all(w.detectable > 0 for w in res.windows[1:])
    text = decay_sentence(res)
    assert f"after {first} windows (of 5)" in text and "test_platt" in text
    # the reported ECE is the metric of the calibrated rows, recomputed here for window 5
    rows = windows(t, 6)[-1]
    cal = _Platt().fit(z[windows(t, 6)[-2]], y[windows(t, 6)[-2]])
    assert res.value(5, "fresh", "ece") == pytest.approx(ece(cal.predict_proba(z[rows]), y[rows]))


def test_without_drift_nothing_is_detectable_and_validation_is_the_stale_fit():
    z, y, t, _ = _drifting(40_000, drift=0.0, seed=1)
    zv, yv, _, _ = _drifting(10_000, drift=0.0, seed=2)
    res = calibration_over_time(z, y, t, 4, "test_platt", validation=(zv, yv, None), n_boot=50)
    assert res.fitted_on == "validation" and len(res.windows) == 4
    assert res.first_detectable() is None
    assert "In none of 4 windows" in decay_sentence(res)
    assert "field_rce_mean" not in {v.metric for v in res.metrics}
    assert res.value(1, "stale", "field_rce_mean") is None


def test_a_window_without_clicks_is_named():
    z = np.zeros(40)
    y = np.r_[np.tile([0.0, 1.0], 6), np.zeros(28)]  # windows of rows 0-12, 13-25, 26-39
    with pytest.raises(ValueError, match="window 1 holds a single class"):
        calibration_over_time(z, y, np.arange(40), 2, "test_platt", n_boot=10)
