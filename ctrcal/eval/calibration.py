"""Former home of the post-hoc calibrators, kept so that existing imports resolve.

The calibrators live in :mod:`ctrcal.calibration` (one base class and registry).
"""

from ctrcal.calibration.base import logit
from ctrcal.calibration.field_aware import FieldAwareCalibration
from ctrcal.calibration.isotonic import IsotonicCalibration
from ctrcal.calibration.scaling import PlattScaling, TemperatureScaling

__all__ = [
    "FieldAwareCalibration",
    "IsotonicCalibration",
    "PlattScaling",
    "TemperatureScaling",
    "logit",
]
