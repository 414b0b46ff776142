"""The one place model names live: register, resolve and check CTR models.

A model is picked by ``model.name`` in a config: a registered name (``masknet``, ``dcnv2``,
``dnn``, or one added with :func:`register_model`) or an import path
``package.module:ClassName``. The rest of the ``model:`` mapping are the model's own keyword
arguments, bound against its constructor's signature (an unknown or mistyped key fails in
``ctrcal validate``, naming the file and the key)::

    model: {name: dcnv2, structure: parallel, num_cross_layers: 3, net_norm: layernorm}
    model: {name: mypackage.ctr:MyModel, hidden: 64}

**Which forms are accepted where.**

* A config's ``model.name`` (YAML: ``ctrcal validate``, ``train``, ``shift-report``): a
  registered name, or an import path naming an ``nn.Module`` *subclass*. Anything else at the
  path (a function such as ``os:system``, an instance, a constant) is refused without being
  called. (Importing the module runs its top-level code, as any import does.)
* :func:`register_model` (Python): an ``nn.Module`` subclass, any factory
  ``factory(feature_map, **kwargs) -> nn.Module``, or the import path of either: the caller
  chose it.
* :func:`~ctrcal.models.build.create_model` (Python): a registered name, an import path (as
  in a config), or a class / factory object given directly.

An import path that names an object registered with :func:`register_model` (or a factory
already given as an object in this process, e.g. to :func:`ctrcal.shift_report`) is that
object: a factory chosen in Python can be named in a config by its path. A process that has
not seen it (a spawned sweep worker) refuses the path unless the factory's module registers
it (``@ctrcal.register_model("name")`` at import).

**The user-model contract** (checked, with a clear error, before any training):

* constructed as ``MyModel(feature_map, **kwargs)``; ``feature_map`` has ``vocab_sizes``,
  ``categorical_fields``, ``numeric_fields`` (and ``bucket_boundaries``);
* ``forward(batch) -> logits [B]`` (floating point); ``batch`` is a
  :class:`~ctrcal.core.batch.Batch`: ``batch.categorical`` int64 ``[B, Fc]``, ``batch.numeric``
  float32 ``[B, Fn]`` (NaN = missing), ``batch.label`` None (a model never sees labels);
* pure: no optimizer, no device logic, no files (ctrcal moves it, trains it, saves it).

Norm positions: a constructor argument named ``*_norm`` takes a norm spec (name,
``{name: ..., kwargs}``, class); a user model without a ``net_norm`` argument still accepts
``net_norm`` (every ``nn.LayerNorm`` in it is replaced with it through
:func:`~ctrcal.layers.registry.replace_norms`), which is how a report variant's norm reaches a
foreign model.

The built-in models follow the same ``forward(batch)`` contract. They are registered by import
path (``"ctrcal.models.masknet:MaskNet"``) and imported when first resolved; their constructors
are the only statement of their arguments.
This module imports no config and no data: it knows models, not files.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import parse_norm_spec
from ctrcal.core.registry import Registry, closest
from ctrcal.core.typed import check_value

__all__ = [
    "MODELS",
    "ModelEntry",
    "available_models",
    "check_model_kwargs",
    "model_defaults",
    "norm_positions",
    "register_model",
    "resolve_model",
    "with_defaults",
]

# constructor arguments every norm position is recognised by
NORM_SUFFIX = "_norm"


@dataclass(frozen=True)
class ModelEntry:
    """How to build one model.

    Attributes:
        name: registry name or import path.
        target: the class or callable, or its import path ``"package.module:Name"``, imported
            when first needed.
        data_args: for ctrcal's own models: ``feature_map -> {arg: value}`` filling the
            constructor's data arguments (vocab sizes, ...); None for the user contract
            ``factory(feature_map, **kwargs)``.
        classes_only: the target came from a config (an import path nobody registered): it
            must be an ``nn.Module`` subclass, and is refused, uncalled, otherwise.
    """

    name: str
    target: Callable[..., nn.Module] | str
    data_args: Callable[[Any], dict[str, Any]] | None = None
    classes_only: bool = False

    @property
    def factory(self) -> Callable[..., nn.Module]:
        """The class or callable; an entry registered by import path imports it here."""
        if isinstance(self.target, str):
            return _import_path(self.target, self.classes_only)
        return self.target

    def signature(self) -> inspect.Signature | None:
        """The constructor's signature (None: a callable Python cannot show one of)."""
        try:
            return inspect.signature(self.factory)
        except (TypeError, ValueError):
            return None

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The keyword arguments a config may set (data arguments excluded)."""
        sig = self.signature()
        if sig is None:
            return {}
        params = list(sig.parameters.values())
        if self.data_args is None:
            params = params[1:]  # feature_map
        else:
            data = set(self.data_args(_EmptyFeatureMap()))
            params = [p for p in params if p.name not in data]
        return {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def accepts_any(self) -> bool:
        """Whether the constructor takes ``**kwargs`` (or shows no signature)."""
        sig = self.signature()
        return sig is None or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())

    def hints(self) -> dict[str, Any]:
        """Parameter name -> annotated type, where the annotation can be resolved."""
        factory = self.factory
        target = factory.__init__ if inspect.isclass(factory) else factory
        try:
            return typing.get_type_hints(target)
        except Exception:  # unresolvable string annotations: skip type checks, keep name checks
            return {}


class _EmptyFeatureMap:
    vocab_sizes: list[int] = []
    numeric_fields: list[str] = []
    categorical_fields: list[str] = []
    bucket_boundaries = None


MODELS: Registry[ModelEntry] = Registry(
    "model", valid_extra=", or an import path 'package.module:ClassName'"
)
"""Every model by name (an import path needs no registration: see :func:`resolve_model`)."""
# factories given as objects from Python, by import path (see resolve_model)
_CHOSEN: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    factory: Callable[..., nn.Module] | str | None = None,
    *,
    overwrite: bool = False,
    _data_args: Callable[[Any], dict[str, Any]] | None = None,
) -> Any:
    """Register a model under ``name``; usable as a decorator.

    Args:
        name: the name configs use in ``model.name`` (any spelling: see
            :func:`~ctrcal.core.registry.normalize_name`).
        factory: a class (or any callable) following the user-model contract:
            ``factory(feature_map, **kwargs)`` returns an ``nn.Module`` whose
            ``forward(batch)`` returns logits ``[B]``; or its import path
            ``"package.module:Name"``, imported when first resolved.
        overwrite: allow replacing an existing registration.

    Returns:
        ``factory`` (or, without one, a decorator that registers and returns its argument).

    Raises:
        ValueError: the name is taken (and ``overwrite`` is False) or contains ``:``.
        ConfigError: ``factory`` is a class that is not an ``nn.Module``.
    """
    if factory is None:
        return functools.partial(register_model, name, overwrite=overwrite, _data_args=_data_args)
    if not name.strip() or ":" in name:
        raise ValueError(f"model name {name!r} must be non-empty and contain no ':'")
    if isinstance(factory, str):
        module_name, _, attr = factory.partition(":")
        if not module_name or not attr:
            raise ValueError(f"model {name!r}: expected 'package.module:Name', got {factory!r}")
    else:
        _check_factory(factory, name, classes_only=False)
    MODELS.register(name, ModelEntry(name.strip(), factory, _data_args), overwrite=overwrite)
    return factory


def available_models() -> list[str]:
    """Sorted names of every registered model."""
    return MODELS.available()


def _check_factory(factory: Any, name: str, *, classes_only: bool) -> None:
    """Refuse what is not a model, without calling it."""
    if inspect.isclass(factory):
        if not issubclass(factory, nn.Module):
            raise ConfigError(
                f"model {name!r}: {factory.__module__}.{factory.__qualname__} is not a "
                "torch.nn.Module subclass (a model must be an nn.Module)"
            )
        return
    if classes_only:
        raise ConfigError(
            f"model {name!r}: a config's import path must name an nn.Module subclass, and "
            f"this names {_kind(factory)}; it was not called (a Python factory can be "
            "registered with ctrcal.register_model)"
        )
    if not callable(factory):
        raise ConfigError(f"model {name!r}: {factory!r} is neither a class nor callable")


def _kind(obj: Any) -> str:
    if inspect.isroutine(obj):
        return f"the function {getattr(obj, '__qualname__', obj)!s}"
    if isinstance(obj, nn.Module):
        return f"an instance of {type(obj).__name__}, not a class"
    return f"a {type(obj).__name__}"


def resolve_model(spec: Any) -> ModelEntry:
    """The :class:`ModelEntry` for a name, an import path ``pkg.mod:Class``, or a class.

    An import path must name an ``nn.Module`` subclass, or an object registered with
    :func:`register_model`; a class or factory given as an object is the caller's choice.

    Raises:
        ConfigError: unknown name (with the closest one), an import path that does not
            resolve or names something else than a model class, or an object that is not an
            ``nn.Module`` class / callable.
    """
    if isinstance(spec, ModelEntry):
        return spec
    if not isinstance(spec, str):
        _check_factory(spec, getattr(spec, "__qualname__", repr(spec)), classes_only=False)
        path = qualified_name(spec)
        for _, entry in MODELS.items():
            if entry.target is spec or entry.target == path:
                return entry
        entry = ModelEntry(path, spec)
        if not inspect.isclass(spec):  # a factory handed over in Python: the caller chose it,
            _CHOSEN[path] = entry  # so its import path names it in this process from now on
        return entry
    if ":" in spec:
        for _, entry in MODELS.items():  # a registered model named by its import path
            if entry.target == spec:
                return entry
        if spec in _CHOSEN:
            return _CHOSEN[spec]
        obj = _import_path(spec, classes_only=False, check=False)
        for _, entry in MODELS.items():  # a registered object named by its import path
            if entry.target is obj:
                return entry
        _check_factory(obj, spec, classes_only=True)
        return ModelEntry(spec, obj, classes_only=True)
    return MODELS.get(spec)


def qualified_name(obj: Any) -> str:
    """``module:qualname`` of a class or function (its import path where it has one)."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return repr(obj)


