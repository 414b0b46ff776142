"""Murphy's Brier decomposition on ECE's bins: a hand-computed case and the identity."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal import metrics as M
from ctrcal.metrics import brier_decomposition


def test_hand_computed_two_bins():
    # bins [0, 0.5) and [0.5, 1]: {0.2, 0.2, 0.4} with one click, {0.8, 0.6} with two
    p = np.array([0.2, 0.2, 0.4, 0.8, 0.6])
    y = np.array([0, 1, 0, 1, 1.0])
    d = brier_decomposition(p, y, n_bins=2)
    # bin means 4/15 and 0.7, click rates 1/3 and 1, base rate 0.6
    assert d.reliability == pytest.approx(0.6 * (1 / 15) ** 2 + 0.4 * 0.3**2)
    assert d.resolution == pytest.approx(0.6 * (1 / 3 - 0.6) ** 2 + 0.4 * 0.4**2)
    assert d.uncertainty == pytest.approx(0.24)
    assert d.brier == pytest.approx(1.04 / 5)
    # within-bin variance of p (0.14/15) minus twice its covariance with y (−1/75)
    assert d.remainder == pytest.approx(0.14 / 15 + 2 / 75)


def test_terms_sum_to_the_brier_score_and_vanish_where_they_should():
    rng = np.random.default_rng(3)
    p = rng.beta(1, 6, 20_000)
    y = (rng.random(p.size) < p).astype(np.float64)
    d = brier_decomposition(p, y)
    assert d.reliability - d.resolution + d.uncertainty + d.remainder == pytest.approx(
        M.brier(p, y), abs=1e-12
    )
    curve = M.reliability_curve(p, y)
    keep = curve.counts > 0
    # the reliability term is ECE's binned gap, squared instead of absolute
    assert d.reliability == pytest.approx(
        float(np.sum(curve.weights[keep] * (curve.mean_prob[keep] - curve.frac_pos[keep]) ** 2))
    )
    # one value of p per bin: nothing is left for the remainder
    centres = (np.floor(p * 15) + 0.5) / 15
    assert brier_decomposition(centres, y).remainder == pytest.approx(0.0, abs=1e-12)
    # a constant prediction of the base rate: no resolution, no reliability
    flat = brier_decomposition(np.full(p.size, y.mean()), y)
    assert flat.resolution == pytest.approx(0.0, abs=1e-15)
    assert flat.reliability == pytest.approx(0.0, abs=1e-15)
