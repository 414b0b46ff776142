"""Norm specs: names, what "no norm" means, and MC-LayerNorm's subset size.

The parts of the norm registry that a config holds before any layer is built (a leaf: it
imports neither torch nor the layers). :mod:`ctrcal.layers.registry` builds the layers; both
use the names defined here. Which arguments a norm takes, and which values it accepts at a
given width, is decided by the norm's own constructor alone (``ctrcal validate`` builds every
model on the ``meta`` device).

* :class:`NormSpec` is a norm by name plus its keyword arguments (what YAML holds);
  :func:`parse_norm_spec` reads one from a YAML value.
* :func:`is_no_norm` is the one answer to "is this position left without a norm?".
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from ctrcal.core.errors import ConfigError
from ctrcal.core.registry import normalize_name

__all__ = [
    "MC_BACKENDS",
    "NormSpec",
    "is_no_norm",
    "mc_subset_size",
    "parse_norm_spec",
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
    yaml_description: ClassVar[str] = "a norm name or {name: ..., <kwargs>}"

    def to_yaml(self) -> Any:
        return self.name if not self.kwargs else {"name": self.name, **self.kwargs}


def parse_norm_spec(value: Any) -> NormSpec:
    """A :class:`NormSpec` from a YAML value: a name, ``{name: ..., <kwargs>}``, or
    ``null``/``false`` (no norm).

    Raises:
        ValueError: anything else (the message says what a norm spec looks like).
    """
    if isinstance(value, NormSpec):
        return value
    if value is None or value is False:
        return NormSpec("none")
    if isinstance(value, str):
        return NormSpec(value)
    if isinstance(value, Mapping):
        if not isinstance(value.get("name"), str):
            raise ValueError("a norm mapping needs 'name: <norm>'")
        return NormSpec(value["name"], {k: v for k, v in value.items() if k != "name"})
    raise ValueError(f"expected a norm name or {{name: ..., <kwargs>}}, got {value!r}")


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


# MC-LayerNorm's execution backends (the layer resolves them)
MC_BACKENDS = ("auto", "c", "triton", "torch")
