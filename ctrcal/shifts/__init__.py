"""Dataset shifts of the report: the registry (:mod:`~ctrcal.shifts.registry`: names, intensity
domains, default grids and options; imports no torch, so a config is checked without it) and the
built-in shifts (:mod:`~ctrcal.shifts.builtin`: Gaussian numeric noise in model or original
space, categorical corruption, the temporal split)."""
