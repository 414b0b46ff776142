"""Norm specs without torch: names, what "no norm" means, and argument checks without data.

This module is the part of the norm registry a config needs before anything runs: it imports
neither torch nor the layers themselves, so ``ctrcal validate`` checks a config in a fraction
of a second. :mod:`ctrcal.layers.registry` builds the layers; both use the names defined here.

* :class:`NormSpec` is a norm by name plus its keyword arguments (what YAML holds).
* :func:`normalize_name` is the one rule by which two spellings name the same norm.
* :func:`is_no_norm` is the one answer to "is this position left without a norm?".
* :func:`declare_norm_args` states, per norm, the keyword arguments a config may give and a
  check of their values at a given width; :func:`check_norm_spec` runs it. Every registered
  norm has a declaration (a test compares them with the factories' signatures), so a typo such
  as ``fracton`` or an MC-LayerNorm ``fraction * N < 2`` is found by ``ctrcal validate``.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ctrcal.errors import ConfigError
from ctrcal.utils import closest

__all__ = [
    "NormArgs",
    "NormSpec",
    "check_norm_spec",
    "declare_norm_args",
    "declared_norms",
    "is_no_norm",
    "mc_subset_size",
    "normalize_name",
]


@dataclass(frozen=True)
class NormSpec:
    """A normalization layer by registry name plus constructor keyword arguments.

    In YAML either a bare name (``net_norm: layernorm``) or a mapping with ``name`` and the
    layer's own keyword arguments (``net_norm: {name: mclayernorm, fraction: 0.8}``).
    ``none`` (or ``identity``) means no normalization at that position.
    """

    name: str = "none"
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_none(self) -> bool:
        return is_no_norm(self)

    def to_yaml(self) -> Any:
        return self.name if not self.kwargs else {"name": self.name, **self.kwargs}


def normalize_name(name: str) -> str:
    """Canonical form of a norm name: lower case without ``-``, ``_``, spaces or dots."""
    if not isinstance(name, str):
        raise TypeError(f"a norm name must be a string, got {type(name).__name__}")
    return "".join(ch for ch in name.strip().lower() if ch not in "-_ .")


# the registry's canonical name of "no normalization" and its alias
_NO_NORM = frozenset({"identity", "none"})


def is_no_norm(spec: Any) -> bool:
    """Whether ``spec`` leaves its position without normalization.

    True for None/False, the names ``none`` and ``identity`` in any spelling (``Identity``,
    ``NONE``), a :class:`NormSpec` or a mapping (``{name: none}``) of those, and
    ``torch.nn.Identity`` (class or instance).
    """
    if spec is None or spec is False:
        return True
    if isinstance(spec, NormSpec):
        spec = spec.name
    elif isinstance(spec, Mapping):
        spec = spec.get("name")
        if spec is None:
            return False
    if isinstance(spec, str):
        return normalize_name(spec) in _NO_NORM
    torch = sys.modules.get("torch")  # a class or module can only be torch's if torch is loaded
    if torch is not None:
        identity = torch.nn.Identity
        return spec is identity or isinstance(spec, identity)
    return False


# ---------------------------------------------------------------------------------------------
# MC-LayerNorm's subset size: pure arithmetic, needed by the layer and by config checks alike

# |f*N - round(f*N)| at or below this counts as the integer: a float fraction is the nearest
# binary number to what the user wrote (0.3 is stored as 0.29999999999999998889...), and the
# product's representation error is ~N * 2**-53, far below this for any realistic N.
_INTEGER_TOLERANCE = Fraction(1, 10**9)


def mc_subset_size(n: int, fraction: float | Fraction) -> int:
    """Subset size ``k = max(2, floor(fraction * n))`` in exact rational arithmetic.

    The float ``fraction`` is converted to its exact rational value; a product within 1e-9 of
    an integer is taken as that integer, so ``fraction=0.3, n=10`` gives 3 and
    ``fraction=0.29, n=100`` gives 29 (naive float code gives 2 and 28).

    Args:
        n: number of normalized elements N (>= 2).
        fraction: the paper's f, ``0 < f <= 1``.

    Raises:
        ConfigError (a ValueError): f outside (0, 1], or f * N < 2 (fewer than two features
            would make the subset variance meaningless).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (numbers.Real, Fraction)):
        raise ConfigError(f"MC-LayerNorm fraction must be a number in (0, 1], got {fraction!r}")
    if isinstance(fraction, float) and not math.isfinite(fraction):
        raise ConfigError(f"MC-LayerNorm fraction must be in (0, 1], got {fraction!r}")
    f = Fraction(fraction)
    if not 0 < f <= 1:
        raise ConfigError(f"MC-LayerNorm fraction must be in (0, 1], got {fraction!r}")
    product = f * int(n)
    nearest = round(product)
    k = nearest if abs(product - nearest) <= _INTEGER_TOLERANCE else math.floor(product)
    if k < 2:
        raise ConfigError(
            f"MC-LayerNorm needs fraction * N >= 2, got fraction={fraction!r} with N={n} "
            f"(f*N={float(product):.6g}); use a larger fraction or a wider layer"
        )
    return max(2, k)


