"""Post-hoc calibrators: one base class, one registry (see :mod:`ctrcal.calibration.base`)."""

from ctrcal.calibration.base import register_calibrator  # noqa: E402

register_calibrator("mcgrad", "ctrcal.calibration.mcgrad:MCGradCalibrator", description="MCGrad: multicalibration by boosted trees over segment features (Tax et al., KDD 2026)", extra="mcgrad")  # noqa: E501
register_calibrator("label_shift", "ctrcal.calibration.label_shift:LabelShiftCalibrator", description="label-shift correction: EM re-estimate of the click rate on the target rows (Saerens et al. 2002)")  # noqa: E501
