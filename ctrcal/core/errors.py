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


class ConfigProblems(ConfigError):
    """A :class:`ConfigError` listing every problem a config check found (``.problems``:
    items whose ``str`` is ``"file: key: message"``)."""

    def __init__(self, problems: list | str) -> None:
        if isinstance(problems, str):  # rebuilt from its message (e.g. in another process)
            self.problems = []
            super().__init__(problems)
            return
        self.problems = list(problems)
        if len(self.problems) == 1:
            text = str(self.problems[0])
        else:
            text = f"{len(self.problems)} problems: " + "; ".join(map(str, self.problems))
        super().__init__(text)


class DataError(CtrcalError, ValueError):
    """Unreadable, malformed or unexpected input data (names the file and, where known, line)."""


class OutputError(CtrcalError):
    """A file or directory could not be written: no space left, a read-only file system, a
    missing permission (the message names the path and the cause). Nothing was wrong with
    the input; the command can be run again once the cause is gone. Deliberately not an
    ``OSError``: an ``except OSError`` around reading input must not catch it."""


class NotAvailableError(CtrcalError):
    """A capability that this version of ctrcal does not provide yet."""

    exit_code = 2
