"""The one place shift names live: register, check and create dataset shifts by name.

A shift turns a clean batch into a shifted one at evaluation time. Every shift kind is
registered with its intensity domain, its default grid and its options, so a config can be
checked without data and without torch (``ctrcal validate``)::

    create_shift("categorical_corruption", feature_map, intensity=0.2, seed=0)
    create_shift({"name": "gaussian_numeric", "space": "model"}, feature_map, intensity=0.25)

Built-in kinds (implemented in :mod:`ctrcal.shifts.builtin`):

* ``gaussian_numeric``: N(0, (s·σ_j)²) added to numeric feature j; ``space: original``
  (default) adds it to the value as it stands in the input file, σ_j that value's train-split
  std, and re-applies the fitted transform; ``space: model`` adds it to the model input.
  Intensities s ≥ 0 (the paper's grid 6.25 %, 12.5 %, 25 %, 50 %).
* ``categorical_corruption``: each categorical value replaced with probability p by an id
  drawn uniformly from the field's kept vocabulary (Ovadia et al. 2019's Criteo shift);
  p in [0, 1], default grid 0.05, 0.1, 0.2, 0.4, 0.6.
* ``temporal``: the natural shift of a time-ordered split (``data.split_order: time``): the
  batch is left as it is; its single level ("natural", intensity 1) is the test period.

Every created shift is deterministic by its seed (the same seed gives the same noise on the
same batches, for every model: comparisons are paired on the noise), vectorised on the
batch's device, and never modifies its input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctrcal.core.errors import ConfigError
from ctrcal.core.registry import Registry, import_object

__all__ = [
    "SHIFTS",
    "ShiftKind",
    "available_shifts",
    "check_shift_spec",
    "create_shift",
    "get_shift",
    "register_shift",
]

# factory(feature_map, intensity, seed=..., mix_fraction=..., **options) -> shift object
ShiftFactory = Callable[..., Any]


@dataclass(frozen=True)
class ShiftKind:
    """A registered shift: how to build it and what its intensities and options may be.

    Attributes:
        name: registry name.
        factory: ``factory(feature_map, intensity, seed=, mix_fraction=, **options)``; may be a
            ``"module:attribute"`` string, imported on first use (keeps this module torch-free).
        default_intensities: the grid used when a config gives none (without 0: the clean
            point is evaluated once for all shifts).
        low, high: the closed intensity domain (``high`` may be ``inf``).
        only: if set, the only intensities allowed (e.g. ``(1.0,)`` for a natural shift).
        options: option name -> allowed values; the first value is the default.
        unit: how intensities are written in tables (``"std"``, ``"p"``, ``"natural"``).
        needs_time_split: the shift is only meaningful on a time-ordered split.
        acts_on: the feature kind it perturbs (``"numeric"``, ``"categorical"``), or None; data
            without a field of that kind cannot take the shift.
        description: one line for the report.
    """

    name: str
    factory: ShiftFactory | str
    default_intensities: tuple[float, ...]
    low: float = 0.0
    high: float = math.inf
    only: tuple[float, ...] | None = None
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unit: str = "std"
    needs_time_split: bool = False
    description: str = ""
    acts_on: str | None = None

    def resolve_factory(self) -> ShiftFactory:
        if isinstance(self.factory, str):
            return import_object(self.factory)
        return self.factory

    def intensity_error(self, s: Any) -> str | None:
        """Why ``s`` is not an intensity of this shift (None when it is)."""
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            return f"expected a finite number, got {s!r}"
        if self.only is not None and s != 0 and float(s) not in self.only:
            return f"{self.name} has the single level {_join(self.only)}, got {s:g}"
        if not self.low <= s <= self.high:
            hi = "" if math.isinf(self.high) else f" and <= {self.high:g}"
            what = "probability" if self.unit == "p" else "intensity"
            return f"{self.name}: a {what} must be >= {self.low:g}{hi}, got {s:g}"
        return None


SHIFTS: Registry[ShiftKind] = Registry("shift")
"""Every shift kind by name."""


def register_shift(
    name: str,
    factory: ShiftFactory | str,
    *,
    default_intensities: Sequence[float],
    low: float = 0.0,
    high: float = math.inf,
    only: Sequence[float] | None = None,
    options: dict[str, Sequence[str]] | None = None,
    unit: str = "std",
    needs_time_split: bool = False,
    description: str = "",
    acts_on: str | None = None,
    overwrite: bool = False,
) -> ShiftKind:
    """Register a shift kind under ``name`` (see :class:`ShiftKind`); returns it.

    Raises:
        ValueError: the name is taken (unless ``overwrite``) or the grid is outside the domain.
    """
    key = name.strip()
    kind = ShiftKind(
        key,
        factory,
        tuple(float(s) for s in default_intensities),
        float(low),
        float(high),
        tuple(float(s) for s in only) if only is not None else None,
        {k: tuple(v) for k, v in (options or {}).items()},
        unit,
        needs_time_split,
        description,
        acts_on,
    )
    for s in kind.default_intensities:
        err = kind.intensity_error(s)
        if err:
            raise ValueError(f"default intensities of {key!r}: {err}")
    SHIFTS.register(key, kind, overwrite=overwrite)
    return kind


def available_shifts() -> list[str]:
    """Registered shift names, sorted."""
    return SHIFTS.available()


def get_shift(name: str) -> ShiftKind:
    """The registered kind ``name``.

    Raises:
        ConfigError: unknown name, with the closest valid one and the list of valid names.
    """
    return SHIFTS.get(name)


def _join(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)


def check_shift_spec(spec: Any, where: str, default_intensities: Sequence[float] | None = None):
    """Check one shift entry of a config and return ``(kind, intensities, options, label)``.

    Args:
        spec: a :class:`~ctrcal.config.ShiftConfig`, a mapping with the same keys, or a name.
        where: ``"FILE: report.shifts[i]"`` for messages.
        default_intensities: the grid when ``spec`` gives none (default: the kind's own).

    Raises:
        ConfigError: naming ``where`` and the key: unknown shift (closest choice), an intensity
            outside the shift's domain, an unknown option or option value.
    """
    if isinstance(spec, str):
        spec = {"name": spec}
    elif not isinstance(spec, dict):
        spec = {k: getattr(spec, k) for k in ("name", "intensities", "space", "label")}
    try:
        kind = get_shift(spec["name"])
    except ConfigError as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    grid = spec.get("intensities")
    if grid is None:
        grid = default_intensities if default_intensities is not None else kind.default_intensities
    grid = list(grid)
    if not grid:
        raise ConfigError(f"{where}.intensities: expected at least one intensity")
    for i, s in enumerate(grid):
        err = kind.intensity_error(s)
        if err:
            raise ConfigError(f"{where}.intensities[{i}]: {err}")
    if len(set(grid)) != len(grid):
        raise ConfigError(f"{where}.intensities: repeated values in {grid}")
    options: dict[str, str] = {}
    for opt, allowed in kind.options.items():
        options[opt] = allowed[0]
    for key in ("space",):
        value = spec.get(key)
        if value is None:
            continue
        if key not in kind.options:
            raise ConfigError(f"{where}.{key}: {kind.name} has no option {key!r}")
        if value not in kind.options[key]:
            raise ConfigError(
                f"{where}.{key}: got {value!r}, expected one of "
                f"{', '.join(map(repr, kind.options[key]))}"
            )
        options[key] = value
    label = spec.get("label") or kind.name
    if not label or "/" in label or label == "clean":
        raise ConfigError(f"{where}.label: {label!r} is not usable as a shift label")
    return kind, [float(s) for s in grid], options, label


def create_shift(
    spec: Any,
    feature_map: Any,
    *,
    intensity: float,
    seed: int | None = 0,
    mix_fraction: float = 1.0,
) -> Any:
    """Build a shift from a name / mapping / :class:`~ctrcal.config.ShiftConfig`.

    Args:
        spec: ``"categorical_corruption"``, ``{"name": "gaussian_numeric", "space": "model"}``
            or a ``ShiftConfig``.
        feature_map: the :class:`~ctrcal.data.feature_map.FeatureMap` of the data shifted.
        intensity: the level (std units, probability, ... see the kind).
        seed: seed of the shift's random stream (None = fresh).
        mix_fraction: fraction of the rows of each batch to shift.

    Returns:
        An object with ``apply(batch) -> (shifted batch, rows bool [B])``, ``__call__(batch)``,
        ``reset()`` and ``describe() -> dict``.
    """
    kind, _, options, _ = check_shift_spec(spec, "shift", default_intensities=[intensity])
    err = kind.intensity_error(intensity)
    if err:
        raise ConfigError(f"shift: {err}")
    factory = kind.resolve_factory()
    return factory(feature_map, float(intensity), seed=seed, mix_fraction=mix_fraction, **options)


register_shift(
    "gaussian_numeric",
    "ctrcal.shifts.builtin:GaussianNumericShift.from_feature_map",
    default_intensities=(0.0625, 0.125, 0.25, 0.5),
    options={"space": ("original", "model")},
    unit="std",
    acts_on="numeric",
    description="Gaussian noise on the numeric features, in units of each feature's "
    "train-split std",
)
register_shift(
    "categorical_corruption",
    "ctrcal.shifts.builtin:CategoricalCorruption.from_feature_map",
    default_intensities=(0.05, 0.1, 0.2, 0.4, 0.6),
    low=0.0,
    high=1.0,
    unit="p",
    acts_on="categorical",
    description="each categorical value replaced with probability p by an id drawn uniformly "
    "from its field's vocabulary",
)
register_shift(
    "temporal",
    "ctrcal.shifts.builtin:TemporalShift.from_feature_map",
    default_intensities=(1.0,),
    only=(1.0,),
    unit="natural",
    needs_time_split=True,
    description="the natural shift of a time-ordered split: train on the earlier rows, test "
    "on the later ones",
)
