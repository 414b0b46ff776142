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

from ctrcal.core.errors import ConfigError

__all__ = ["LEGACY_KEYS", "calibration_spec", "check_calibration_keys", "missing_packages"]

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


def _spec_names(spec: Any) -> list[str]:
    """The calibrator names a spec uses: its own and those it nests (``calibrate:``)."""
    if isinstance(spec, str):
        return [spec]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return []
    return [spec["name"], *_spec_names(spec.get("calibrate"))]


def missing_packages(cfg: Any) -> list[tuple[str, str]]:
    """``(key, message)`` for every optional package the config's calibrators need and this
    install lacks, one per package (the key is the first variant that needs it).

    A registered calibrator names its extra (``CalibratorKind.extra``), which is also the
    name its package imports as (``ctrcal[mcgrad]`` installs ``mcgrad``).
    """
    import importlib.util

    from ctrcal.calibration.base import get_calibrator

    needs: dict[str, list[tuple[int, str]]] = {}
    for i, v in enumerate(cfg.report.variants):
        for name in _spec_names(calibration_spec(v)):
            try:
                extra = get_calibrator(name).extra
            except ConfigError:
                continue  # an unknown name: check_calibration_keys names it
            if extra is not None:
                needs.setdefault(extra, []).append((i, v.name))
    out = []
    for extra, users in needs.items():
        if importlib.util.find_spec(extra) is not None:
            continue
        names = ", ".join(name for _, name in users)
        out.append(
            (
                f"report.variants[{users[0][0]}].calibration",
                f"needs the optional package {extra!r}, which is not installed "
                f"(pip install 'ctrcal[{extra}]'); variants that use it: {names}",
            )
        )
    return out


def check_calibration_keys(cfg: Any, fields: Sequence[str] | None = None) -> None:
    """Check the calibration keys of ``report`` and its variants (no data needed).

    Every variant's spec is resolved against the calibrator registry and its options are
    given to the calibrator's constructor, so an unknown name, option or value fails here,
    before anything trains.

    Args:
        cfg: the whole config (messages name the file that set each key).
        fields: the categorical field names of the data (default: Criteo's C1..C26).

    Raises:
        ConfigError: naming the key.
    """
    from ctrcal.calibration.base import create_calibrator
    from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, NUMERIC_COLUMNS

    known = list(fields) if fields is not None else list(CATEGORICAL_COLUMNS)
    r = cfg.report
    if r.field_numeric_buckets and fields is None:
        known += list(NUMERIC_COLUMNS)  # bucketised numerics are segments too
    missing = missing_packages(cfg)
    if missing:
        # every missing package at once, before any calibrator is built (building one
        # without its package fails on the first)
        raise ConfigError("; ".join(f"{cfg.where(key)}: {msg}" for key, msg in missing))
    for i, v in enumerate(r.variants):
        key = cfg.where(f"report.variants[{i}]")
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
                raise ConfigError(f"{where}: unknown field {name!r} (valid: {', '.join(known)})")
