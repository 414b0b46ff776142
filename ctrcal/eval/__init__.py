"""Metrics, shifts, post-hoc calibration and the shift-robustness report."""
