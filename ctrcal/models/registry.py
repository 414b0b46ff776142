"""The one place model names live: register, resolve and check CTR models.

A model is picked by ``model.name`` in a config: a registered name (``masknet``, ``dcnv2``,
``dnn``, or one added with :func:`register_model`) or an import path
``package.module:ClassName``. The rest of the ``model:`` mapping are the model's own keyword
arguments, bound against its constructor's signature by ``ctrcal validate`` (an unknown or
mistyped key fails there, naming the file and the key)::

    model: {name: dcnv2, structure: parallel, num_cross_layers: 3, net_norm: layernorm}
    model: {name: mypackage.ctr:MyModel, hidden: 64}

**The user-model contract** (checked, with a clear error, before any training):

* constructed as ``MyModel(feature_map, **kwargs)``; ``feature_map`` has ``vocab_sizes``,
  ``categorical_fields``, ``numeric_fields`` (and ``bucket_boundaries``);
* ``forward(batch) -> logits [B]`` (floating point); ``batch.categorical`` is int64
  ``[B, Fc]``, ``batch.numeric`` float32 ``[B, Fn]`` (NaN = missing), ``batch.label`` is None
  (a model never sees labels);
* pure: no optimizer, no device logic, no files (ctrcal moves it, trains it, saves it).

Inside ctrcal every model is called ``model(categorical, numeric)``: a user model is wrapped
in :class:`~ctrcal.models.build.BatchInputModel`, which builds the batch. Norm positions: a
constructor argument named ``*_norm`` takes a norm spec (name, ``{name: ..., kwargs}``,
class); a user model
without a ``net_norm`` argument still accepts ``net_norm`` (every ``nn.LayerNorm`` in it is
replaced with it through :func:`~ctrcal.layers.registry.replace_norms`), which is how a report
variant's norm reaches a foreign model.

This module imports neither torch nor the models: the built-in models are registered by
import path (``"ctrcal.models.masknet:MaskNet"``) and their constructor's signature is read
from the source (:mod:`ctrcal.models.signature`), so ``ctrcal validate`` binds every argument
in milliseconds. Building a model (:func:`~ctrcal.models.build.create_model`) imports it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctrcal.errors import ConfigError
from ctrcal.models.signature import SourceSignatureError, read_source_signature
from ctrcal.utils import closest

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "ModelEntry",
    "available_models",
    "check_model_kwargs",
    "model_defaults",
    "norm_positions",
    "register_model",
    "resolve_model",
]

# constructor arguments every norm position is recognised by
NORM_SUFFIX = "_norm"
# norm positions a report variant sets on any model
VARIANT_NORMS = ("net_norm", "emb_norm")


@dataclass(frozen=True)
class ModelEntry:
    """How to build one model.

    Attributes:
        name: registry name or import path.
        target: the class or callable, or its import path ``"package.module:Name"``, imported
            only when the model is built (the signature is read from the source until then).
        data_args: for ctrcal's own models: ``feature_map -> {arg: value}`` filling the
            constructor's data arguments (vocab sizes, ...); None for the user contract
            ``factory(feature_map, **kwargs)``.
        batch_input: ``forward(batch)`` (the user contract) instead of
            ``forward(categorical, numeric)``.
    """

    name: str
    target: Callable[..., nn.Module] | str
    data_args: Callable[[Any], dict[str, Any]] | None = None
    batch_input: bool = True

    @property
    def factory(self) -> Callable[..., nn.Module]:
        """The class or callable; an entry registered by import path imports it here."""
        if isinstance(self.target, str):
            return _import_path(self.target)
        return self.target

    def signature(self) -> tuple[inspect.Signature | None, dict[str, Any]]:
        """The constructor's signature and the types of its annotated parameters.

        An entry registered by import path whose module is not imported yet reads both from
        the source where the source allows (see
        :func:`~ctrcal.models.signature.read_source_signature`), and imports it otherwise.
        None: the callable has no signature Python can show.
        """
        if isinstance(self.target, str) and self.target.partition(":")[0] not in sys.modules:
            try:
                found = read_source_signature(self.target)
            except SourceSignatureError:
                pass  # stated in a way only running the module tells: import it
            else:
                return found.signature, found.hints
        factory = self.factory
        try:
            sig = inspect.signature(factory)
        except (TypeError, ValueError):
            return None, {}
        return sig, _type_hints(factory)

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The keyword arguments a config may set (data arguments excluded)."""
        sig, _ = self.signature()
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
        sig, _ = self.signature()
        return sig is None or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())

    def hints(self) -> dict[str, Any]:
        """Parameter name -> annotated type, where the annotation can be resolved."""
        return self.signature()[1]


def _type_hints(factory: Any) -> dict[str, Any]:
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


_REGISTRY: dict[str, ModelEntry] = {}


def normalize_model_name(name: str) -> str:
    """Canonical registry name: lower case without ``-``, ``_`` or spaces."""
    return "".join(ch for ch in name.strip().lower() if ch not in "-_ ")


