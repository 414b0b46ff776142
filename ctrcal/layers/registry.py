"""The one place norm names live: register, create and swap normalization layers by name.

Every norm factory takes the normalized width first (an int, or a shape tuple for norms over
several trailing dims), so a model calls ``norm_layer(width)`` whatever the norm is::

    create_norm("mclayernorm", 400, fraction=0.8)      # MCLayerNorm(400, fraction=0.8)
    create_norm(NormSpec("layernorm"), 400)              # nn.LayerNorm(400)
    create_norm("none", 400)                             # nn.Identity()
    create_norm(functools.partial(nn.LayerNorm, eps=1e-6), 400)
    replace_norms(model, "mclayernorm", fraction=0.8)    # every nn.LayerNorm -> MCLayerNorm

Names are read by the one rule of :mod:`ctrcal.core.registry` (case, ``-``, ``_``, spaces and
dots are ignored), so ``MC_LayerNorm``, ``mc-layernorm`` and ``mclayernorm`` are the same norm.

The built-in norms are listed below by import path (``_BUILTINS``) and imported when first
built: importing a module never registers anything. A user's norm is registered with
:func:`register_norm` (a factory, or the import path of one).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.core.registry import Registry, closest
from ctrcal.layers.kernels.fusion import is_layer_norm

__all__ = [
    "NORMS",
    "available_norms",
    "create_norm",
    "get_norm",
    "register_norm",
    "replace_norms",
]

NormFactory = Callable[..., nn.Module]
Width = int | Sequence[int] | torch.Size

# ctrcal's own norms: name -> the import path of a factory taking the width first
_BUILTINS = {
    "layernorm": "ctrcal.layers.norms:_layernorm",
    "mclayernorm": "ctrcal.layers.mc_layernorm.module:MCLayerNorm",
    "rmsnorm": "ctrcal.layers.norms:_rmsnorm",
    "batchnorm": "ctrcal.layers.norms:FeatureBatchNorm",
    "nomorelization": "ctrcal.layers.norms:NoMorelization",
    "groupnorm": "ctrcal.layers.norms:FeatureGroupNorm",
    "contextnorm": "ctrcal.layers.context:ContextNorm",
    "identity": "ctrcal.layers.norms:_identity",
}

NORMS: Registry[NormFactory] = Registry("norm", lazy=True)
"""Every norm by name: a factory ``factory(width, **kwargs) -> nn.Module``, or its import path."""
for _name, _path in _BUILTINS.items():
    NORMS.register(_name, _path, aliases=("none",) if _name == "identity" else ())
del _name, _path


def register_norm(
    name: str,
    factory: NormFactory | str | None = None,
    *,
    aliases: Sequence[str] = (),
    overwrite: bool = False,
) -> Any:
    """Register a norm factory under ``name`` (and ``aliases``); usable as a decorator.

    Args:
        name: the norm's name (any spelling: see :func:`~ctrcal.core.registry.normalize_name`).
        factory: a class or callable ``factory(width, **kwargs) -> nn.Module``, or its
            import path ``"package.module:Name"`` (imported when first built).
        aliases: further names for the same norm.
        overwrite: allow replacing an existing registration.

    Returns:
        ``factory`` (or, without one, a decorator that registers and returns its argument).

    Raises:
        ValueError: the name (or an alias) is taken and ``overwrite`` is False.
        TypeError: ``factory`` is neither callable nor an import path.
    """
    if factory is None:
        return functools.partial(register_norm, name, aliases=aliases, overwrite=overwrite)
    if not isinstance(factory, str) and not callable(factory):
        raise TypeError(f"norm factory for {name!r} must be callable, got {factory!r}")
    return NORMS.register(name, factory, aliases=aliases, overwrite=overwrite)


def available_norms() -> list[str]:
    """Sorted names of all registered norms (aliases such as ``none`` excluded)."""
    return NORMS.available()


def get_norm(name: str) -> NormFactory:
    """The factory registered under ``name`` (or one of its aliases).

    Raises:
        ConfigError (a ValueError): unknown name; the message lists every valid name.
    """
    return NORMS.get(name)


def _check_kwargs(label: str, factory: NormFactory, kwargs: dict[str, Any]) -> None:
    """Name the bad keyword and the valid ones instead of a bare TypeError from deep inside."""
    if not kwargs:
        return
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        hint = closest(unknown[0], accepted)
        did = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError(
            f"norm {label}: unknown argument {unknown[0]!r}{did} "
            f"(valid: {', '.join(accepted) or 'none'})"
        )


def create_norm(spec: Any, width: Width, **kwargs: Any) -> nn.Module:
    """Build a norm layer over ``width`` features from a spec.

    Args:
        spec: a registered name (``"layernorm"``, ``"MC_LayerNorm"``, ``"none"``, ...), a
            :class:`~ctrcal.core.norm_spec.NormSpec` or a mapping ``{"name": ..., **kwargs}``
            (name + kwargs), a class or callable taking the
            width first (``functools.partial`` included), or None (no normalization).
        width: normalized width N, or a shape tuple for norms over several trailing dims.
        **kwargs: the layer's own keyword arguments (override a NormSpec's kwargs).

    Returns:
        A new ``nn.Module`` (``nn.Identity`` for ``"none"``/``"identity"``/None).

    Raises:
        ConfigError (a ValueError): unknown name (listing all names) or unknown argument.
    """
    if spec is None or spec is False:
        return nn.Identity()
    if isinstance(spec, nn.Module):
        raise TypeError(
            f"create_norm needs a norm name, class or factory, not a module instance ({spec!r})"
        )
    if not isinstance(spec, (str, Mapping, NormSpec)) and not callable(spec):
        raise TypeError(f"unsupported norm spec {spec!r} (a name, NormSpec, class or callable)")
    factory, arguments, label = NORMS.parse_spec(spec)
    kwargs = {**arguments, **kwargs}
    _check_kwargs(repr(label) if not callable(spec) else label, factory, kwargs)
    return factory(_width_arg(width), **kwargs)


def _width_arg(width: Width) -> Width:
    if isinstance(width, (int, torch.SymInt)) and not isinstance(width, bool):
        return int(width)
    shape = tuple(int(w) for w in width)
    return shape[0] if len(shape) == 1 else shape


def _module_width(module: nn.Module) -> Width:
    for attr in ("normalized_shape", "num_features", "width"):
        value = getattr(module, attr, None)
        if value is not None:
            return _width_arg(value)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return _width_arg(weight.shape)
    raise ValueError(
        f"cannot tell the normalized width of {type(module).__name__}; "
        "it has no normalized_shape, num_features or weight"
    )


def _inherited_kwargs(old: nn.Module, factory: NormFactory) -> dict[str, Any]:
    """eps / elementwise_affine / bias of the old layer, where the new factory takes them."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    out: dict[str, Any] = {}
    eps = getattr(old, "eps", None)
    if "eps" in params and isinstance(eps, float):
        out["eps"] = eps
    affine = getattr(old, "elementwise_affine", None)
    if "elementwise_affine" in params and isinstance(affine, bool):
        out["elementwise_affine"] = affine
    if "bias" in params and isinstance(affine, bool):
        out["bias"] = getattr(old, "bias", None) is not None
    return out


