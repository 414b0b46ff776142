"""The calibration keys of a shift report: what a variant asks for, checked without data.

Kept apart from :mod:`ctrcal.eval.report_calibration` (which needs numpy and the metrics)
so that ``ctrcal validate`` checks these keys without loading either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctrcal.errors import ConfigError

__all__ = ["CALIBRATIONS", "calibration_kind", "check_calibration_keys"]

CALIBRATIONS = ("temperature", "platt", "isotonic", "field")


def calibration_kind(variant: Any) -> str | None:
    """The calibration a report variant asks for: one of :data:`CALIBRATIONS` or None."""
    if getattr(variant, "field_calibration", None):
        return "field"
    if getattr(variant, "isotonic_calibration", False):
        return "isotonic"
    if variant.temperature_scaling:
        return "temperature"
    if variant.platt_scaling:
        return "platt"
    return None


def check_calibration_keys(cfg: Any, source: str, fields: Sequence[str] | None = None) -> None:
    """Check the calibration keys of ``report`` and its variants (no data needed).

    Args:
        cfg: the whole config.
        source: the config's file name, for messages.
        fields: the categorical field names of the data (default: Criteo's C1..C26).

    Raises:
        ConfigError: naming the key.
    """
    from ctrcal.data.criteo_schema import CATEGORICAL_COLUMNS

    known = list(fields) if fields is not None else list(CATEGORICAL_COLUMNS)
    r = cfg.report
    if r.field_min_count < 1:
        raise ConfigError(
            f"{source}: report.field_min_count: expected >= 1, got {r.field_min_count}"
        )
    if r.field_numeric_buckets < 0 or r.field_numeric_buckets == 1:
        raise ConfigError(
            f"{source}: report.field_numeric_buckets: expected 0 (categoricals only) or >= 2, "
            f"got {r.field_numeric_buckets}"
        )
    for i, v in enumerate(r.variants):
        key = f"{source}: report.variants[{i}]"
        chosen = [
            name
            for name, on in (
                ("temperature_scaling", v.temperature_scaling),
                ("platt_scaling", v.platt_scaling),
                ("isotonic_calibration", v.isotonic_calibration),
                ("field_calibration", v.field_calibration is not None),
            )
            if on
        ]
        if len(chosen) > 1:
            raise ConfigError(f"{key}: {' and '.join(chosen)}: choose one calibration, not both")
        if v.field_calibration is not None and v.field_calibration not in known:
            raise ConfigError(
                f"{key}.field_calibration: unknown categorical field {v.field_calibration!r} "
                f"(valid: {', '.join(known)})"
            )
        if v.field_calibration_shrinkage < 0:
            raise ConfigError(
                f"{key}.field_calibration_shrinkage: expected >= 0, got "
                f"{v.field_calibration_shrinkage}"
            )
