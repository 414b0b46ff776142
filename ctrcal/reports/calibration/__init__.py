"""The calibration report of a predictions file from any system (gate, segments, label-free).

The recipe is :func:`ctrcal.reports.calibration.report.calibration_report`.
"""