def _import_path(path: str, classes_only: bool, check: bool = True) -> Any:
    """The object at ``package.module:Name`` (imported, never called)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model import path {path!r}: expected 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"model import path {path!r}: cannot import module {module_name!r} ({exc}); "
            "is the package installed or on PYTHONPATH?"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            hint = closest(part, names)
            did = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(
                f"model import path {path!r}: {module_name} has no attribute {part!r}{did}"
            )
        obj = getattr(obj, part)
    if check:
        _check_factory(obj, path, classes_only=classes_only)
    return obj


def model_defaults(spec: Any) -> dict[str, Any]:
    """The default of every configurable argument of a model (what a config may leave out)."""
    entry = resolve_model(spec)
    out: dict[str, Any] = {}
    for name, p in entry.parameters().items():
        if p.default is not p.empty:
            value = p.default
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def with_defaults(spec: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus the model's default for every argument they leave out, norm positions
    as norm specs: every argument the model will be built with (a run's snapshot lists them
    all, so its identity does not depend on which defaults a file spelt out)."""
    merged = {**model_defaults(spec), **kwargs}
    for key, value in merged.items():
        if is_norm_key(key) and not callable(value):
            merged[key] = parse_norm_spec(value)
    return merged


def check_model_kwargs(spec: Any, kwargs: dict[str, Any], where: Callable[[str], str]) -> None:
    """Bind ``kwargs`` against the model's signature: unknown keys, missing ones, bad types.

    Args:
        spec: model name, import path or class.
        kwargs: the config's model arguments (norm specs already parsed).
        where: ``key -> "file: model.key"`` for messages.

    Raises:
        ConfigError: naming the file and key, the closest valid key and what was expected.
    """
    entry = resolve_model(spec)
    params = entry.parameters()
    open_kwargs = entry.accepts_any()
    hints = entry.hints()
    for key, value in kwargs.items():
        if key not in params:
            if key == "net_norm" or open_kwargs:
                continue  # net_norm on a model without that argument: replace_norms
            valid = sorted(params) + ([] if "net_norm" in params else ["net_norm"])
            hint = closest(key, valid)
            did = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(
                f"{where(key)}: model {entry.name!r} has no argument {key!r}{did} "
                f"(valid: {', '.join(valid)})"
            )
        if is_norm_key(key):
            continue  # a norm spec: its own constructor checks it when the model is built
        tp = hints.get(key)
        if tp is not None:
            check_value(tp, value, where(key))
    for name, p in params.items():
        if p.default is p.empty and name not in kwargs:
            raise ConfigError(f"{where(name)}: missing required argument of {entry.name!r}")


