"""Everything about a config that can be checked without data, in one pass.

:func:`~ctrcal.config_load.load_config` first builds the typed :class:`~ctrcal.config.Config`
(unknown keys and wrong types stop it there), then runs every registered check and raises one
:class:`~ctrcal.errors.ConfigError` listing every problem, each naming the file it came from
(through ``extends`` and command-line overrides) and the dotted key. ``ctrcal validate`` prints
them one per line.

Checks are pluggable, like norms, shifts and models: a check is a function
``check(cfg, problems)``; it reports with ``problems.add(key, message)`` or runs a raising
check under ``with problems.at(key):``. The built-in checks (:mod:`ctrcal.checks`) are listed
here; a user adds one with :func:`register_check`. Checks read no data and touch no device;
the model check builds the model on the ``meta`` device, so its constructor (and each norm's)
is the one statement of which arguments and widths are valid.

Example::

    from ctrcal.validation import register_check

    @register_check("my_section")
    def _check_mine(cfg, problems):
        if cfg.train.batch_size % 64:
            problems.add("train.batch_size", "expected a multiple of 64")
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctrcal import checks
from ctrcal.errors import ConfigError, ConfigProblems
from ctrcal.typed import require_int, require_number

if TYPE_CHECKING:
    from ctrcal.config import Config

__all__ = [
    "ConfigProblems",
    "Problem",
    "Problems",
    "check_config",
    "register_check",
    "validate_config",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (file, dotted key) and what."""

    source: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.key or '<top level>'}: {self.message}"


class Problems:
    """What the checks found, with the file each key came from."""

    def __init__(self, cfg: Config, source: str) -> None:
        self.cfg = cfg
        self.source = source
        self._sources: dict[str, str] = getattr(cfg, "_key_sources", None) or {}
        self.items: list[Problem] = []

    def source_of(self, key: str) -> str:
        """The file (or override) that set ``key``, else the config's own source."""
        parts = key.replace("[", ".[").split(".")
        for n in range(len(parts), 0, -1):
            found = self._sources.get(".".join(parts[:n]).replace(".[", "["))
            if found:
                return found
        return self.source

    def add(self, key: str, message: str) -> None:
        """Record that ``key`` is wrong: ``message`` says what was expected and what came."""
        self.items.append(Problem(self.source_of(key), key, message))

    @contextlib.contextmanager
    def at(self, key: str) -> Iterator[None]:
        """Run a raising check; a ``ValueError`` (ConfigError included) becomes a problem."""
        try:
            yield
        except ValueError as exc:
            message = str(exc)
            if message.startswith(f"{self.source}: "):  # checks shared with run time name it
                message = message[len(self.source) + 2 :]
            named = _KEYED.match(message)
            if named and named.group(1).startswith(key):  # the check named a deeper key
                key, message = named.group(1), named.group(2)
            self.add(key, message)

    # -- common shapes of a check (the domains are ctrcal.typed's, as the models' are) ----

    def integer(self, key: str, value: Any, *, low: int) -> None:
        """``value`` must be an integer ``>= low``."""
        try:
            require_int(key, value, low=low)
        except ConfigError as exc:
            self.add(key, str(exc)[len(key) + 2 :])

    def number(self, key: str, value: Any, **domain: Any) -> None:
        """``value`` must be a finite number in the domain (see
        :func:`ctrcal.typed.require_number`)."""
        try:
            require_number(key, value, **domain)
        except ConfigError as exc:
            self.add(key, str(exc)[len(key) + 2 :])


# "report.variants[2].mc_samples: expected ..." -> the key and the message
_KEYED = re.compile(r"^([A-Za-z_][\w\[\]]*(?:\.[\w\[\]]+)*): (.*)$", re.S)

CheckFn = Callable[["Config", Problems], None]
# the built-in checks, one per section, in the order they run
_CHECKS: dict[str, CheckFn] = {
    "data": checks.check_data,
    "features": checks.check_features,
    "model": checks.check_model,
    "train": checks.check_train,
    "report": checks.check_report,
}


def register_check(name: str, fn: CheckFn | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn(cfg, problems)`` under ``name``; usable as a decorator.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    if fn is None:
        return lambda f: register_check(name, f, overwrite=overwrite)
    if name in _CHECKS and not overwrite and _CHECKS[name] is not fn:
        raise ValueError(f"config check {name!r} is already registered (pass overwrite=True)")
    _CHECKS[name] = fn
    return fn


def check_config(
    cfg: Config, source: str = "config", skip: Sequence[str] = ()
) -> list[Problem]:
    """Every problem the registered checks (except those named in ``skip``) find in ``cfg``."""
    problems = Problems(cfg, source)
    for name, fn in _CHECKS.items():
        if name not in skip:
            fn(cfg, problems)
    return problems.items


def validate_config(cfg: Config, source: str = "config", skip: Sequence[str] = ()) -> None:
    """Raise one :class:`ConfigError` listing every problem of ``cfg`` (nothing if valid).

    Args:
        skip: names of checks not to run (the trainer skips ``report``: a run is the same
            whatever report it belongs to).
    """
    problems = check_config(cfg, source, skip)
    if problems:
        raise ConfigProblems(problems)
