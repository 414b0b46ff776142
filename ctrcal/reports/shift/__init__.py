"""The shift report: plan -> jobs -> train -> calibrate + evaluate -> statistics -> render.

The recipe is :func:`ctrcal.reports.shift.report.run_shift_report`.
"""