def norm_positions(spec: Any) -> list[str]:
    """The norm arguments (``*_norm``) of a model, plus ``net_norm`` for any model."""
    entry = resolve_model(spec)
    names = [n for n in entry.parameters() if is_norm_key(n)]
    return names if "net_norm" in names else [*names, "net_norm"]


def is_norm_key(key: str) -> bool:
    """Whether a model argument is a norm position (parsed as a norm spec)."""
    return key.endswith(NORM_SUFFIX)


def data_args_from(fields: Sequence[str]) -> Callable[[Any], dict[str, Any]]:
    """``feature_map -> {...}`` for ctrcal's models: the named data arguments."""

    def build(feature_map: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "vocab_sizes" in fields:
            out["vocab_sizes"] = list(feature_map.vocab_sizes)
        if "num_numeric" in fields:
            out["num_numeric"] = len(feature_map.numeric_fields)
        if "bucket_boundaries" in fields:
            out["bucket_boundaries"] = getattr(feature_map, "bucket_boundaries", None)
        return out

    return build


FEATURE_DATA_ARGS = data_args_from(("vocab_sizes", "num_numeric", "bucket_boundaries"))


# ctrcal's own models, by import path: registering them imports nothing
for _name, _path in (
    ("masknet", "ctrcal.models.masknet:MaskNet"),
    ("dcnv2", "ctrcal.models.dcnv2:DCNv2"),
    ("dnn", "ctrcal.models.dnn:DNN"),
):
    register_model(_name, _path, _data_args=FEATURE_DATA_ARGS)
