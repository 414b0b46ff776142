"""Loading a config: files and overrides -> a typed :class:`~ctrcal.config.Config` -> checks.

:func:`load_config` reads the files (:mod:`ctrcal.config_yaml`), builds every section with the
typed value checks of :mod:`ctrcal.typed` (unknown keys and wrong types stop it there, naming
the file and the key), then runs every check of :mod:`ctrcal.validation` (which builds the
model on the ``meta`` device). How files combine, and how a key is removed, is documented in
:mod:`ctrcal.config`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrcal.config import DEFAULT_MODEL, Config, ModelConfig, NormSpec
from ctrcal.config_yaml import apply_overrides, key_sources, load_yaml
from ctrcal.errors import ConfigError
from ctrcal.layers.spec import parse_norm_spec
from ctrcal.models.registry import with_defaults
from ctrcal.typed import NOT_HANDLED, SOURCE_KEY, build_value, describe, fail, strip_sources
from ctrcal.utils import closest
from ctrcal.validation import validate_config

__all__ = ["build_config", "config_from_dict", "load_config", "validate_names"]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    check_names: bool = True,
    skip_checks: Sequence[str] = (),
) -> Config:
    """Load, merge, override and validate a config file into a :class:`Config`.

    Args:
        path: YAML file; ``None`` starts from the defaults.
        overrides: ``section.key=value`` strings (or ``~section.key``) applied after the file.
        check_names: also run every data-free check (:mod:`ctrcal.validation`): registry
            names, the model built on the ``meta`` device, value domains, the report plan.
        skip_checks: names of checks not to run (a run's snapshot skips ``report``).

    Raises:
        ConfigError: naming the file, the dotted key, what was expected and the closest key.
    """
    raw = load_yaml(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    source = str(path) if path is not None else "<defaults>"
    cfg = build_config(raw, source)
    cfg._key_sources = key_sources(raw)  # type: ignore[attr-defined]
    if check_names:
        validate_config(cfg, source, skip_checks)
    return cfg


def config_from_dict(
    data: dict[str, Any], source: str = "<dict>", skip_checks: Sequence[str] = ()
) -> Config:
    """Validate a plain mapping (e.g. a saved snapshot) into a :class:`Config`."""
    cfg = build_config(data, source)
    validate_config(cfg, source, skip_checks)
    return cfg


def validate_names(cfg: Config, source: str, skip: Sequence[str] = ()) -> None:
    """Run every data-free check (:mod:`ctrcal.validation`) but those named in ``skip``; one
    error lists all problems."""
    validate_config(cfg, source, skip)


def build_config(raw: dict[str, Any], source: str) -> Config:
    """The typed :class:`Config` of a raw mapping (types and keys checked, nothing else).

    The model's defaults are filled in where the model resolves, checked or not: a config
    means the same run whether or not its checks ran (a run's identity is its whole config).

    Raises:
        ConfigError: an unknown key (with the closest one), a wrong type, a missing key.
    """
    cfg = build_value(Config, raw, "", source, _build_special)
    try:
        cfg.model = cfg.model.with_arguments(with_defaults(cfg.model.name, cfg.model.kwargs))
    except ConfigError:
        pass  # an unknown model: the model check names it
    return cfg


def _build_special(tp: Any, value: Any, key: str, source: str) -> Any:
    if tp is NormSpec:
        return _build_norm(value, key, source)
    if tp is ModelConfig:
        return _build_model(value, key, source)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, source)
    return NOT_HANDLED


def _build_norm(value: Any, key: str, source: str) -> NormSpec:
    try:
        return parse_norm_spec(strip_sources(value))
    except ValueError as exc:
        raise fail(source, key, str(exc)) from None


def _build_model(value: Any, key: str, source: str) -> ModelConfig:
    if isinstance(value, ModelConfig):
        return value
    if value is None:
        value = {}
    if isinstance(value, str):  # `model: dcnv2` = that model with its defaults
        value = {"name": value}
    if not isinstance(value, dict):
        raise fail(source, key, f"expected a mapping with 'name', got {value!r}")
    sources = value.get(SOURCE_KEY, {})
    name = value.get("name", DEFAULT_MODEL)
    if not isinstance(name, str) or not name.strip():
        raise fail(sources.get("name", source), f"{key}.name",
                   f"expected a model name or 'package.module:Class', got {name!r}")  # fmt: skip
    kwargs: dict[str, Any] = {}
    for k, v in value.items():
        if k in (SOURCE_KEY, "name"):
            continue
        if not isinstance(k, str) or not k.isidentifier():
            raise fail(sources.get(k, source), f"{key}.{k}", "not a valid argument name")
        src = sources.get(k, source)
        kwargs[k] = _build_norm(v, f"{key}.{k}", src) if k.endswith("_norm") else strip_sources(v)
    out = ModelConfig(name).with_arguments(kwargs)
    object.__setattr__(out, "sources", {k: sources.get(k, source) for k in [*kwargs, "name"]})
    return out


def _build_dataclass(tp: Any, value: Any, key: str, source: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise fail(source, key, f"expected a mapping, got {type(value).__name__} {value!r}")
    sources = value.get(SOURCE_KEY, {})
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp)}
    kwargs = {}
    for name, item in value.items():
        if name == SOURCE_KEY:
            continue
        src = sources.get(name, source)
        sub = f"{key}.{name}" if key else str(name)
        if name not in fields:
            hint = closest(str(name), fields)
            did = f"; did you mean {hint!r}?" if hint else ""
            raise fail(src, sub, f"unknown key{did} (valid keys: {', '.join(sorted(fields))})")
        kwargs[name] = build_value(hints[name], item, sub, src, _build_special)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            sub = f"{key}.{name}" if key else name
            raise fail(source, sub, f"missing required key ({describe(hints[name])})")
    return tp(**kwargs)