def replace_norms(
    model: nn.Module,
    spec: Any,
    *,
    target: type | tuple[type, ...] | None = None,
    copy_params: bool = True,
    **kwargs: Any,
) -> int:
    """Swap norm layers anywhere in ``model`` (in place) for ``spec``; return how many.

    This is how MC-LayerNorm is deployed on an existing model: take a trained LayerNorm
    model, swap, fine-tune. Works on any module tree (``nn.TransformerEncoder``, timm, ...).

    Args:
        model: the module tree to edit in place (the root itself is never replaced).
        spec: what to put in, as for :func:`create_norm` (name, NormSpec, class, partial).
        target: which modules to replace: by default exactly ``nn.LayerNorm`` (subclasses
            with their own forward, e.g. channel-first LayerNorm2d, are left alone); a type or
            tuple of types replaces every instance of them.
        copy_params: keep the old layer's ``weight``/``bias`` where both layers have them with
            the same shape: the same ``Parameter`` objects, so an optimizer built before the
            swap keeps updating them (a reshaped one is copied into the new layer's own). The
            new layer inherits eps / elementwise_affine / bias settings.
        **kwargs: the new layer's own arguments (e.g. ``fraction=0.8``).

    Returns:
        Number of distinct modules replaced (a module shared by several parents counts once
        and stays shared).
    """
    factory, arguments, _ = NORMS.parse_spec(spec)
    kwargs = {**arguments, **kwargs}

    def matches(module: nn.Module) -> bool:
        if target is None:
            return is_layer_norm(module)
        return isinstance(module, target)

    replaced: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child is None or not matches(child):
                continue
            new = replaced.get(id(child))
            if new is None:
                new = _build_replacement(child, spec, factory, copy_params, kwargs)
                replaced[id(child)] = new
            setattr(parent, name, new)
    return len(replaced)


def _build_replacement(
    old: nn.Module, spec: Any, factory: Any, copy_params: bool, kwargs: dict[str, Any]
) -> nn.Module:
    inherited = _inherited_kwargs(old, factory) if copy_params and callable(factory) else {}
    new = create_norm(spec, _module_width(old), **{**inherited, **kwargs})
    ref = next(iter(old.parameters(recurse=False)), None)
    if ref is None:
        ref = next(iter(old.buffers(recurse=False)), None)
    if ref is not None:
        new = new.to(device=ref.device)
        if ref.is_floating_point():
            new = new.to(dtype=ref.dtype)
    if copy_params:
        with torch.no_grad():
            for pname in ("weight", "bias"):
                src = getattr(old, pname, None)
                dst = getattr(new, pname, None)
                if (
                    isinstance(src, nn.Parameter)
                    and isinstance(dst, nn.Parameter)
                    and src.shape == dst.shape
                ):
                    # the same Parameter object: an optimizer built before the swap (FuxiCTR
                    # builds it in the model's constructor) keeps training it
                    setattr(new, pname, src)
                elif (
                    isinstance(src, torch.Tensor)
                    and isinstance(dst, torch.Tensor)
                    and src.shape == dst.shape
                ):
                    dst.copy_(src)
                elif (
                    isinstance(src, torch.Tensor)
                    and isinstance(dst, torch.Tensor)
                    and math.prod(src.shape) == math.prod(dst.shape)
                ):
                    dst.copy_(src.reshape(dst.shape))
    new.train(old.training)
    return new
