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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.core.errors import ConfigError
from ctrcal.core.registry import Registry, import_object

__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "CalibratorKind",
    "Segments",
    "available_calibrators",
    "calibration_name",
    "create_calibrator",
    "fit_inputs",
    "get_calibrator",
    "logit",
    "register_calibrator",
    "sigmoid",
]

# field name -> per-row values of that field, shape [n] (integer ids or bucket codes)
Segments = Mapping[str, np.ndarray]


def logit(probs: Any, eps: float = 1e-7) -> Any:
    """log(p / (1 − p)) with p clipped to [eps, 1 − eps]; keeps tensors tensors."""
    if hasattr(probs, "detach"):
        p = probs.clamp(eps, 1.0 - eps)
        return (p / (1.0 - p)).log()
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1.0 - eps)
    return np.log(p / (1.0 - p))


def sigmoid(z: Any) -> Any:
    """The logistic function without overflow warnings; keeps tensors tensors."""
    if hasattr(z, "detach"):
        return z.sigmoid()
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))


def _to_float64(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def fit_inputs(logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validation logits [n] and 0/1 labels [n] as float64, checked (ValueError otherwise)."""
    z = _to_float64(logits, "logits")
    y = _to_float64(labels, "labels")
    if z.shape != y.shape:
        raise ValueError(f"logits and labels differ in length: {z.size} vs {y.size}")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    if y.min() == y.max():
        raise ValueError("calibration needs both clicks and non-clicks in the fitting set")
    return z, y


class Calibrator:
    """Base class: ``fit`` on validation, then ``transform`` any logits.

    Subclasses implement ``fit`` and ``transform``; learned state ends in ``_`` and is listed
    in ``_learned`` (``transform`` before ``fit`` is an error naming the class).
    ``segments`` carries the per-row field values that segment-aware calibrators
    (field-aware, MCGrad) need; the others ignore it. Its arrays have the rows' length.
    Logits may be numpy arrays or torch tensors; a calibrator returns the type it was given.

    Class attributes:
        needs_unlabelled_target: ``transform`` adapts to the rows it is given (label shift).
    """

    needs_unlabelled_target: bool = False
    _learned: tuple[str, ...] = ()

    def needed_fields(self) -> tuple[str, ...]:
        """The segment fields this calibrator reads (empty: it reads none)."""
        return ()

    def fit(self, logits: Any, labels: Any, segments: Segments | None = None) -> Calibrator:
        """Fit on validation logits [n] and 0/1 labels [n]; returns self."""
        raise NotImplementedError

    def transform(self, logits: Any, segments: Segments | None = None) -> Any:
        """Calibrated logits [n] for logits [n]."""
        raise NotImplementedError

    def predict_proba(self, logits: Any, segments: Segments | None = None) -> Any:
        """Calibrated click probabilities [n]: ``sigmoid(transform(logits))``."""
        return sigmoid(self.transform(logits, segments))

    def _check_fitted(self) -> None:
        if any(not hasattr(self, k) for k in self._learned):
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() first")


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
            return import_object(self.factory)
        return self.factory


CALIBRATORS: Registry[CalibratorKind] = Registry("calibrator")
"""Every calibrator by name."""


def register_calibrator(
    name: str,
    factory: Callable[..., Calibrator] | str,
    *,
    description: str = "",
    extra: str | None = None,
    overwrite: bool = False,
) -> CalibratorKind:
    """Register a calibrator under ``name``; refuses to replace one unless ``overwrite``."""
    kind = CalibratorKind(name.strip(), factory, description, extra)
    CALIBRATORS.register(name, kind, overwrite=overwrite)
    return kind


def available_calibrators() -> list[str]:
    """Registered calibrator names, sorted."""
    return CALIBRATORS.available()


def get_calibrator(name: str) -> CalibratorKind:
    """The registered kind called ``name``; ConfigError naming the known ones otherwise."""
    return CALIBRATORS.get(name)


def calibration_name(spec: str | Mapping[str, Any]) -> str:
    """The registered name a spec refers to (any spelling: ``Field-Aware`` -> ``field_aware``)."""
    return CALIBRATORS.parse_spec(spec, callables=False)[0].name


def create_calibrator(spec: str | Mapping[str, Any]) -> Calibrator:
    """A new, unfitted calibrator from a spec: a name or ``{name: ..., **options}``.

    Raises:
        ConfigError: an unknown name (listing the known ones), an option the calibrator does
            not take, or a value it refuses.
    """
    kind, options, _ = CALIBRATORS.parse_spec(spec, callables=False)
    try:
        return kind.resolve()(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"calibration {kind.name}: {exc}") from None


# The built-in calibrators, listed by import path: nothing registers by import side effect,
# and naming one imports only its own module.
for _name, _path, _text in (
    (
        "temperature",
        "ctrcal.calibration.scaling:TemperatureScaling",
        "temperature scaling z / T (Guo et al. 2017)",
    ),
    ("platt", "ctrcal.calibration.scaling:PlattScaling", "Platt scaling a·z + b (Platt 1999)"),
    (
        "isotonic",
        "ctrcal.calibration.isotonic:IsotonicCalibration",
        "isotonic regression of the click on the logit (Zadrozny and Elkan 2002)",
    ),
    (
        "field_aware",
        "ctrcal.calibration.field_aware:FieldAwareCalibration",
        "Platt or isotonic calibration per value of one field, shrunk toward the global one",
    ),
    (
        "label_shift",
        "ctrcal.calibration.label_shift:LabelShiftCalibrator",
        "label-shift correction: EM re-estimate of the click rate on the target rows "
        "(Saerens et al. 2002)",
    ),
):
    register_calibrator(_name, _path, description=_text)
register_calibrator(
    "mcgrad",
    "ctrcal.calibration.mcgrad:MCGradCalibrator",
    description="MCGrad: multicalibration by boosted trees over segment features "
    "(Tax et al., KDD 2026)",
    extra="mcgrad",
)
del _name, _path, _text
