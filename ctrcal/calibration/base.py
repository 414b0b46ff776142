"""The calibrator contract and its registry: every post-hoc calibrator is named by one spec.

A report variant (or a user) names a calibrator by one spec, as norms, models and shifts are
named::

    create_calibrator("isotonic")
    create_calibrator({"name": "field_aware", "field": "C14", "method": "platt"})

A calibrator maps a model's logits to calibrated logits. It is fitted once, on clean
validation predictions, and then applied unchanged to every evaluation (clean or shifted), so
that evaluation never fits anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.errors import ConfigError

__all__ = [
    "Calibrator",
    "CalibratorKind",
    "Segments",
    "available_calibrators",
    "create_calibrator",
    "get_calibrator",
    "register_calibrator",
]

# field name -> per-row values of that field, shape [n] (integer ids or bucket codes)
Segments = Mapping[str, np.ndarray]


class Calibrator:
    """Base class: ``fit`` on validation, then ``transform`` any logits.

    Subclasses implement ``fit`` and ``transform``; learned state ends in ``_``.
    ``segments`` carries the per-row field values that segment-aware calibrators
    (field-aware, MCGrad) need; the others ignore it. Its arrays have the rows' length.

    Class attributes:
        needs_segments: the fields the calibrator reads from ``segments`` (empty: none).
        needs_unlabelled_target: ``transform`` adapts to the rows it is given (label shift).
    """

    needs_unlabelled_target: bool = False

    def needed_fields(self) -> tuple[str, ...]:
        """The segment fields this calibrator reads (empty: it reads none)."""
        return ()

    def fit(self, logits: np.ndarray, labels: np.ndarray, segments: Segments | None = None):
        """Fit on validation logits [n] and 0/1 labels [n]; returns self."""
        raise NotImplementedError

    def transform(self, logits: np.ndarray, segments: Segments | None = None) -> np.ndarray:
        """Calibrated logits [n] for logits [n]."""
        raise NotImplementedError

    def predict_proba(self, logits: np.ndarray, segments: Segments | None = None) -> np.ndarray:
        """Calibrated probabilities [n]."""
        z = np.asarray(self.transform(logits, segments), dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-z))


@dataclass(frozen=True)
class CalibratorKind:
    """A registered calibrator.

    Attributes:
        name: registry name (a spec's ``name``).
        factory: ``factory(**options) -> Calibrator``, or a ``"module:attribute"`` string
            imported on first use.
        description: one line for the report.
        extra: the optional package it needs (``pip install ctrcal[extra]``), or None.
    """

    name: str
    factory: Callable[..., Calibrator] | str
    description: str = ""
    extra: str | None = None

    def resolve(self) -> Callable[..., Calibrator]:
        if isinstance(self.factory, str):
            module, _, attr = self.factory.partition(":")
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            return obj
        return self.factory


_REGISTRY: dict[str, CalibratorKind] = {}


def register_calibrator(
    name: str, factory: Callable[..., Calibrator] | str, *, description: str = "",
    extra: str | None = None, overwrite: bool = False,
) -> CalibratorKind:  # fmt: skip
    """Register a calibrator under ``name``; refuses to replace one unless ``overwrite``."""
    key = name.strip().lower().replace("-", "_")
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"calibrator {key!r} is already registered")
    kind = CalibratorKind(key, factory, description, extra)
    _REGISTRY[key] = kind
    return kind


def available_calibrators() -> list[str]:
    """Registered calibrator names, sorted."""
    return sorted(_REGISTRY)


def get_calibrator(name: str) -> CalibratorKind:
    """The registered kind called ``name``; ConfigError naming the known ones otherwise."""
    key = str(name).strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ConfigError(
            f"unknown calibrator {name!r}; known: {', '.join(available_calibrators())}"
        )
    return _REGISTRY[key]


def create_calibrator(spec: str | Mapping[str, Any]) -> Calibrator:
    """A new, unfitted calibrator from a spec: a name or ``{name: ..., **options}``."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping) and "name" in spec:
        options = {k: v for k, v in spec.items() if k != "name"}
        name = spec["name"]
    else:
        raise ConfigError(f"a calibration spec is a name or a mapping with 'name', got {spec!r}")
    kind = get_calibrator(name)
    try:
        return kind.resolve()(**options)
    except TypeError as exc:
        raise ConfigError(f"calibration {kind.name}: {exc}") from None
