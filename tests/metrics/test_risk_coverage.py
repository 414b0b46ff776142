"""Risk-coverage: metrics on the most confident rows by predictive std."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.metrics import auc, logloss, risk_coverage


def test_informative_std_raises_auc_on_the_confident_rows():
    rng = np.random.default_rng(0)
    n = 20_000
    noisy = rng.random(n) < 0.5  # half the rows: predictions unrelated to the label
    truth = rng.beta(1, 8, n)
    y = (rng.random(n) < truth).astype(np.float64)
    p = np.where(noisy, rng.beta(1, 8, n), truth)
    std = np.where(noisy, 0.2, 0.01) + rng.random(n) * 1e-3
    rc = risk_coverage(p, y, std)
    assert list(rc.rows) == [10_000, 16_000, 20_000]
    assert rc.auc[0] > rc.auc[1] > rc.auc[2]
    assert rc.logloss[0] < rc.logloss[2]
    keep = np.argsort(std, kind="stable")[:10_000]
    assert rc.auc[0] == auc(p[keep], y[keep]) and rc.logloss[0] == logloss(p[keep], y[keep])
    assert rc.auc[2] == auc(p, y)
    assert set(rc.as_dict()) == {
        "auc@50%",
        "logloss@50%",
        "auc@80%",
        "logloss@80%",
        "auc@100%",
        "logloss@100%",
    }


def test_bad_std_and_coverages_are_named():
    p, y = np.array([0.1, 0.5, 0.9]), np.array([0, 1, 1])
    with pytest.raises(ValueError, match="std"):
        risk_coverage(p, y, np.array([0.1, np.nan, 0.2]))
    with pytest.raises(ValueError, match="std: expected 3"):
        risk_coverage(p, y, np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="coverages"):
        risk_coverage(p, y, np.zeros(3), coverages=[0.0, 1.0])