def register_model(
    name: str,
    factory: Callable[..., nn.Module] | str | None = None,
    *,
    overwrite: bool = False,
    _data_args: Callable[[Any], dict[str, Any]] | None = None,
    _batch_input: bool = True,
) -> Any:
    """Register a model under ``name``; usable as a decorator.

    Args:
        name: the name configs use in ``model.name`` (case, ``-`` and ``_`` ignored).
        factory: a class (or callable) following the user-model contract:
            ``factory(feature_map, **kwargs)`` returns an ``nn.Module`` whose
            ``forward(batch)`` returns logits ``[B]``; or its import path
            ``"package.module:Name"``, imported only when a model is built (``ctrcal
            validate`` then reads its signature from the source, importing nothing).
        overwrite: allow replacing an existing registration.

    Returns:
        ``factory`` (or, without one, a decorator that registers and returns its argument).

    Raises:
        ValueError: the name is taken (and ``overwrite`` is False) or contains ``:``.
        ConfigError: ``factory`` is a class that is not an ``nn.Module``.
    """
    if factory is None:
        return functools.partial(
            register_model, name, overwrite=overwrite, _data_args=_data_args,
            _batch_input=_batch_input,
        )  # fmt: skip
    key = normalize_model_name(name)
    if not key or ":" in key:
        raise ValueError(f"model name {name!r} must be non-empty and contain no ':'")
    if isinstance(factory, str):
        module_name, _, attr = factory.partition(":")
        if not module_name or not attr:
            raise ValueError(f"model {name!r}: expected 'package.module:Name', got {factory!r}")
    else:
        _check_factory(factory, name)
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"model {key!r} is already registered (pass overwrite=True)")
    _REGISTRY[key] = ModelEntry(key, factory, _data_args, _batch_input)
    return factory


def available_models() -> list[str]:
    """Sorted names of every registered model."""
    return sorted(_REGISTRY)


def _check_factory(factory: Any, name: str) -> None:
    if inspect.isclass(factory):
        from torch import nn  # a model class: its module imported torch already

        if not issubclass(factory, nn.Module):
            raise ConfigError(
                f"model {name!r}: {factory.__module__}.{factory.__qualname__} is not a "
                "torch.nn.Module subclass (a model must be an nn.Module)"
            )
    elif not callable(factory):
        raise ConfigError(f"model {name!r}: {factory!r} is neither a class nor callable")


def resolve_model(spec: Any) -> ModelEntry:
    """The :class:`ModelEntry` for a name, an import path ``pkg.mod:Class``, or a class.

    Raises:
        ConfigError: unknown name (with the closest one), an import path that does not
            resolve, or something that is not an ``nn.Module`` class / factory.
    """
    if isinstance(spec, ModelEntry):
        return spec
    if not isinstance(spec, str):
        _check_factory(spec, getattr(spec, "__qualname__", repr(spec)))
        path = qualified_name(spec)
        for entry in _REGISTRY.values():
            if entry.target is spec or entry.target == path:
                return entry
        return ModelEntry(path, spec)
    if ":" in spec:
        for entry in _REGISTRY.values():  # a registered model named by its import path
            if entry.target == spec:
                return entry
        return ModelEntry(spec, _import_path(spec))
    key = normalize_model_name(spec)
    if key not in _REGISTRY:
        hint = closest(key, _REGISTRY)
        did = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError(
            f"unknown model {spec!r}{did} (valid: {', '.join(sorted(_REGISTRY))}, or an "
            "import path 'package.module:ClassName')"
        )
    return _REGISTRY[key]


def qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return repr(obj)


def _import_path(path: str) -> Any:
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
    _check_factory(obj, path)
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


def check_model_kwargs(spec: Any, kwargs: dict[str, Any], where: Callable[[str], str]) -> None:
    """Bind ``kwargs`` against the model's signature: unknown keys, missing ones, bad types.

    Args:
        spec: model name, import path or class.
        kwargs: the config's model arguments (norm specs already parsed).
        where: ``key -> "file: model.key"`` for messages.

    Raises:
        ConfigError: naming the file and key, the closest valid key and what was expected.
    """
    from ctrcal.config import check_value

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
        if key.endswith(NORM_SUFFIX):
            continue  # parsed and name-checked as a norm spec
        tp = hints.get(key)
        if tp is not None:
            check_value(tp, value, where(key))
    for name, p in params.items():
        if p.default is p.empty and name not in kwargs:
            raise ConfigError(f"{where(name)}: missing required argument of {entry.name!r}")


def norm_positions(spec: Any) -> list[str]:
    """The norm arguments (``*_norm``) of a model, plus ``net_norm`` for any model."""
    entry = resolve_model(spec)
    names = [n for n in entry.parameters() if n.endswith(NORM_SUFFIX)]
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
    register_model(_name, _path, _data_args=FEATURE_DATA_ARGS, _batch_input=False)

# building lives in ctrcal.models.build (it needs torch); these names stay importable here
_BUILD_NAMES = ("BatchInputModel", "check_model_output", "create_model")


def __getattr__(name: str) -> Any:
    if name in _BUILD_NAMES:
        return getattr(importlib.import_module("ctrcal.models.build"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
