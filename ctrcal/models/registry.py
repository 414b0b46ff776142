"""The one place model names live: register, resolve, check and build CTR models.

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
in :class:`BatchInputModel`, which builds the batch. Norm positions: a constructor argument
named ``*_norm`` takes a norm spec (name, ``{name: ..., kwargs}``, class); a user model
without a ``net_norm`` argument still accepts ``net_norm`` (every ``nn.LayerNorm`` in it is
replaced with it through :func:`~ctrcal.layers.registry.replace_norms`), which is how a report
variant's norm reaches a foreign model.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ctrcal.errors import ConfigError
from ctrcal.utils import closest

__all__ = [
    "BatchInputModel",
    "ModelEntry",
    "available_models",
    "check_model_output",
    "create_model",
    "model_defaults",
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
        factory: the class or callable.
        data_args: for ctrcal's own models: ``feature_map -> {arg: value}`` filling the
            constructor's data arguments (vocab sizes, ...); None for the user contract
            ``factory(feature_map, **kwargs)``.
        batch_input: ``forward(batch)`` (the user contract) instead of
            ``forward(categorical, numeric)``.
    """

    name: str
    factory: Callable[..., nn.Module]
    data_args: Callable[[Any], dict[str, Any]] | None = None
    batch_input: bool = True

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The keyword arguments a config may set (data arguments excluded)."""
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return {}
        params = list(sig.parameters.values())
        if self.data_args is None:
            params = params[1:]  # feature_map
        else:
            data = set(self.data_args(_EmptyFeatureMap()))
            params = [p for p in params if p.name not in data]
        return {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def accepts_any(self) -> bool:
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return True
        return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


class _EmptyFeatureMap:
    vocab_sizes: list[int] = []
    numeric_fields: list[str] = []
    categorical_fields: list[str] = []
    bucket_boundaries = None


_REGISTRY: dict[str, ModelEntry] = {}
_BUILTINS_LOADED = False


def normalize_model_name(name: str) -> str:
    """Canonical registry name: lower case without ``-``, ``_`` or spaces."""
    return "".join(ch for ch in name.strip().lower() if ch not in "-_ ")


def _ensure_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from ctrcal.models import dcnv2, dnn, masknet  # noqa: F401 - they register themselves


def register_model(
    name: str,
    factory: Callable[..., nn.Module] | None = None,
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
            ``forward(batch)`` returns logits ``[B]``.
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
    _check_factory(factory, name)
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"model {key!r} is already registered (pass overwrite=True)")
    _REGISTRY[key] = ModelEntry(key, factory, _data_args, _batch_input)
    return factory


def available_models() -> list[str]:
    """Sorted names of every registered model."""
    _ensure_builtins()
    return sorted(_REGISTRY)


def _check_factory(factory: Any, name: str) -> None:
    if inspect.isclass(factory):
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
        for entry in _REGISTRY.values():
            if entry.factory is spec:
                return entry
        return ModelEntry(qualified_name(spec), spec)
    if ":" in spec:
        return ModelEntry(spec, _import_path(spec))
    _ensure_builtins()
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


def _annotations(entry: ModelEntry) -> dict[str, Any]:
    target = entry.factory.__init__ if inspect.isclass(entry.factory) else entry.factory
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolvable string annotations: skip type checks, keep name checks
        return {}


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
    hints = _annotations(entry)
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


# ---------------------------------------------------------------------------------------------
# Building


class BatchInputModel(nn.Module):
    """Calls a ``forward(batch)`` model as ``model(categorical, numeric)``.

    The wrapped model is ``self.model``; the batch it gets is a
    :class:`~ctrcal.data.loader.Batch` with ``label=None``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        from ctrcal.data.loader import Batch

        return self.model(Batch(categorical, numeric, None))  # type: ignore[arg-type]


