"""Former home of :class:`~ctrcal.calibration.field_aware.FieldAwareCalibration`."""

from ctrcal.calibration.field_aware import FieldAwareCalibration

__all__ = ["FieldAwareCalibration"]
