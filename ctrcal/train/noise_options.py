"""The one check of the noise-injection options (``train_shift``, ``weight_noise``).

Both a ``train`` section and a report variant carry them; ``ctrcal validate``, the report's
plan and the trainer ask :func:`check_noise_options`. Imports no torch (a config is checked
without it); the noise itself is :mod:`ctrcal.train.noise`.
"""

from __future__ import annotations

import math
from typing import Any

from ctrcal.core.errors import ConfigError
from ctrcal.shifts.registry import get_shift

__all__ = ["check_noise_options", "check_train_shift", "check_weight_noise", "train_shift_spec"]


def train_shift_spec(shift: Any) -> dict[str, Any]:
    """``{name, [space]}`` of a :class:`~ctrcal.config.TrainShiftConfig` (for ``create_shift``)."""
    spec = {"name": shift.name}
    if shift.space is not None:
        spec["space"] = shift.space
    return spec


def check_noise_options(shift: Any, weight_noise: Any, key: str) -> None:
    """Check a ``train_shift`` (a TrainShiftConfig or None) and a ``weight_noise`` (η or None).

    Args:
        key: the section they sit in, e.g. ``"train"`` or ``"FILE: report.variants[3]"``.

    Raises:
        ConfigError: ``"<key>.train_shift.<name|intensity|space>: ..."`` (an unknown shift with
            the valid names, a shift that does not perturb batches, an intensity outside the
            shift's domain, an unknown space) or ``"<key>.weight_noise: ..."`` (not a finite
            number >= 0).
    """
    check_weight_noise(weight_noise, key)
    check_train_shift(shift, key)


def check_weight_noise(weight_noise: Any, key: str) -> None:
    """``weight_noise`` is None (unset) or a finite variance >= 0; else a ConfigError."""
    if weight_noise is not None and (
        isinstance(weight_noise, bool)
        or not isinstance(weight_noise, (int, float))
        or not math.isfinite(weight_noise)
        or weight_noise < 0
    ):
        raise ConfigError(
            f"{key}.weight_noise: expected a variance eta >= 0 (0 = off), got {weight_noise!r}"
        )


def check_train_shift(shift: Any, key: str) -> None:
    """``train_shift`` is None or a registered batch shift at a valid intensity and space."""
    if shift is None:
        return
    where = f"{key}.train_shift"
    try:
        kind = get_shift(shift.name)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    if kind.needs_time_split:
        raise ConfigError(
            f"{where}.name: {kind.name} is a split of the data, not noise on a batch; "
            "use gaussian_numeric or categorical_corruption"
        )
    err = kind.intensity_error(shift.intensity)
    if err:
        raise ConfigError(f"{where}.intensity: {err}")
    if shift.space is not None:
        allowed = kind.options.get("space")
        if allowed is None:
            raise ConfigError(f"{where}.space: {kind.name} has no option 'space'")
        if shift.space not in allowed:
            raise ConfigError(
                f"{where}.space: got {shift.space!r}, expected one of "
                f"{', '.join(map(repr, allowed))}"
            )
