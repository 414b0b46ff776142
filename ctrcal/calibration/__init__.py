"""Post-hoc calibrators: one base class, one registry (see :mod:`ctrcal.calibration.base`)."""
