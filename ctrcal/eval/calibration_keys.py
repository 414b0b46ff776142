"""The calibration a report variant asks for, as one spec, checked without data.

A variant names its calibrator with ``calibration:`` (a registered name or
``{name: ..., <options>}``, see :mod:`ctrcal.calibration.base`). The four keys that came
before it (``temperature_scaling``, ``platt_scaling``, ``isotonic_calibration``,
``field_calibration`` with ``field_calibration_method`` / ``_shrinkage``) keep working:
:func:`calibration_spec` is the one place that translates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctrcal.errors import ConfigError

__all__ = ["LEGACY_KEYS", "calibration_spec", "check_calibration_keys"]

# the variant keys that name a calibrator without a spec, in the order they were checked
LEGACY_KEYS = ("field_calibration", "isotonic_calibration", "temperature_scaling", "platt_scaling")


def _chosen(variant: Any) -> list[str]:
    """The calibration keys a variant sets (more than one is an error)."""
    keys = [k for k in LEGACY_KEYS if getattr(variant, k, None) not in (None, False)]
    if getattr(variant, "calibration", None) is not None:
        keys.append("calibration")
    return keys


def calibration_spec(variant: Any) -> dict[str, Any] | None:
    """The calibration spec of a report variant (``{name: ..., <options>}``), or None.

    ``calibration:`` is taken as it is (a bare name becomes ``{name: <name>}``); otherwise
    the old keys translate: ``temperature_scaling: true`` -> ``{name: temperature}``,
    ``platt_scaling: true`` -> ``{name: platt}``, ``isotonic_calibration: true`` ->
    ``{name: isotonic}``, ``field_calibration: C14`` -> ``{name: field_aware, field: C14,
    method: <field_calibration_method>, shrinkage: <field_calibration_shrinkage>}``.
    """
    spec = getattr(variant, "calibration", None)
    if spec is not None:
        return {"name": spec} if isinstance(spec, str) else dict(spec)
    if getattr(variant, "field_calibration", None):
        return {
            "name": "field_aware",
            "field": variant.field_calibration,
            "method": variant.field_calibration_method,
            "shrinkage": variant.field_calibration_shrinkage,
        }
    for key, name in (
        ("isotonic_calibration", "isotonic"),
        ("temperature_scaling", "temperature"),
        ("platt_scaling", "platt"),
    ):
        if getattr(variant, key, False):
            return {"name": name}
    return None


def check_calibration_keys(cfg: Any, source: str, fields: Sequence[str] | None = None) -> None:
    """Check the calibration keys of ``report`` and its variants (no data needed).

    Every variant's spec is resolved against the calibrator registry and its options are
    given to the calibrator's constructor, so an unknown name, option or value fails here,
    before anything trains.

    Args:
        cfg: the whole config.
        source: the config's file name, for messages.
        fields: the categorical field names of the data (default: Criteo's C1..C26).

    Raises:
        ConfigError: naming the key.
    """
    from ctrcal.calibration.base import create_calibrator
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
        chosen = _chosen(v)
        if len(chosen) > 1:
            raise ConfigError(f"{key}: {' and '.join(chosen)}: choose one calibration, not both")
        if not chosen:
            continue
        where = f"{key}.{chosen[0]}"
        spec = calibration_spec(v)
        try:
            calibrator = create_calibrator(spec)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if getattr(calibrator, "field", "") is None:  # field_aware without its field
            raise ConfigError(f"{where}: {spec['name']} needs field: <a categorical field>")
        for name in calibrator.needed_fields():
            if name not in known:
                raise ConfigError(
                    f"{where}: unknown categorical field {name!r} (valid: {', '.join(known)})"
                )
