"""Declarative bounds on parameters: a table stated beside the thing it bounds.

A class that takes parameters declares their bounds once, as a class attribute
``_parameter_constraints`` (scikit-learn's convention): ``{name: constraint}``. The rule book
(:mod:`ctrcal.validate`) reads these tables to check a config before anything runs, and the
class itself checks them with :func:`check_parameters` when it is used directly, so the bound
and its message exist in one place only.

Example::

    @dataclass
    class TrainConfig:
        _parameter_constraints: ClassVar[dict[str, Constraint]] = {
            "epochs": Interval(int, low=1),
            "lr": Interval(float, low=0.0, low_open=True),
        }
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ctrcal.core.errors import ConfigError
from ctrcal.core.typed import require_int, require_number

__all__ = [
    "Constraint",
    "Interval",
    "Matches",
    "NotBlank",
    "check_parameters",
    "parameter_problems",
]


class Constraint(Protocol):
    """A bound on one parameter's value."""

    def check(self, key: str, value: Any) -> None:
        """Raise :class:`ConfigError` ``key: expected ..., got value`` if ``value`` is out."""


@dataclass(frozen=True)
class Interval:
    """An integer (``kind=int``) or a finite number (``kind=float``) in ``[low, high]``.

    ``*_open`` excludes that end; ``off`` is one more value outside the interval that turns
    the feature off (``numeric_buckets``: 0, or at least 2), ``off_means`` says what it means;
    ``optional``: None is allowed too (no limit).
    """

    kind: type
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    off: int | None = None
    off_means: str = "off"
    optional: bool = False

    def check(self, key: str, value: Any) -> None:
        if self.optional and value is None:
            return
        if self.off is not None and not isinstance(value, bool) and value == self.off:
            return
        try:
            if self.kind is int:
                require_int(key, value, low=int(self.low))
            else:
                require_number(
                    key,
                    value,
                    low=self.low,
                    high=self.high,
                    low_open=self.low_open,
                    high_open=self.high_open,
                )
        except ConfigError:
            if self.off is None:
                raise
            kind = "an integer " if self.kind is int else ""
            raise ConfigError(
                f"{key}: expected {self.off} ({self.off_means}) or {kind}>= {self.low:g}, "
                f"got {value!r}"
            ) from None


@dataclass(frozen=True)
class Matches:
    """A string that matches ``pattern`` (after stripping blanks); ``expected`` says what."""

    pattern: str
    expected: str

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, str) or not re.fullmatch(self.pattern, value.strip()):
            raise ConfigError(f"{key}: expected {self.expected}, got {value!r}")


@dataclass(frozen=True)
class NotBlank:
    """None, or a string that is not blank; ``expected`` says what the string names."""

    expected: str

    def check(self, key: str, value: Any) -> None:
        if value is not None and not str(value).strip():
            raise ConfigError(f"{key}: expected {self.expected}, got an empty string")


def parameter_problems(
    obj: Any, constraints: Mapping[str, Constraint], prefix: str = ""
) -> Iterator[tuple[str, str]]:
    """``(key, message)`` of every parameter of ``obj`` outside its bound, in table order.

    Args:
        prefix: the dotted config key of ``obj`` (``train``); keys are ``prefix.name``.
    """
    for name, constraint in constraints.items():
        key = f"{prefix}.{name}" if prefix else name
        try:
            constraint.check(key, getattr(obj, name))
        except ConfigError as exc:
            yield key, str(exc).removeprefix(f"{key}: ")


def check_parameters(
    obj: Any,
    constraints: Mapping[str, Constraint],
    error: type,
    prefix: str = "",
    where: Callable[[str], str] | None = None,
) -> None:
    """Raise ``error`` (an exception class) ``key: message`` for the first parameter of
    ``obj`` outside its bound.

    Args:
        prefix: the dotted config key of ``obj``.
        where: how a message names a key (:meth:`ctrcal.config.Config.where` adds the file).
    """
    for key, message in parameter_problems(obj, constraints, prefix):
        raise error(f"{where(key) if where else key}: {message}")
