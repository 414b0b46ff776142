"""Calibrators and shifts: each public name has one home, and built-ins load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ctrcal


def test_the_public_names_come_from_their_one_home():
    from ctrcal import calibration, shifts
    from ctrcal.calibration import field_aware, isotonic, scaling
    from ctrcal.shifts import builtin, registry

    assert ctrcal.TemperatureScaling is scaling.TemperatureScaling
    assert ctrcal.PlattScaling is scaling.PlattScaling
    assert ctrcal.IsotonicCalibration is isotonic.IsotonicCalibration
    assert ctrcal.FieldAwareCalibration is field_aware.FieldAwareCalibration
    assert ctrcal.GaussianShift is builtin.GaussianShift
    assert ctrcal.CategoricalCorruption is builtin.CategoricalCorruption
    assert ctrcal.create_shift is registry.create_shift
    # the packages re-export nothing: one import path per name
    assert not hasattr(shifts, "GaussianShift") and not hasattr(shifts, "create_shift")
    assert not hasattr(calibration, "create_calibrator")


@pytest.mark.slow
def test_builtin_calibrators_are_listed_by_path_and_load_on_first_use():
    code = (
        "import sys\n"
        "from ctrcal.calibration.base import available_calibrators, create_calibrator\n"
        "print(available_calibrators())\n"
        "print('ctrcal.calibration.isotonic' in sys.modules)\n"
        "create_calibrator('isotonic')\n"
        "print('ctrcal.calibration.isotonic' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert {"field_aware", "isotonic", "platt", "temperature"} <= set(eval(out[0]))
    assert out[1:3] == ["False", "True"]


def test_a_metric_has_one_home_and_one_holm():
    from ctrcal import metrics
    from ctrcal.core.registry import Registry
    from ctrcal.metrics import _registry, _segments
    from ctrcal.reports.shift import stats

    assert isinstance(metrics.METRICS, Registry) and metrics.METRICS is _registry.METRICS
    assert metrics.declare_metric is _registry.declare_metric
    # no second table of names, directions or definitions beside the registry
    for gone in ("DEFINITIONS", "CALIBRATION_DEFINITIONS", "BRIER_DEFINITIONS"):
        assert not hasattr(metrics, gone), gone
    assert not hasattr(metrics, "LABEL_FREE_DEFINITIONS")
    assert not hasattr(stats, "HIGHER_IS_BETTER")
    assert metrics.holm is _segments.holm and stats.holm is metrics.holm
