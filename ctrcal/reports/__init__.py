"""The two report recipes: the shift report (:mod:`ctrcal.reports.shift`) and the calibration
report of a predictions file (:mod:`ctrcal.reports.calibration`)."""
