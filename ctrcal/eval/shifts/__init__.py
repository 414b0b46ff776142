"""Every dataset shift of the report in one package: the registry and the built-in shifts.

* :mod:`~ctrcal.eval.shifts.registry`: names, intensity domains, default grids and options;
  ``create_shift`` / ``register_shift`` / ``check_shift_spec`` (imports no torch, so a config
  is checked without it).
* :mod:`~ctrcal.eval.shifts.builtin`: the tensors: Gaussian numeric noise (model or original
  space), categorical corruption, the temporal split.

The built-in shift classes load on first use (they need torch)::

    from ctrcal.eval.shifts import GaussianShift, create_shift
"""

from __future__ import annotations

import importlib
from typing import Any

from ctrcal.eval.shifts.registry import (
    ShiftKind,
    available_shifts,
    check_shift_spec,
    create_shift,
    get_shift,
    normalize_shift_name,
    register_shift,
)

_BUILTIN = (
    "PAPER_INTENSITIES",
    "CategoricalCorruption",
    "GaussianNumericShift",
    "GaussianShift",
    "TemporalShift",
    "original_space_codec",
)

__all__ = [
    *_BUILTIN,
    "ShiftKind",
    "available_shifts",
    "check_shift_spec",
    "create_shift",
    "get_shift",
    "normalize_shift_name",
    "register_shift",
]


def __getattr__(name: str) -> Any:
    if name in _BUILTIN:
        return getattr(importlib.import_module("ctrcal.eval.shifts.builtin"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