def create_model(
    spec: Any,
    feature_map: Any,
    *,
    check: bool = True,
    **kwargs: Any,
) -> nn.Module:
    """Build a model for ``feature_map``: ``model(categorical, numeric) -> logits [B]``.

    Args:
        spec: a :class:`~ctrcal.config.ModelConfig`, a registered name, an import path
            ``pkg.mod:Class``, or a class / factory following the user-model contract.
        feature_map: the data's :class:`~ctrcal.data.features.FeatureMap`.
        check: run the contract check (one forward pass on two rows, see
            :func:`check_model_output`).
        **kwargs: the model's keyword arguments (override a ModelConfig's).

    Returns:
        The model (a user model wrapped in :class:`BatchInputModel`), on the CPU, with every
        context norm bound to its field (:func:`~ctrcal.layers.context.bind_contexts`).

    Raises:
        ConfigError: unknown model, bad arguments, or a model that breaks the contract.
    """
    from ctrcal.config import ModelConfig, NormSpec
    from ctrcal.layers.context import bind_contexts
    from ctrcal.layers.registry import replace_norms

    if isinstance(spec, ModelConfig):
        kwargs = {**spec.kwargs, **kwargs}
        spec = spec.name
    entry = resolve_model(spec)
    params = entry.parameters()
    replace = None
    if "net_norm" in kwargs and "net_norm" not in params and not entry.accepts_any():
        replace = kwargs.pop("net_norm")
    label = f"model: {entry.name}"
    try:
        if entry.data_args is not None:
            model = entry.factory(**entry.data_args(feature_map), **kwargs)
        else:
            model = entry.factory(feature_map, **kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{label}: constructing it returned a {type(model).__name__}, not a torch.nn.Module"
        )
    if replace is not None:
        if isinstance(replace, (str, dict)):
            replace = NormSpec(replace) if isinstance(replace, str) else _norm_from_dict(replace)
        keep = isinstance(replace, NormSpec) and (
            replace.name.lower() == "layernorm" and not replace.kwargs
        )
        if not keep and replace_norms(model, replace) == 0:
            shown = replace.name if isinstance(replace, NormSpec) else replace
            raise ConfigError(
                f"{label}: net_norm {shown!r} was given but the model has no nn.LayerNorm to "
                "replace (and no net_norm argument)"
            )
    if entry.batch_input:
        model = BatchInputModel(model)
    bind_contexts(model, getattr(feature_map, "categorical_fields", None))
    if check:
        check_model_output(model, feature_map, label)
    return model


def _norm_from_dict(value: dict[str, Any]) -> Any:
    from ctrcal.config import NormSpec

    return NormSpec(value["name"], {k: v for k, v in value.items() if k != "name"})


def _probe_inputs(feature_map: Any, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    fc = len(getattr(feature_map, "vocab_sizes", []))
    fn = len(getattr(feature_map, "numeric_fields", []))
    categorical = torch.zeros(rows, fc, dtype=torch.int64)
    numeric = torch.zeros(rows, fn, dtype=torch.float32)
    if fn:
        numeric[1] = 1.0
    return categorical, numeric


def check_model_output(model: nn.Module, feature_map: Any, label: str = "model") -> None:
    """One evaluation-mode forward pass on two rows: logits must be a float tensor ``[2]``.

    Runs without gradients, with the RNG state restored afterwards (the probe changes nothing
    a training run would compute) and the module's training flag restored.

    Raises:
        ConfigError: the forward pass fails or returns the wrong type, shape or dtype.
    """
    categorical, numeric = _probe_inputs(feature_map)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = model(categorical.to(device), numeric.to(device))
    except ConfigError:
        raise
    except Exception as exc:  # the user's forward: report it as a contract failure
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{label}: forward on a 2-row probe batch failed ({type(exc).__name__}: {first}); "
            "a model's forward(batch) must accept batch.categorical int64 [B, Fc] and "
            "batch.numeric float32 [B, Fn]"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"{label}: forward returned a {type(out).__name__}; expected a tensor of logits [B]"
        )
    if tuple(out.shape) != (2,):
        raise ConfigError(
            f"{label}: forward returned shape {list(out.shape)} for a batch of 2 rows; "
            "expected logits of shape [B] = [2] (squeeze a trailing 1)"
        )
    if not out.is_floating_point():
        raise ConfigError(
            f"{label}: forward returned dtype {out.dtype}; expected floating-point logits"
        )


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
