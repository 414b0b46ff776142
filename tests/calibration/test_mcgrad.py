"""MCGrad behind the Calibrator contract: it fixes a miscalibration that differs per segment."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ctrcal.calibration.base import create_calibrator, get_calibrator
from ctrcal.core.errors import NotAvailableError
from ctrcal.metrics import bucketize, multicalibration_error

pytest.importorskip("mcgrad")

OFFSETS = np.array([0.9, -0.9, 0.4, 0.0])  # the truth's logit minus the model's, per segment


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    seg = rng.integers(0, 4, n)
    x = rng.normal(size=n)
    z = rng.normal(-2.0, 1.0, n) + 0.3 * x
    truth = z + OFFSETS[seg] + 0.5 * (x > 1.0)  # numeric segment: large x under-predicted
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-truth))).astype(np.float64)
    return z, y, {"site": seg, "x_bucket": bucketize(x, 8)}


@pytest.mark.slow
def test_mcgrad_improves_multicalibration_on_a_segment_miscalibration():
    z, y, seg = _rows(30_000, 0)
    zt, yt, segt = _rows(30_000, 1)
    cal = create_calibrator(
        {
            "name": "mcgrad",
            "categorical": ["site"],
            "numeric": ["x_bucket"],
            "early_stopping": False,
            "num_rounds": 8,
            "num_threads": 1,
        }
    ).fit(z, y, seg)
    assert cal.needed_fields() == ("site", "x_bucket")
    out = cal.transform(zt, segt)
    assert out.shape == zt.shape and np.isfinite(out).all()

    def mce(logits):
        p = 1.0 / (1.0 + np.exp(-logits))
        return multicalibration_error(p, yt, segt, max_depth=2)

    before, after = mce(zt), mce(out)
    assert before.sigmas > 10  # the planted miscalibration is plainly detectable
    assert after.sigmas < 0.3 * before.sigmas
    # the per-segment gaps are what it fixed: each site's predicted clicks near its clicks
    p = 1.0 / (1.0 + np.exp(-out))
    for s in range(4):
        rows = segt["site"] == s
        assert p[rows].sum() / yt[rows].sum() == pytest.approx(1.0, abs=0.08)


def test_every_given_field_is_a_category_by_default_and_missing_fields_are_named():
    z, y, seg = _rows(4_000, 2)
    cal = create_calibrator(
        {"name": "mcgrad", "early_stopping": False, "num_rounds": 2, "num_threads": 1}
    )
    assert cal.needed_fields() == ()
    cal.fit(z, y, seg)
    assert cal.categorical_ == ["site", "x_bucket"] and cal.numeric_ == []
    with pytest.raises(ValueError, match="segments lack x_bucket"):
        cal.transform(z, {"site": seg["site"]})
    assert cal.model_.lightgbm_params["num_threads"] == 1
    with pytest.raises(ValueError, match="needs segment features"):
        create_calibrator("mcgrad").fit(z, y)


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcgrad" else real(name, *a)
    )
    assert get_calibrator("mcgrad").extra == "mcgrad"
    with pytest.raises(NotAvailableError, match=r"pip install ctrcal\[mcgrad\]"):
        create_calibrator("mcgrad")


def test_unshrink_warnings_are_kept_and_said_once(caplog, capsys, monkeypatch):
    from ctrcal.calibration import mcgrad as mcgrad_module

    monkeypatch.setattr(mcgrad_module, "_said_unshrink", False)
    z, y, seg = _rows(4_000, 3)
    spec = {"name": "mcgrad", "early_stopping": False, "num_rounds": 2, "num_threads": 1}
    for _ in range(2):
        # logits four times too large: MCGrad's unshrink factor is far below 1
        cal = create_calibrator(spec).fit(4.0 * z, y, seg)
        assert cal.unshrink_ and max(cal.unshrink_) < 0.95
    assert "Unshrink is not close to 1" not in caplog.text
    err = capsys.readouterr().err
    assert err.count("note: mcgrad rescaled its logits") == 1
