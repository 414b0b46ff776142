"""Everything about a config that can be checked without data, in one pass.

:func:`~ctrcal.config.load_config` first builds the typed :class:`~ctrcal.config.Config`
(unknown keys and wrong types stop it there), then runs every registered check and raises one
:class:`~ctrcal.errors.ConfigError` listing every problem, each naming the file it came from
(through ``extends`` and command-line overrides) and the dotted key. ``ctrcal validate`` prints
them one per line.

Checks are pluggable, like norms, shifts and models: a check is a function
``check(cfg, problems)`` registered with :func:`register_check`; it reports with
``problems.add(key, message)`` or runs a raising check under ``with problems.at(key):``.
Checks must not import torch, read data or touch devices (``ctrcal validate`` stays fast and
works anywhere); a registry offers a torch-free argument check for its entries (norms:
:func:`ctrcal.layers.spec.check_norm_spec`) that checks here call. Modules holding checks are
listed in ``CHECK_MODULES`` and imported on first use.

Example::

    from ctrcal.validation import register_check

    @register_check("my_section")
    def _check_mine(cfg, problems):
        if cfg.train.batch_size % 64:
            problems.add("train.batch_size", "expected a multiple of 64")
"""

from __future__ import annotations

import contextlib
import importlib
import math
import numbers
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctrcal.errors import ConfigProblems

if TYPE_CHECKING:
    from ctrcal.config import Config
    from ctrcal.layers.spec import NormSpec

__all__ = [
    "CHECK_MODULES",
    "ConfigProblems",
    "Problem",
    "Problems",
    "check_config",
    "register_check",
    "validate_config",
]

# torch-free modules whose import registers checks (a subsystem adds its own module here)
CHECK_MODULES: list[str] = ["ctrcal.checks"]


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

    # -- common shapes of a check ------------------------------------------------------------

    def integer(self, key: str, value: Any, *, low: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            self.add(key, f"expected an integer >= {low}, got {value!r}")

    def number(
        self, key: str, value: Any, *, low: float = -math.inf, high: float = math.inf,
        low_open: bool = False, high_open: bool = False,
    ) -> None:  # fmt: skip
        """A finite number in [low, high] (``*_open``: that end excluded)."""
        ok = (
            isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > low if low_open else value >= low)
            and (value < high if high_open else value <= high)
        )  # fmt: skip
        if not ok:
            lo = "(" if low_open else "["
            hi = ")" if high_open else "]"
            self.add(key, f"expected a finite number in {lo}{low:g}, {high:g}{hi}, got {value!r}")

    def norm(self, key: str, spec: NormSpec | None, widths: Sequence[int | None]) -> None:
        """A norm spec at a position whose layers normalise ``widths`` features each."""
        from ctrcal.layers.spec import check_norm_spec

        for width in dict.fromkeys(widths) or [None]:
            before = len(self.items)
            with self.at(key):
                check_norm_spec(spec, width)
            if len(self.items) > before:
                return  # one problem per position is enough


# "report.variants[2].mc_samples: expected ..." -> the key and the message
_KEYED = re.compile(r"^([A-Za-z_][\w\[\]]*(?:\.[\w\[\]]+)*): (.*)$", re.S)

CheckFn = Callable[["Config", Problems], None]
_CHECKS: dict[str, CheckFn] = {}
_LOADED = False


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


def _load_checks() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in CHECK_MODULES:
            importlib.import_module(module)


def check_config(
    cfg: Config, source: str = "config", skip: Sequence[str] = ()
) -> list[Problem]:
    """Every problem the registered checks (except those named in ``skip``) find in ``cfg``."""
    _load_checks()
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
