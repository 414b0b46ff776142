"""Exceptions for bad user input.

Everything a user can get wrong (a config key, a data file, a CLI argument) raises a subclass
of :class:`CtrcalError`; the CLI prints its message as one line and exits non-zero. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class CtrcalError(Exception):
    """Base class of all user-facing errors. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class ConfigError(CtrcalError, ValueError):
    """An invalid configuration: unknown key, wrong type, missing key, unknown name."""

    exit_code = 2


class DataError(CtrcalError, ValueError):
    """Unreadable, malformed or unexpected input data (names the file and, where known, line)."""


class NotAvailableError(CtrcalError):
    """A capability that this version of ctrcal does not provide yet."""

    exit_code = 2