# ---------------------------------------------------------------------------------------------
# Declared arguments per norm

# check(kwargs, width) -> None, raising ConfigError (a ValueError) with what is wrong
ValueCheck = Callable[[Mapping[str, Any], int | None], None]


@dataclass(frozen=True)
class NormArgs:
    """The keyword arguments a config may give a norm, and a check of their values.

    Attributes:
        params: argument name -> default (the defaults document; they are not applied here).
        check: ``check(kwargs, width)`` raises a ``ValueError`` naming the bad argument;
            ``width`` is None where the width is not known without data.
    """

    params: Mapping[str, Any]
    check: ValueCheck | None = None


_DECLARED: dict[str, NormArgs] = {}


def declare_norm_args(
    name: str, params: Mapping[str, Any], check: ValueCheck | None = None
) -> None:
    """Declare the config-settable arguments of norm ``name`` (torch-free; see module doc).

    A norm registered in :mod:`ctrcal.layers.registry` without a declaration is checked from
    its factory's signature, which needs torch (so only once the registry is loaded).
    """
    _DECLARED[normalize_name(name)] = NormArgs(dict(params), check)


def declared_norms() -> dict[str, NormArgs]:
    """Canonical norm name -> its declaration."""
    return dict(_DECLARED)


def _number(kwargs: Mapping[str, Any], key: str, *, low: float, strict: bool = True) -> None:
    if key not in kwargs or kwargs[key] is None:
        return
    value = kwargs[key]
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if strict else value < low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ConfigError(f"{key}: expected a finite number {bound}, got {value!r}")


def _flags(kwargs: Mapping[str, Any], *keys: str) -> None:
    for key in keys:
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise ConfigError(f"{key}: expected true/false, got {kwargs[key]!r}")


def _check_layernorm(kwargs: Mapping[str, Any], width: int | None) -> None:
    _number(kwargs, "eps", low=0.0)
    _flags(kwargs, "elementwise_affine", "bias")


def _check_mclayernorm(kwargs: Mapping[str, Any], width: int | None) -> None:
    _check_layernorm(kwargs, width)
    fraction = kwargs.get("fraction", 0.8)
    try:
        # without a width only the domain (0, 1] is checkable: any f passes at a huge N
        mc_subset_size(width if width is not None else 10**9, fraction)
    except ConfigError as exc:
        raise ConfigError(f"fraction: {exc}") from None
    backend = kwargs.get("backend")
    if backend is not None and (
        not isinstance(backend, str) or backend.strip().lower() not in MC_BACKENDS
    ):
        raise ConfigError(f"backend: expected one of {', '.join(MC_BACKENDS)}, got {backend!r}")


def _check_batchnorm(kwargs: Mapping[str, Any], width: int | None) -> None:
    _number(kwargs, "eps", low=0.0)
    _flags(kwargs, "affine", "track_running_stats")
    momentum = kwargs.get("momentum")
    if momentum is not None and not (
        isinstance(momentum, numbers.Real) and not isinstance(momentum, bool)
        and 0.0 <= momentum <= 1.0
    ):  # fmt: skip
        raise ConfigError(f"momentum: expected null or a number in [0, 1], got {momentum!r}")


def _check_nomorelization(kwargs: Mapping[str, Any], width: int | None) -> None:
    _number(kwargs, "gamma", low=0.0, strict=False)
    for key in ("alpha_init", "beta_init"):
        _number(kwargs, key, low=-math.inf)


def _check_groupnorm(kwargs: Mapping[str, Any], width: int | None) -> None:
    _number(kwargs, "eps", low=0.0)
    _flags(kwargs, "elementwise_affine")
    groups = kwargs.get("num_groups", 2)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"num_groups: expected an integer >= 1, got {groups!r}")
    if width is not None and width % groups:
        divisors = [d for d in range(1, width + 1) if width % d == 0]
        raise ConfigError(
            f"num_groups: {groups} does not divide the width {width} "
            f"(valid: {', '.join(map(str, divisors))})"
        )


