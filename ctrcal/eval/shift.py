"""Former home of the built-in shifts, kept so that existing imports resolve.

The shifts live in :mod:`ctrcal.eval.shifts` (registry and implementations).
"""

from ctrcal.eval.shifts.builtin import (
    PAPER_INTENSITIES,
    CategoricalCorruption,
    GaussianNumericShift,
    GaussianShift,
    TemporalShift,
    original_space_codec,
)

__all__ = [
    "PAPER_INTENSITIES",
    "CategoricalCorruption",
    "GaussianNumericShift",
    "GaussianShift",
    "TemporalShift",
    "original_space_codec",
]
