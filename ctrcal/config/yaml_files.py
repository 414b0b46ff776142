"""Config files as raw mappings: YAML, ``extends``, command-line overrides, removing a key.

This module turns files and ``section.key=value`` strings into one plain mapping, each of whose
mappings remembers which file (or override) set each key; :mod:`ctrcal.config.load` builds
the typed :class:`~ctrcal.config.Config` from it. The rules (documented for users in
:mod:`ctrcal.config`):

* ``extends: base.yaml`` (or a list) loads the bases first and deep-merges the file over them:
  mappings merge key by key, anything else (a list included) replaces.
* A mapping with a ``name`` is one thing named by it (the ``model`` section, a norm spec):
  naming another thing than the base does starts from that thing's own defaults, so the base's
  other keys are dropped. The model section without a ``name`` is MaskNet.
* ``key: !delete`` removes an inherited key (back to its default); on the command line
  ``~section.key`` (or ``section.key=!delete``) does the same. Removing a key that nothing set
  is an error: it is usually a typo.
* Overrides are applied last, in order.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ctrcal.config import DEFAULT_MODEL
from ctrcal.core.errors import ConfigError
from ctrcal.core.registry import normalize_name
from ctrcal.core.typed import SOURCE_KEY

__all__ = ["DELETE", "apply_overrides", "key_sources", "load_yaml", "parse_yaml"]


class _Delete:
    """The value of ``key: !delete``: remove the inherited key."""

    def __repr__(self) -> str:
        return "!delete"


DELETE = _Delete()


@functools.cache
def _loader() -> Any:
    """``yaml.SafeLoader`` plus the one tag ``!delete`` (PyYAML is imported on first use: a
    command given no config file reads no YAML)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def construct_delete(loader: yaml.SafeLoader, node: yaml.Node) -> _Delete:
        if not isinstance(node, yaml.ScalarNode) or node.value not in ("", "~", "null"):
            raise yaml.constructor.ConstructorError(
                None, None, "!delete takes no value (write 'key: !delete')", node.start_mark
            )
        return DELETE

    _Loader.add_constructor("!delete", construct_delete)
    return _Loader


def parse_yaml(text: str) -> Any:
    """YAML as :func:`yaml.safe_load` reads it, with ``!delete`` understood.

    Raises:
        yaml.YAMLError: the text is not YAML.
    """
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``extends:`` resolved (no validation)."""
    return _load_with_extends(Path(path), ())


def _load_with_extends(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        loop = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"{path}: 'extends' forms a cycle: {loop}")
    try:
        text = path.read_text()
    except OSError as exc:
        where = f"{chain[-1]}: extends" if chain else "config"
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    import yaml

    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{line}: invalid YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    bases = raw.pop("extends", None)
    merged: dict[str, Any] = {}
    if bases is not None:
        if isinstance(bases, str):
            bases = [bases]
        if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
            raise ConfigError(f"{path}: 'extends' must be a path or a list of paths")
        for base in bases:
            merged = _merge(merged, _load_with_extends(path.parent / base, (*chain, path)), "")
    return _merge(merged, _tag(raw, path), "")


def _tag(obj: Any, path: Path) -> Any:
    """``obj`` with every mapping remembering that its keys came from ``path``."""
    if isinstance(obj, dict):
        out = {k: _tag(v, path) for k, v in obj.items()}
        out[SOURCE_KEY] = {k: str(path) for k in obj}
        return out
    if isinstance(obj, list):
        return [_tag(v, path) for v in obj]
    return obj


def _name_of(mapping: dict[str, Any], key: str) -> Any:
    """The thing a mapping names: its ``name``; the model section's default is MaskNet."""
    name = mapping.get("name")
    if name is None and key == "model":
        return DEFAULT_MODEL
    return name


