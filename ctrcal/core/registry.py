"""One registry of named things: norms, models, shifts, calibrators, dataset schemas, checks.

Every registry in ctrcal is a :class:`Registry`, so they all read names the same way:

* one normaliser, :func:`normalize_name`: case, ``-``, ``_``, spaces and dots are ignored, so
  ``MC_LayerNorm``, ``mc-layernorm`` and ``mclayernorm`` name the same thing;
* one closest-name suggestion (``did you mean 'layernorm'?``) in one error message that lists
  every valid name: ``unknown norm 'layrnorm'; did you mean 'layernorm'? (valid: ...)``;
* built-ins registered by import path (``"package.module:Name"``) are imported when first
  looked up, so that listing a registry's names imports nothing.

A registry keeps names as they were registered (``gaussian_numeric``), for messages and
listings, and looks them up by their normalised form.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from ctrcal.core.errors import ConfigError

__all__ = ["Registry", "closest", "import_object", "normalize_name"]

T = TypeVar("T")


def normalize_name(name: str) -> str:
    """The one rule by which two spellings name the same entry: lower case without ``-``,
    ``_``, spaces or dots (``MC_LayerNorm`` -> ``mclayernorm``).

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"a name must be a string, got {type(name).__name__}")
    return "".join(ch for ch in name.strip().lower() if ch not in "-_ .")


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``name`` (for "did you mean ...?"), or None."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def import_object(path: str) -> Any:
    """The object a built-in registry entry names as ``"package.module:attr.sub"``, imported
    on first use (registries list built-ins by path, so that listing them imports nothing).
    User-given import paths go through :mod:`ctrcal.models.registry`, which checks them."""
    import importlib

    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Names -> entries of one kind (``"norm"``, ``"model"``, ...).

    Args:
        kind: what an entry is, for messages (``unknown norm 'x'``).
        lazy: a string entry is the import path ``"package.module:Name"`` of the entry,
            imported (once) when first looked up.
        valid_extra: appended to the list of valid names in the unknown-name message
            (``", or an import path 'package.module:ClassName'"``).
        error: the exception an unknown name raises (a ``ValueError`` subclass).
    """

    def __init__(
        self,
        kind: str,
        *,
        lazy: bool = False,
        valid_extra: str = "",
        error: type[ValueError] = ConfigError,
    ) -> None:
        self.kind = kind
        self.lazy = lazy
        self.valid_extra = valid_extra
        self.error = error
        # normalised name -> (the name as registered, the entry or its import path)
        self._entries: dict[str, tuple[str, T | str]] = {}
        self._aliases: dict[str, str] = {}  # normalised alias -> normalised name

    # ---- registering ------------------------------------------------------------------------

    def register(
        self,
        name: str,
        entry: T | str | None = None,
        *,
        aliases: Iterable[str] = (),
        overwrite: bool = False,
    ) -> Any:
        """Register ``entry`` under ``name`` (and ``aliases``); usable as a decorator.

        Returns:
            ``entry`` (or, without one, a decorator that registers and returns its argument).

        Raises:
            ValueError: an empty name, a malformed import path (lazy registries), or a name
                (or alias) already taken while ``overwrite`` is False.
        """
        if entry is None:
            return functools.partial(self.register, name, aliases=aliases, overwrite=overwrite)
        key = normalize_name(name)
        if not key:
            raise ValueError(f"a {self.kind} name must not be empty")
        if self.lazy and isinstance(entry, str):
            module, _, attr = entry.partition(":")
            if not module or not attr:
                raise ValueError(
                    f"{self.kind} {name!r}: expected 'package.module:Name', got {entry!r}"
                )
        alias_keys = [normalize_name(a) for a in aliases]
        if not overwrite:
            for k in [key, *alias_keys]:
                if k in self._entries or k in self._aliases:
                    raise ValueError(
                        f"{self.kind} {self._display(k)!r} is already registered "
                        "(pass overwrite=True)"
                    )
        self._aliases.pop(key, None)
        self._entries[key] = (name.strip(), entry)
        for alias in alias_keys:
            self._entries.pop(alias, None)
            self._aliases[alias] = key
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` and the aliases that point to it (nothing if it is not there)."""
        key = self._key(name)
        self._entries.pop(key, None)
        for alias in [a for a, k in self._aliases.items() if k == key]:
            del self._aliases[alias]

    # ---- looking up -------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        key = normalize_name(name)
        return self._aliases.get(key, key)

    def _display(self, key: str) -> str:
        if key in self._entries:
            return self._entries[key][0]
        return key

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def available(self) -> list[str]:
        """Sorted names of every entry, as registered (aliases excluded)."""
        return sorted(name for name, _ in self._entries.values())

    def canonical(self, name: str) -> str:
        """The name ``name`` (any spelling, or an alias) was registered as.

        Raises:
            the registry's error: unknown name (see :meth:`get`).
        """
        key = self._key(name)
        if key not in self._entries:
            raise self.unknown(name)
        return self._entries[key][0]

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, entry)`` pairs in registration order (lazy entries imported)."""
        for key in list(self._entries):
            yield self._entries[key][0], self._resolve(key)

    def find(self, name: str) -> T | None:
        """The entry registered under ``name`` (any spelling, or an alias), or None."""
        key = self._key(name)
        return self._resolve(key) if key in self._entries else None

    def get(self, name: str) -> T:
        """The entry registered under ``name`` (any spelling, or an alias).

        Raises:
            the registry's error (a ValueError): unknown name; the message suggests the
                closest valid name and lists them all.
        """
        key = self._key(name)
        if key not in self._entries:
            raise self.unknown(name)
        return self._resolve(key)

    def suggest(self, name: str) -> str | None:
        """The registered name (or alias) closest to ``name``, or None."""
        names = {k: n for k, (n, _) in self._entries.items()}
        names.update({a: a for a in self._aliases})
        hint = closest(normalize_name(name), names)
        return names[hint] if hint is not None else None

    def valid_names(self) -> str:
        """``"a, b (aliases: none -> identity)"`` for messages."""
        text = ", ".join(self.available())
        if self._aliases:
            pairs = ", ".join(
                f"{a} -> {self._display(k)}" for a, k in sorted(self._aliases.items())
            )
            text += f" (aliases: {pairs})"
        return text + self.valid_extra

    def unknown(self, name: Any) -> ValueError:
        """The error for an unknown ``name``: the closest name and every valid one."""
        hint = self.suggest(name) if isinstance(name, str) else None
        did = f"; did you mean {hint!r}?" if hint else ""
        return self.error(f"unknown {self.kind} {name!r}{did} (valid: {self.valid_names()})")

    def _resolve(self, key: str) -> T:
        name, entry = self._entries[key]
        if self.lazy and isinstance(entry, str):
            entry = import_object(entry)
            self._entries[key] = (name, entry)
        return entry  # type: ignore[return-value]

    # ---- specs ------------------------------------------------------------------------------

    def parse_spec(self, spec: Any, *, callables: bool = True) -> tuple[Any, dict[str, Any], str]:
        """``(entry, arguments, label)`` from a spec.

        A spec is a name, a mapping ``{"name": ..., **arguments}`` (as YAML writes it), an
        object with ``name`` and ``kwargs`` attributes (a :class:`~ctrcal.core.norm_spec.NormSpec`),
        or, where ``callables``, a class or callable used as it is (``functools.partial``
        included). ``label`` names the entry in messages (its registered name).

        Raises:
            the registry's error: unknown name, a mapping without a string ``name``, or a spec
                of none of these forms.
        """
        if isinstance(spec, Mapping):
            name = spec.get("name")
            if not isinstance(name, str):
                raise self.error(f"a {self.kind} mapping needs 'name: <{self.kind}>', got {spec!r}")
            arguments = {k: v for k, v in spec.items() if k != "name"}
        elif isinstance(getattr(spec, "name", None), str) and isinstance(
            getattr(spec, "kwargs", None), Mapping
        ):
            name, arguments = spec.name, dict(spec.kwargs)
        elif isinstance(spec, str):
            name, arguments = spec, {}
        elif callables and callable(spec):
            label = getattr(spec, "__name__", None) or repr(spec)
            return spec, {}, label
        else:
            raise self.error(f"a {self.kind} spec is a name or a mapping with 'name', got {spec!r}")
        return self.get(name), arguments, self.canonical(name)

    def create(self, spec: Any, *args: Any, **kwargs: Any) -> Any:
        """Build from a spec (see :meth:`parse_spec`): ``entry(*args, **arguments, **kwargs)``.

        For registries whose entries are factories (norms). ``*args`` are the factory's
        positional arguments (a norm's width); ``**kwargs`` override the spec's own arguments.
        """
        entry, arguments, _ = self.parse_spec(spec)
        return entry(*args, **{**arguments, **kwargs})