def _check_contextnorm(kwargs: Mapping[str, Any], width: int | None) -> None:
    _number(kwargs, "eps", low=0.0)
    _flags(kwargs, "elementwise_affine")
    field_ = kwargs.get("field")
    if field_ is None:
        raise ConfigError("field: required, the categorical field whose value is the context")
    if isinstance(field_, bool) or not isinstance(field_, (str, int)) or field_ == "":
        raise ConfigError(f"field: expected a categorical field name, got {field_!r}")
    for key in ("num_contexts", "context_dim"):
        value = kwargs.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}: expected an integer >= 1, got {value!r}")


# MC-LayerNorm's execution backends (the layer resolves them; listed here for config checks)
MC_BACKENDS = ("auto", "c", "triton", "torch")

declare_norm_args(
    "layernorm", {"eps": 1e-5, "elementwise_affine": True, "bias": True}, _check_layernorm
)
declare_norm_args(
    "mclayernorm",
    {"eps": 1e-5, "elementwise_affine": True, "bias": True, "fraction": 0.8, "backend": None},
    _check_mclayernorm,
)
declare_norm_args("rmsnorm", {"eps": None, "elementwise_affine": True}, _check_layernorm)
declare_norm_args(
    "batchnorm",
    {"eps": 1e-5, "momentum": 0.1, "affine": True, "track_running_stats": True},
    _check_batchnorm,
)
declare_norm_args(
    "nomorelization", {"gamma": 1e-4, "alpha_init": 1.0, "beta_init": 0.0}, _check_nomorelization
)
declare_norm_args(
    "groupnorm", {"num_groups": 2, "eps": 1e-5, "elementwise_affine": True}, _check_groupnorm
)
declare_norm_args(
    "contextnorm",
    {"field": None, "num_contexts": 32, "context_dim": 8, "eps": 1e-5, "elementwise_affine": True},
    _check_contextnorm,
)
declare_norm_args("identity", {})


def _registry_args(key: str) -> NormArgs | None:
    """Arguments of a norm registered at run time (from its factory's signature)."""
    registry = sys.modules.get("ctrcal.layers.registry")
    if registry is None:
        return None
    import inspect

    try:
        factory = registry.get_norm(key)
    except ValueError:
        return None
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None  # takes anything: nothing to check here
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return NormArgs({p.name: p.default for p in params[1:] if p.kind in kinds})


def known_norm_names() -> list[str]:
    """Every norm name a config may use without torch (plus any registered at run time)."""
    names = set(_DECLARED) | {"none"}
    registry = sys.modules.get("ctrcal.layers.registry")
    if registry is not None:
        names |= set(registry.available_norms())
    return sorted(names)


def check_norm_spec(spec: NormSpec | None, width: int | None = None) -> None:
    """Check a norm spec without building it: its name, argument names and values.

    Args:
        spec: the spec (None: no norm, always fine).
        width: the normalized width N at this position, where known (MC-LayerNorm's
            ``fraction * N >= 2`` needs it).

    Raises:
        ConfigError: the name is unknown, an argument is unknown (with the closest valid one)
            or has a bad value; the message does not name the config key, the caller adds it.
    """
    if spec is None:
        return
    key = normalize_name(spec.name)
    if key == "none":
        key = "identity"
    args = _DECLARED.get(key) or _registry_args(key)
    if args is None:
        known = known_norm_names()
        if key in known or "ctrcal.layers.registry" in sys.modules and _is_registered(key):
            return  # a run-time norm taking **kwargs: nothing checkable here
        hint = closest(spec.name, known)
        did = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError(f"unknown norm {spec.name!r}{did} (valid: {', '.join(known)})")
    unknown = [k for k in spec.kwargs if k not in args.params]
    if unknown:
        hint = closest(unknown[0], list(args.params))
        did = f"; did you mean {hint!r}?" if hint else ""
        valid = ", ".join(args.params) or "none"
        raise ConfigError(
            f"norm {key!r}: unknown argument {unknown[0]!r}{did} (valid: {valid})"
        )
    if args.check is not None:
        try:
            args.check(spec.kwargs, width)
        except ConfigError as exc:
            where = f" at width {width}" if width is not None else ""
            raise ConfigError(f"norm {key!r}{where}: {exc}") from None


def _is_registered(key: str) -> bool:
    try:
        sys.modules["ctrcal.layers.registry"].get_norm(key)
    except ValueError:
        return False
    return True
