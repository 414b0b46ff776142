"""Temperature and Platt scaling: fitted by NLL, reduce NLL on a miscalibrated set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctrcal import metrics as M
from ctrcal.calibration.base import logit
from ctrcal.calibration.scaling import PlattScaling, TemperatureScaling


def _miscalibrated(n: int = 20_000, seed: int = 0, slope: float = 0.5, bias: float = -0.4):
    """Logits z whose true click probability is sigmoid(slope·z + bias)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-2.0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(slope * z + bias)))).astype(np.float64)
    return z, y


def _nll(z, y):
    return M.logloss(1 / (1 + np.exp(-np.asarray(z))), y)


def test_temperature_recovers_overconfidence_and_reduces_nll():
    z, y = _miscalibrated(bias=0.0)
    ts = TemperatureScaling().fit(z, y)
    assert ts.temperature_ == pytest.approx(2.0, rel=0.1)
    zt, yt = _miscalibrated(seed=1, bias=0.0)
    assert _nll(ts.transform(zt), yt) < _nll(zt, yt) - 0.01
    assert M.ece(ts.predict_proba(zt), yt) < M.ece(1 / (1 + np.exp(-zt)), yt)


def test_temperature_is_the_nll_minimum():
    z, y = _miscalibrated()
    t = TemperatureScaling().fit(z, y).temperature_
    best = _nll(z / t, y)
    for factor in (0.97, 1.03):
        assert _nll(z / (t * factor), y) > best


def test_platt_matches_unregularised_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    z, y = _miscalibrated()
    platt = PlattScaling().fit(z, y)
    ref = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(z[:, None], y)
    assert platt.coef_ == pytest.approx(float(ref.coef_[0, 0]), rel=1e-5)
    assert platt.intercept_ == pytest.approx(float(ref.intercept_[0]), rel=1e-5, abs=1e-6)
    assert platt.n_iter_ < 30
    zt, yt = _miscalibrated(seed=2)
    assert _nll(platt.transform(zt), yt) < _nll(TemperatureScaling().fit(z, y).transform(zt), yt)


def test_calibration_keeps_auc_and_tensor_type():
    z, y = _miscalibrated()
    zt = torch.from_numpy(z).float()
    for scaler in (TemperatureScaling(), PlattScaling()):
        out = scaler.fit(zt, torch.from_numpy(y)).transform(zt)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        probs = scaler.predict_proba(zt)
        assert isinstance(probs, torch.Tensor)
        assert M.auc(probs, y) == pytest.approx(M.auc(zt.sigmoid(), y))


def test_fit_returns_self_and_constructor_stores_only_params():
    ts = TemperatureScaling(max_iter=5)
    assert not hasattr(ts, "temperature_")
    with pytest.raises(RuntimeError, match="not fitted"):
        ts.transform(np.zeros(3))
    z, y = _miscalibrated(2000)
    assert ts.fit(z, y) is ts


def test_logit_inverts_sigmoid():
    p = np.array([1e-3, 0.2, 0.5, 0.9])
    np.testing.assert_allclose(1 / (1 + np.exp(-logit(p))), p)
    assert torch.allclose(logit(torch.tensor(p)).sigmoid(), torch.tensor(p))


@pytest.mark.parametrize("scaler", [TemperatureScaling, PlattScaling])
def test_bad_fit_inputs(scaler):
    with pytest.raises(ValueError, match="both"):
        scaler().fit([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="NaN"):
        scaler().fit([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="length"):
        scaler().fit([0.1, 0.2, 0.3], [0, 1])


def test_temperature_rejects_anti_correlated_logits():
    z, y = _miscalibrated(bias=0.0)
    with pytest.raises(ValueError, match="inverse temperature"):
        TemperatureScaling().fit(-z, y)