def _same_name(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return normalize_name(a) == normalize_name(b)
    return a == b


def _renames(base: dict[str, Any], top: dict[str, Any], key: str) -> bool:
    """Whether ``top`` names another thing than ``base`` (so it starts from its defaults)."""
    return "name" in top and not _same_name(_name_of(base, key), top["name"])


def _merge(base: dict[str, Any], top: dict[str, Any], where: str) -> dict[str, Any]:
    """``top`` deep-merged over ``base``; ``where`` is the dotted key of the two mappings."""
    out = dict(base)
    sources = dict(base.get(SOURCE_KEY, {}))
    top_sources = top.get(SOURCE_KEY, {})
    for key, value in top.items():
        if key == SOURCE_KEY:
            continue
        dotted = f"{where}.{key}" if where else str(key)
        if value is DELETE:
            if key not in out:
                raise _nothing_to_delete(top_sources.get(key, "config"), dotted, out)
            del out[key]
            sources.pop(key, None)
            continue
        current = out.get(key)
        if (
            isinstance(value, dict)
            and isinstance(current, dict)
            and not _renames(current, value, key)
        ):
            out[key] = _merge(current, value, dotted)
        else:
            if isinstance(value, dict) and isinstance(current, dict):  # another name
                # removing a key of the thing replaced: already gone with it
                value = {k: v for k, v in value.items() if not (v is DELETE and k in current)}
            _refuse_deletes(value, dotted, top_sources.get(key, "config"))
            out[key] = value
        if key in top_sources:
            sources[key] = top_sources[key]
    out[SOURCE_KEY] = sources
    return out


def _nothing_to_delete(source: str, dotted: str, present: dict[str, Any]) -> ConfigError:
    keys = sorted(str(k) for k in present if k != SOURCE_KEY)
    return ConfigError(
        f"{source}: {dotted}: !delete removes an inherited key, but no base sets it "
        f"(set here: {', '.join(keys) or 'nothing'})"
    )


def _refuse_deletes(value: Any, dotted: str, source: str) -> None:
    """A ``!delete`` inside a value that replaces (not merges) has nothing to remove."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == SOURCE_KEY:
                continue
            inner = f"{dotted}.{key}"
            if item is DELETE:
                raise _nothing_to_delete(value.get(SOURCE_KEY, {}).get(key, source), inner, value)
            _refuse_deletes(item, inner, source)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if item is DELETE:
                raise ConfigError(
                    f"{source}: {dotted}[{i}]: !delete removes a mapping's key, not a list item"
                )
            _refuse_deletes(item, f"{dotted}[{i}]", source)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) and ``~a.b.c`` removals."""
    raw = dict(raw)
    for item in overrides:
        label = f"override {item!r}"
        if item.startswith("~") and "=" not in item:
            dotted, value = item[1:], DELETE
        elif "=" in item:
            import yaml

            dotted, _, text = item.partition("=")
            try:
                value = parse_yaml(text) if text.strip() else None
            except yaml.YAMLError:
                raise ConfigError(f"{label}: value is not valid YAML") from None
        else:
            raise ConfigError(f"{label}: expected section.key=value (or ~section.key)")
        keys = dotted.strip().split(".")
        if not all(keys):
            raise ConfigError(f"{label}: empty key in {dotted!r}")
        node = raw
        for key in keys[:-1]:
            child = node.get(key)
            child = dict(child) if isinstance(child, dict) else {}
            node[key] = child
            node = child
        last = keys[-1]
        sources = dict(node.get(SOURCE_KEY, {}))
        if value is DELETE:
            if last not in node:
                raise _nothing_to_delete(label, dotted.strip(), node)
            del node[last]
            sources.pop(last, None)
        else:
            _refuse_deletes(value, dotted.strip(), label)
            if last == "name" and len(keys) > 1 and not _same_name(_name_of(node, keys[-2]), value):
                # another model (or norm): start from its defaults, keeping what earlier
                # overrides set on purpose
                for key in [k for k in node if k not in (SOURCE_KEY, "name")]:
                    if not str(sources.get(key, "")).startswith("override "):
                        del node[key]
                        sources.pop(key, None)
            node[last] = value
            sources[last] = label
        node[SOURCE_KEY] = sources
    return raw


def key_sources(raw: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key -> the file (or override) that set it, from the tags of the mapping."""
    out: dict[str, str] = {}
    for key, where in raw.get(SOURCE_KEY, {}).items():
        out[prefix + key] = where
    for key, value in raw.items():
        if key == SOURCE_KEY:
            continue
        if isinstance(value, dict):
            out.update(key_sources(value, f"{prefix}{key}."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(key_sources(item, f"{prefix}{key}[{i}]."))
    return out
