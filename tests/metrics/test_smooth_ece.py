"""smooth ECE equals the authors' package (relplot) and behaves like a calibration error."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.metrics import smooth_ece, smooth_ece_at

# relplot loads pyplot and seaborn (0.7 s): imported by the tests that compare with it, all on
# one worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("relplot")


@pytest.fixture(scope="module")
def relplot():
    return pytest.importorskip("relplot")


@pytest.mark.parametrize(
    "n, a, b, scale, seed",
    [
        (1_000, 1, 1, 1.0, 0),
        (5_000, 1, 30, 1.5, 1),
        (20_000, 2, 5, 0.5, 2),
        (300, 1, 1, 3.0, 3),
        (50_000, 0.5, 40, 1.0, 4),
    ],
)
def test_equals_relplot_on_random_data(relplot, n, a, b, scale, seed):
    rng = np.random.default_rng(seed)
    p = rng.beta(a, b, n)
    y = (rng.random(n) < np.clip(scale * p, 0, 1)).astype(np.float64)
    ref, width = relplot.smECE(p, y, return_width=True)
    got = smooth_ece(p, y)
    assert abs(float(got) - ref) < 1e-6
    assert got.sigma == width
    for sigma in (0.01, 0.05, 0.3):
        assert abs(smooth_ece_at(p, y, sigma) - relplot.smECE_sigma(p, y, sigma)) < 1e-6


def test_calibrated_predictions_score_lower_than_distorted_ones():
    rng = np.random.default_rng(5)
    p = rng.beta(1, 10, 40_000)
    y = (rng.random(p.size) < p).astype(np.float64)
    calibrated, distorted = smooth_ece(p, y), smooth_ece(np.sqrt(p), y)
    assert calibrated < 0.01 < 0.1 < distorted
    assert distorted.sigma <= 1.0 and calibrated.sigma > 0


def test_accepts_float32_and_rejects_bad_input(relplot):
    p = np.array([0.1, 0.4, 0.8, 0.3], dtype=np.float32)
    y = np.array([0, 1, 1, 0])
    assert abs(float(smooth_ece(p, y)) - relplot.smECE(p.astype(np.float64), y)) < 1e-6
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        smooth_ece(p + 1, y)
    with pytest.raises(ValueError, match="sigma"):
        smooth_ece_at(p, y, 0.0)


def test_the_fft_length_is_the_smallest_5_smooth_length_that_holds_the_convolution():
    from ctrcal.metrics._smooth_ece import _fast_length

    def smooth(m):
        for f in (2, 3, 5):
            while m % f == 0:
                m //= f
        return m == 1

    for n in range(1, 3_000):
        got = _fast_length(n)
        assert got >= n and smooth(got)
        assert not any(smooth(m) for m in range(n, got))
