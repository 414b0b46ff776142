"""Isotonic and field-aware calibration: fitted state, fixes what they should, fall-backs; every
registered calibrator on segments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression

from ctrcal import metrics as M
from ctrcal.calibration.base import create_calibrator, logit
from ctrcal.calibration.field_aware import FieldAwareCalibration
from ctrcal.calibration.isotonic import IsotonicCalibration
from ctrcal.calibration.scaling import PlattScaling


def _sigmoid(t):
    return 1 / (1 + np.exp(-t))


def _field_shifted(n=40_000, seed=0):
    """Logits z and a field whose values move the true logit by different offsets."""
    rng = np.random.default_rng(seed)
    v = rng.choice([3, 8, 11, 20], size=n, p=[0.4, 0.3, 0.25, 0.05])
    z = rng.normal(-2.0, 1.0, n)
    offset = np.select([v == 3, v == 8, v == 11], [0.8, -0.7, 0.0], default=0.3)
    y = (rng.random(n) < _sigmoid(z + offset)).astype(np.float64)
    return z, y, v


# --------------------------------------------------------------------------- isotonic


def test_isotonic_matches_sklearn_and_is_monotone():
    rng = np.random.default_rng(0)
    z = rng.normal(-2, 1.5, 5000)
    y = (rng.random(5000) < _sigmoid(0.5 * z - 0.3)).astype(float)
    iso = IsotonicCalibration(prior_strength=0).fit(z, y)
    ref = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(z, y)
    zt = np.concatenate([rng.normal(-2, 2.5, 2000), [-50.0, 50.0]])  # beyond the fitted range
    np.testing.assert_allclose(iso.predict_proba(zt), ref.predict(zt), atol=1e-12)
    grid = np.linspace(-8, 4, 500)
    assert np.all(np.diff(iso.predict_proba(grid)) >= 0)
    # tensors in, tensors out, same numbers
    pt = iso.predict_proba(torch.from_numpy(zt))
    assert isinstance(pt, torch.Tensor)
    np.testing.assert_allclose(pt.numpy(), ref.predict(zt), atol=1e-12)
    assert np.isfinite(iso.transform(zt)).all()


def test_isotonic_prior_keeps_empty_blocks_off_zero_and_one():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 2, 4000)
    y = (rng.random(z.size) < _sigmoid(1.5 * z)).astype(float)
    plain = IsotonicCalibration(prior_strength=0).fit(z, y)
    assert plain.y_thresholds_[0] == 0.0 and plain.y_thresholds_[-1] == 1.0  # the problem
    iso = IsotonicCalibration(prior_strength=1.0).fit(z, y)
    p = iso.predict_proba(np.linspace(-20, 20, 2001))
    assert 0.0 < p.min() and p.max() < 1.0 and np.all(np.diff(p) >= 0)
    # the lowest block: (0 clicks + a·p0) / (n + a), by hand
    ref = IsotonicRegression(y_min=0, y_max=1).fit(z, y)
    n0 = int((ref.predict(z) == 0.0).sum())
    assert iso.y_thresholds_[0] == pytest.approx(y.mean() / (n0 + 1.0), rel=1e-9)
    # one pseudo-row moves a block of n rows by at most 1/(n + 1): on average little
    zt = rng.normal(0, 2, 4000)
    yt = (rng.random(zt.size) < _sigmoid(1.5 * zt)).astype(float)
    assert np.abs(iso.predict_proba(zt) - plain.predict_proba(zt)).mean() < 0.005
    # and log-loss on new data no longer pays -log(eps) for a click in an empty block
    assert M.logloss(iso.predict_proba(zt), yt) < M.logloss(
        np.clip(plain.predict_proba(zt), 1e-7, 1 - 1e-7), yt
    )
    with pytest.raises(ValueError, match="prior_strength"):
        IsotonicCalibration(prior_strength=-1)


def test_isotonic_fixes_a_non_logit_linear_distortion():
    # true probability is a step-like function of z that no Platt map can follow
    rng = np.random.default_rng(1)
    z = rng.normal(0, 2, 40_000)
    true = np.where(z < 0, 0.02, 0.02 + 0.3 * _sigmoid(4 * z - 4))
    y = (rng.random(z.size) < true).astype(float)
    zt = rng.normal(0, 2, 40_000)
    yt = (rng.random(zt.size) < np.where(zt < 0, 0.02, 0.02 + 0.3 * _sigmoid(4 * zt - 4))).astype(
        float
    )
    iso = IsotonicCalibration().fit(z, y)
    platt = PlattScaling().fit(z, y)
    assert M.ecce(iso.predict_proba(zt), yt) < 0.5 * M.ecce(platt.predict_proba(zt), yt)


def test_isotonic_unfitted_and_bad_input():
    with pytest.raises(RuntimeError, match="not fitted"):
        IsotonicCalibration().predict_proba(np.zeros(3))
    with pytest.raises(ValueError, match="logits contains NaN"):
        IsotonicCalibration().fit([0.0, np.nan], [0, 1])
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        IsotonicCalibration().fit([0.0, 1.0], [0, 3])


# --------------------------------------------------------------------------- field-aware


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_field_aware_fixes_per_value_miscalibration(method):
    z, y, v = _field_shifted()
    zt, yt, vt = _field_shifted(seed=1)
    fa = FieldAwareCalibration(method=method, shrinkage=100).fit(z, y, v)
    glob = PlattScaling().fit(z, y)
    p_fa = fa.predict_proba(zt, vt)
    p_gl = glob.predict_proba(zt)
    rce_fa = M.field_rce(p_fa, yt, vt)
    rce_gl = M.field_rce(p_gl, yt, vt)
    assert rce_fa < 0.5 * rce_gl
    assert M.logloss(p_fa, yt) < M.logloss(p_gl, yt)
    assert fa.values_.tolist() == [3, 8, 11, 20]
    np.testing.assert_allclose(fa.weights_, fa.counts_ / (fa.counts_ + 100))


def test_field_aware_platt_recovers_each_values_offset():
    z, y, v = _field_shifted(n=200_000)
    fa = FieldAwareCalibration(shrinkage=0).fit(z, y, v)
    # per value the truth is sigmoid(z + offset): slope 1, intercept = offset
    np.testing.assert_allclose(fa.coef_, 1.0, atol=0.08)
    np.testing.assert_allclose(fa.intercept_, [0.8, -0.7, 0.0, 0.3], atol=0.12)
    # each value's parameters are the NLL minimum of its own rows
    for j, val in enumerate(fa.values_):
        own = PlattScaling().fit(z[v == val], y[v == val])
        assert fa.coef_[j] == pytest.approx(own.coef_, abs=1e-4)
        assert fa.intercept_[j] == pytest.approx(own.intercept_, abs=1e-4)


def test_field_aware_shrinks_small_values_and_falls_back_for_unseen():
    z, y, v = _field_shifted()
    big = FieldAwareCalibration(shrinkage=1e12).fit(z, y, v)
    glob = PlattScaling().fit(z, y)
    # overwhelming shrinkage: every value is the global calibrator
    np.testing.assert_allclose(
        big.predict_proba(z[:50], v[:50]), glob.predict_proba(z[:50]), rtol=1e-6
    )
    fa = FieldAwareCalibration(shrinkage=500, min_count=3000).fit(z, y, v)
    assert 20 not in fa.values_  # 5 % of 40k rows = 2000 < min_count: global only
    unseen = np.full(10, 999)
    for codes in (unseen, np.full(10, 20)):
        np.testing.assert_allclose(fa.predict_proba(z[:10], codes), glob.predict_proba(z[:10]))
    # tensors in, tensors out
    out = fa.transform(torch.from_numpy(z[:10]).float(), torch.from_numpy(v[:10]))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_allclose(
        out.numpy(), logit(fa.predict_proba(z[:10], v[:10])), rtol=1e-5, atol=1e-5
    )


def test_field_aware_bad_input():
    z, y, v = _field_shifted(n=500)
    with pytest.raises(ValueError, match="method"):
        FieldAwareCalibration(method="beta").fit(z, y, v)
    with pytest.raises(ValueError, match="shrinkage"):
        FieldAwareCalibration(shrinkage=-1).fit(z, y, v)
    with pytest.raises(ValueError, match="values: expected 500 values"):
        FieldAwareCalibration().fit(z, y, v[:-1])
    with pytest.raises(ValueError, match="values: expected integer codes"):
        FieldAwareCalibration().fit(z, y, v.astype(float))
    with pytest.raises(RuntimeError, match="not fitted"):
        FieldAwareCalibration().predict_proba(z, v)


def _segment_rows(n=6000, seed=0):
    """Logits, labels and three segment columns; value 2 of C1 shifts the true logit."""
    rng = np.random.default_rng(seed)
    segments = {
        "C1": rng.integers(0, 5, n).astype(np.int32),
        "C2": rng.integers(0, 30, n).astype(np.int32),
        "I1": np.zeros(n, dtype=np.int32),
    }
    z = rng.normal(-1.5, 1.0, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z + 0.6 * (segments["C1"] == 2))))).astype(float)
    return z, y, segments


@pytest.mark.parametrize(
    "spec",
    ["temperature", "platt", "isotonic", {"name": "field_aware", "field": "C1", "shrinkage": 50}],
)
def test_every_registered_calibrator_fits_on_segments_and_applies(spec):
    z, y, segments = _segment_rows()
    cal = create_calibrator(spec).fit(z, y, segments)
    p = cal.predict_proba(z, segments)
    assert p.shape == z.shape and np.all((p >= 0) & (p <= 1))
    assert M.logloss(p, y) <= M.logloss(1 / (1 + np.exp(-z)), y) + 1e-9
    if isinstance(spec, dict):  # the per-value offset of C1 == 2 is what it fixes
        assert cal.needed_fields() == ("C1",)
        base = create_calibrator("platt").fit(z, y).predict_proba(z)
        assert M.field_rce(p, y, segments["C1"]) < M.field_rce(base, y, segments["C1"])
        with pytest.raises(ValueError, match="needs the codes of field 'C1'"):
            cal.predict_proba(z, {"C2": segments["C2"]})
    else:
        assert cal.needed_fields() == ()
