"""Built-in normalization layers, listed by name in :mod:`ctrcal.layers.registry`.

Every layer takes the normalized width first (an int for the last dim, or a shape tuple for
several trailing dims):

=================  ===================================================================
``layernorm``      :class:`torch.nn.LayerNorm`
``mclayernorm``    :class:`ctrcal.layers.mc_layernorm.module.MCLayerNorm` (``fraction=0.8``)
``rmsnorm``        :class:`torch.nn.RMSNorm`
``batchnorm``      :class:`FeatureBatchNorm`: BatchNorm over the trailing (feature) dims
``nomorelization`` :class:`NoMorelization`: learnable scalars plus training-time noise
``groupnorm``      :class:`FeatureGroupNorm`: LayerNorm within groups of features
``contextnorm``    :class:`ctrcal.layers.context.ContextNorm`: learned statistics per
                   context (the value of a categorical ``field``)
``identity``       :class:`torch.nn.Identity` (alias ``none``)
=================  ===================================================================
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrcal.core.errors import ConfigError

__all__ = ["FeatureBatchNorm", "FeatureGroupNorm", "NoMorelization"]

_Width = int | Sequence[int] | torch.Size


def _shape(width: _Width) -> tuple[int, ...]:
    if isinstance(width, numbers.Integral):
        return (int(width),)
    return tuple(int(w) for w in width)


class FeatureBatchNorm(nn.BatchNorm1d):
    """BatchNorm over features: statistics per feature across all leading positions.

    The trailing ``width`` dims are the features (``prod(width)`` of them); every other
    position (batch, and e.g. fields) is a sample. So [B, N] behaves like ``nn.BatchNorm1d(N)``,
    and [B, F, D] with ``width=D`` normalizes each of the D channels over all B*F positions.
    The parameter and buffer names are BatchNorm1d's.

    Args:
        width: number of features, or the trailing shape they span.
        eps, momentum, affine, track_running_stats, device, dtype: as ``nn.BatchNorm1d``.

    Shape:
        input [..., *width] -> output of the same shape.
    """

    def __init__(
        self,
        width: _Width,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if momentum is not None and not (
            isinstance(momentum, numbers.Real)
            and not isinstance(momentum, bool)
            and 0.0 <= momentum <= 1.0
        ):
            raise ConfigError(f"momentum: expected null or a number in [0, 1], got {momentum!r}")
        self.feature_shape = _shape(width)
        super().__init__(
            math.prod(self.feature_shape),
            eps=eps,
            momentum=momentum,
            affine=affine,
            track_running_stats=track_running_stats,
            device=device,
            dtype=dtype,
        )

    def _check_input_dim(self, input: Tensor) -> None:  # called on the flattened [M, C] view
        if input.dim() != 2:
            raise ValueError(f"expected a 2-D view, got {input.dim()}-D")

    def forward(self, input: Tensor) -> Tensor:
        nd = len(self.feature_shape)
        if tuple(input.shape[input.dim() - nd :]) != self.feature_shape or input.dim() <= nd:
            raise ValueError(
                f"FeatureBatchNorm expects input [..., {', '.join(map(str, self.feature_shape))}]"
                f", got {list(input.shape)}"
            )
        flat = input.reshape(-1, self.num_features)
        return super().forward(flat).reshape(input.shape)


class NoMorelization(nn.Module):
    """NoMorelization: ``alpha * x + beta + gamma * noise`` with learnable scalars.

    A normalizer-free replacement (seed paper, eq. 15): a learnable scalar multiplier
    ``alpha`` and offset ``beta`` plus zero-mean Gaussian noise of fixed scale ``gamma``
    injected during training only (identity noise at evaluation).

    In the paper alpha and beta start at 0 because the layer sits on a residual branch. In a
    norm slot without a skip connection (e.g. MaskNet's) alpha = 0 would cut the signal, so
    ``alpha_init`` defaults to 1. The paper found LayerNorm backbones prefer small noise
    (1e-4, the default) and BatchNorm backbones larger (1e-1).

    Args:
        width: normalized width (accepted for the registry's signature; the layer has only
            scalar parameters).
        gamma: noise standard deviation at training time (>= 0).
        alpha_init: initial multiplier.
        beta_init: initial offset.
        generator: optional torch generator for the noise.

    Shape:
        input [..., *width] -> output of the same shape.
    """

    def __init__(
        self,
        width: _Width,
        gamma: float = 1e-4,
        alpha_init: float = 1.0,
        beta_init: float = 0.0,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(gamma, numbers.Real) or not gamma >= 0:
            raise ConfigError(f"NoMorelization gamma must be a number >= 0, got {gamma!r}")
        self.width = _shape(width)
        self.gamma = float(gamma)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.beta = nn.Parameter(torch.full((1,), float(beta_init)))
        self.generator = generator

    def forward(self, input: Tensor) -> Tensor:
        out = input * self.alpha + self.beta
        if self.training and self.gamma > 0:
            noise = torch.randn(
                out.shape, generator=self.generator, device=out.device, dtype=out.dtype
            )
            out = out + self.gamma * noise
        return out

    def extra_repr(self) -> str:
        return f"width={self.width}, gamma={self.gamma}"


class FeatureGroupNorm(nn.Module):
    """Group Normalization over features: each row's N features in G groups of N/G.

    Group Normalization (Wu and He 2018; seed 003, eq. 11-13) computes a mean and variance per
    sample *and* group of consecutive channels. On a CTR activation ``[..., N]`` the channels
    are the N features: ``num_groups=1`` is LayerNorm, ``num_groups=N`` normalizes each feature
    alone. Between the two, each group keeps its own scale, which a LayerNorm over all N would
    mix. The affine ``weight``/``bias`` are per feature, as LayerNorm's.

    Args:
        width: N (an int; the last dimension).
        num_groups: G; must divide N.
        eps: added to the group variance.
        elementwise_affine: learn a per-feature scale and shift.

    Shape:
        input ``[..., N]`` -> output of the same shape.
    """

    def __init__(
        self,
        width: _Width,
        num_groups: int = 2,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        shape = _shape(width)
        if len(shape) != 1:
            raise ConfigError(
                f"groupnorm normalizes the last dim: width must be an int, got {width}"
            )
        n = shape[0]
        if not isinstance(num_groups, int) or num_groups < 1 or n % num_groups:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise ConfigError(
                f"groupnorm: num_groups must divide the width {n}, got {num_groups!r} "
                f"(valid: {', '.join(map(str, divisors))})"
            )
        self.normalized_shape = (n,)
        self.num_groups = num_groups
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(n))
            self.bias = nn.Parameter(torch.zeros(n))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        n = self.normalized_shape[0]
        if input.shape[-1] != n:
            raise ValueError(f"FeatureGroupNorm({n}) got input {list(input.shape)}")
        # group_norm wants [M, C, *]: every leading position is a sample, the N features the C
        # channels; one fused kernel for statistics and affine.
        flat = input.reshape(-1, n)
        out = F.group_norm(flat, self.num_groups, self.weight, self.bias, self.eps)
        return out.reshape(input.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, num_groups={self.num_groups}, eps={self.eps}"


def _layernorm(
    width: _Width,
    eps: float = 1e-5,
    elementwise_affine: bool = True,
    bias: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps, elementwise_affine, bias, device=device, dtype=dtype)


def _rmsnorm(
    width: _Width,
    eps: float | None = None,
    elementwise_affine: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.RMSNorm:
    return nn.RMSNorm(width, eps, elementwise_affine, device=device, dtype=dtype)


def _identity(width: _Width) -> nn.Identity:
    return nn.Identity()
