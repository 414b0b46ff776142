"""The calibrators, shifts and sweep moved; every former import path still gives the same object."""

from __future__ import annotations

import subprocess
import sys

import ctrcal


def test_former_import_paths_resolve_to_the_moved_objects():
    from ctrcal.calibration import field_aware, isotonic, scaling
    from ctrcal.eval import calibration as old_calibration
    from ctrcal.eval import field_aware as old_field_aware
    from ctrcal.eval import shift as old_shift
    from ctrcal.eval import shifts
    from ctrcal.eval import sweep as old_sweep
    from ctrcal.eval.shifts import builtin, registry
    from ctrcal.train import processes, sweep

    assert old_calibration.TemperatureScaling is scaling.TemperatureScaling
    assert old_calibration.PlattScaling is scaling.PlattScaling
    assert old_calibration.IsotonicCalibration is isotonic.IsotonicCalibration
    assert old_calibration.FieldAwareCalibration is field_aware.FieldAwareCalibration
    assert old_field_aware.FieldAwareCalibration is field_aware.FieldAwareCalibration
    assert ctrcal.TemperatureScaling is scaling.TemperatureScaling
    assert ctrcal.FieldAwareCalibration is field_aware.FieldAwareCalibration
    assert old_shift.GaussianShift is builtin.GaussianShift is shifts.GaussianShift
    assert old_shift.CategoricalCorruption is builtin.CategoricalCorruption
    assert shifts.create_shift is registry.create_shift
    assert ctrcal.GaussianShift is builtin.GaussianShift
    assert ctrcal.create_shift is registry.create_shift
    assert old_sweep.ensure_run is sweep.ensure_run
    assert old_sweep.run_in_processes is processes.run_in_processes
    assert old_sweep.check_workers is sweep.check_workers


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
