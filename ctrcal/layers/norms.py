"""Built-in normalization layers, registered by name in :mod:`ctrcal.layers.registry`.

Every layer takes the normalized width first (an int for the last dim, or a shape tuple for
several trailing dims):

=================  ===================================================================
``layernorm``      :class:`torch.nn.LayerNorm`
``mclayernorm``    :class:`ctrcal.layers.mc_layernorm.MCLayerNorm` (``fraction=0.8``)
``rmsnorm``        :class:`torch.nn.RMSNorm`
``batchnorm``      :class:`FeatureBatchNorm`: BatchNorm over the trailing (feature) dims
``nomorelization`` :class:`NoMorelization`: learnable scalars plus training-time noise
``identity``       :class:`torch.nn.Identity` (alias ``none``)
=================  ===================================================================
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ctrcal.errors import ConfigError
from ctrcal.layers.mc_layernorm import MCLayerNorm
from ctrcal.layers.registry import register_norm

__all__ = ["FeatureBatchNorm", "NoMorelization"]

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


register_norm("layernorm", _layernorm)
register_norm("mclayernorm", MCLayerNorm)
register_norm("rmsnorm", _rmsnorm)
register_norm("batchnorm", FeatureBatchNorm)
register_norm("nomorelization", NoMorelization)
register_norm("identity", _identity, aliases=("none",))
