"""Typed value checks: the one place that says whether a value fits a type or a domain.

A leaf (it imports only :mod:`ctrcal.core.errors` and :mod:`ctrcal.core.registry`): the config
loader builds every section with :func:`build_value`, the model registry checks a model argument
against its constructor's annotation with :func:`check_value`, and the models check their
own arguments' domains with :func:`require_int` and :func:`require_number`. So a config and
a model constructor say the same thing about the same value, and say it once.

Messages name the key or argument first (``hidden_units[1]: expected an integer >= 1, got
0``), so a caller that knows where the value came from can prefix the file and section.
"""

from __future__ import annotations

import collections.abc
import math
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from ctrcal.core.errors import ConfigError
from ctrcal.core.registry import closest

__all__ = [
    "NOT_HANDLED",
    "SOURCE_KEY",
    "build_value",
    "check_value",
    "describe",
    "fail",
    "require_int",
    "require_number",
    "strip_sources",
]

# Mappings read from files carry, under this key, the file each of their keys came from (so a
# message names the right file even through `extends`). No user can write it in YAML.
SOURCE_KEY = "\0source"

# what a `custom` builder of build_value returns for a type it does not build itself
NOT_HANDLED = object()

Custom = Callable[[Any, Any, str, str], Any]


def fail(source: str, key: str, message: str) -> ConfigError:
    """``source: key: message`` as a :class:`ConfigError` (``<top level>`` without a key)."""
    return ConfigError(f"{source}: {key or '<top level>'}: {message}")


def strip_sources(value: Any) -> Any:
    """``value`` without the :data:`SOURCE_KEY` tags of its mappings."""
    if isinstance(value, dict):
        return {k: strip_sources(v) for k, v in value.items() if k != SOURCE_KEY}
    if isinstance(value, list):
        return [strip_sources(v) for v in value]
    return value


def describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like in YAML (for messages); a class may say it
    itself in a ``yaml_description`` attribute."""
    own = getattr(tp, "yaml_description", None)
    if isinstance(own, str):
        return own
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and hasattr(tp, "__dataclass_fields__"):
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"a list of {describe(item)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def build_value(tp: Any, value: Any, key: str, source: str, custom: Custom | None = None) -> Any:
    """``value`` checked against ``tp`` (and converted where YAML is loose: ``1e-4`` -> float).

    Args:
        tp: ``int``, ``float``, ``bool``, ``str``, ``None``, ``Any``, ``Literal[...]``,
            ``list[X]``, ``dict[...]``, unions of these; anything else goes to ``custom``.
        value: the value as read from YAML (mappings may carry :data:`SOURCE_KEY` tags).
        key, source: the dotted key and the file (or override) it came from, for messages.
        custom: ``custom(tp, value, key, source)`` builds the types it knows (sections,
            norm specs) and returns :data:`NOT_HANDLED` for the others.

    Raises:
        ConfigError: ``source: key: expected ..., got ...`` (the closest choice of a Literal).
    """
    if custom is not None:
        built = custom(tp, value, key, source)
        if built is not NOT_HANDLED:
            return built
    origin = typing.get_origin(tp)
    if tp is Any:
        return strip_sources(value)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return build_value(arg, value, key, source, custom)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise fail(source, key, f"expected {describe(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        hint = closest(str(value), [str(c) for c in choices])
        did = f"; did you mean {hint!r}?" if hint else ""
        raise fail(
            source, key, f"got {value!r}, expected one of {', '.join(map(repr, choices))}{did}"
        )
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise fail(source, key, f"expected {describe(tp)}, got {type(value).__name__}")
        return [build_value(item, v, f"{key}[{i}]", source, custom) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail(source, key, f"expected a mapping, got {type(value).__name__}")
        return strip_sources(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is type(None):
        if value is None:
            return None
    else:  # pragma: no cover - a field type this module does not know is a programming error
        raise TypeError(f"unsupported config type {tp!r} at {key}")
    raise fail(source, key, f"expected {describe(tp)}, got {value!r} ({type(value).__name__})")


def check_value(tp: Any, value: Any, where: str) -> None:
    """Check ``value`` against a constructor argument's annotation, as a config would.

    ``Sequence[X]`` and ``tuple[X, ...]`` are read as a list of X; annotations a config cannot
    express (a class, a callable) are not checked here.

    Args:
        where: ``"file: model.key"`` (the part after the last ``": "`` is the key).

    Raises:
        ConfigError: ``where: expected ..., got ...``.
    """
    tp = _config_type(tp)
    if tp is None:
        return
    source, _, key = where.rpartition(": ")
    build_value(tp, value, key, source or "config")


def _config_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp in (int, float, bool, str, type(None)) or tp is Any:
        return tp
    if origin is Literal:
        return tp
    if origin in (list, collections.abc.Sequence, tuple) and typing.get_args(tp):
        item = _config_type(typing.get_args(tp)[0])
        return list[item] if item is not None else None  # type: ignore[valid-type]
    if origin in (Union, types.UnionType):
        args = [_config_type(a) for a in typing.get_args(tp)]
        if any(a is None for a in args):
            return None
        return Union[tuple(args)]  # noqa: UP007 - built at run time
    return None


# ---------------------------------------------------------------------------------------------
# Domains: what a model constructor asks of its arguments


def require_int(name: str, value: Any, *, low: int) -> int:
    """``value`` as an integer ``>= low``.

    Raises:
        ConfigError (a ValueError): ``name: expected an integer >= low, got value``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ConfigError(f"{name}: expected an integer >= {low}, got {value!r}")
    return int(value)


def require_number(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite number in ``[low, high]`` (``*_open``: that end excluded).

    Raises:
        ConfigError (a ValueError): ``name: expected a finite number in [low, high), got ...``.
    """
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and (value < high if high_open else value <= high)
    )
    if not ok:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ConfigError(
            f"{name}: expected a finite number in {lo}{low:g}, {high:g}{hi}, got {value!r}"
        )
    return float(value)
