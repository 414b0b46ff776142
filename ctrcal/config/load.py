"""Reading a config: files and overrides -> a typed :class:`~ctrcal.config.Config`.

:func:`read_config` reads the files (:mod:`ctrcal.config.yaml_files`) and builds every section
with the typed value checks of :mod:`ctrcal.core.typed`: an unknown key or a wrong type stops
it there, naming the file and the key. It imports neither torch nor the models and runs no
rule on values: the rule book, :mod:`ctrcal.validate`, does that (``ctrcal.load_config`` is
:func:`ctrcal.validate.load_config`, this reader followed by every check). How files combine,
and how a key is removed, is documented in :mod:`ctrcal.config`.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from ctrcal.config import DEFAULT_MODEL, Config, ModelConfig
from ctrcal.config.yaml_files import apply_overrides, key_sources, load_yaml
from ctrcal.core.norm_spec import NormSpec, parse_norm_spec
from ctrcal.core.registry import closest
from ctrcal.core.typed import NOT_HANDLED, SOURCE_KEY, build_value, describe, fail, strip_sources

__all__ = ["build_config", "config_from_dict", "read_config"]


def read_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read, merge and override a config file into a :class:`Config` (types and keys checked).

    Args:
        path: YAML file; ``None`` starts from the defaults.
        overrides: ``section.key=value`` strings (or ``~section.key``) applied after the file.

    Raises:
        ConfigError: naming the file, the dotted key, what was expected and the closest key.
    """
    raw = load_yaml(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    source = str(path) if path is not None else "<defaults>"
    return build_config(raw, source).set_provenance(source, key_sources(raw))


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    """A plain mapping (e.g. a saved snapshot) as a :class:`Config` (types and keys checked)."""
    return build_config(data, source).set_provenance(source)


def build_config(raw: dict[str, Any], source: str) -> Config:
    """The typed :class:`Config` of a raw mapping (types and keys checked, nothing else).

    The model's defaults are not filled in here (that needs the model):
    :func:`ctrcal.train.runs.with_model_defaults` does it.

    Raises:
        ConfigError: an unknown key (with the closest one), a wrong type, a missing key.
    """
    return build_value(Config, raw, "", source, _build_special)


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
        raise fail(
            sources.get("name", source),
            f"{key}.name",
            f"expected a model name or 'package.module:Class', got {name!r}",
        )
    kwargs: dict[str, Any] = {}
    for k, v in value.items():
        if k in (SOURCE_KEY, "name"):
            continue
        if not isinstance(k, str) or not k.isidentifier():
            raise fail(sources.get(k, source), f"{key}.{k}", "not a valid argument name")
        src = sources.get(k, source)
        kwargs[k] = _build_norm(v, f"{key}.{k}", src) if k.endswith("_norm") else strip_sources(v)
    return ModelConfig(name).with_arguments(kwargs)


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
