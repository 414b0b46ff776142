"""Gaussian numeric shift: the covariate shift of the MC-LayerNorm paper's Criteo experiment.

Every numeric feature j of a shifted row gets independent Gaussian noise with standard
deviation ``intensity · std_j``, where ``std_j`` is the feature's train-split standard deviation
in model-input space (``FeatureMap.numeric_std``), so intensity 0.25 means "a quarter of a
standard deviation" whatever the feature's scale::

    x'_ij = x_ij + ε_ij,   ε_ij ~ N(0, (s · std_j)²)

Missing values (NaN) stay missing: the shift perturbs values, it does not invent them.

The paper's intensities are :data:`PAPER_INTENSITIES` (6.25 %, 12.5 %, 25 %, 50 %). With
``mix_fraction < 1`` only that fraction of the rows of each batch is shifted (the paper's
"Mix" scenario); :meth:`GaussianShift.apply` returns the row mask so metrics can be computed
on the shifted rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["PAPER_INTENSITIES", "GaussianShift"]

PAPER_INTENSITIES: tuple[float, ...] = (0.0625, 0.125, 0.25, 0.5)


class GaussianShift:
    """Add N(0, (intensity · std_j)²) to numeric feature j, deterministically by seed.

    The random stream lives in a ``torch.Generator`` on the device of the tensors it shifts,
    created on first use from ``seed``: calling the shift on the batches of a split in a fixed
    order reproduces the same noise every time (and for every model shifted with the same
    seed, so comparisons between models are paired on the noise, too). :meth:`reset` restarts
    the stream. Per batch the stream draws the row selection first and then a full
    ``[B, F]`` standard-normal matrix whatever the intensity, so two shifts with the same seed
    and different intensities use proportional noise on the same rows.

    Args:
        std: [F] per-feature standard deviations (finite, ≥ 0) in model-input space.
        intensity: noise scale s in units of ``std`` (0 = clean).
        seed: seed of the noise stream; ``None`` draws a fresh one.
        mix_fraction: fraction of the rows of each batch to shift, in [0, 1];
            ``round(mix_fraction · B)`` rows chosen uniformly at random.

    Example::

        shift = GaussianShift(feature_map.numeric_std, intensity=0.25, seed=0)
        shifted = shift(batch.numeric)              # [B, F], batch.numeric untouched
        shifted, rows = shift.apply(batch.numeric)  # rows: bool [B], True = shifted
    """

    def __init__(
        self,
        std: Sequence[float] | torch.Tensor | Any,
        intensity: float,
        seed: int | None = None,
        mix_fraction: float = 1.0,
    ) -> None:
        std_t = torch.as_tensor(std, dtype=torch.float32).detach().to("cpu").reshape(-1)
        if not bool(torch.isfinite(std_t).all()) or bool((std_t < 0).any()):
            raise ValueError(f"std must be finite and non-negative, got {std_t.tolist()}")
        intensity = float(intensity)
        if not math.isfinite(intensity) or intensity < 0:
            raise ValueError(f"intensity must be a finite number >= 0, got {intensity}")
        mix_fraction = float(mix_fraction)
        if not 0.0 <= mix_fraction <= 1.0:
            raise ValueError(f"mix_fraction must lie in [0, 1], got {mix_fraction}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.std = std_t
        self.intensity = intensity
        self.seed = seed
        self.mix_fraction = mix_fraction
        self._generators: dict[torch.device, torch.Generator] = {}
        self._scales: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    @classmethod
    def from_feature_map(
        cls, feature_map: Any, intensity: float, seed: int | None = None, mix_fraction: float = 1.0
    ) -> GaussianShift:
        """A shift using ``feature_map.numeric_std`` (the train-split stds)."""
        return cls(feature_map.numeric_std, intensity, seed=seed, mix_fraction=mix_fraction)

    def __repr__(self) -> str:
        return (
            f"GaussianShift(features={self.std.numel()}, intensity={self.intensity}, "
            f"seed={self.seed}, mix_fraction={self.mix_fraction})"
        )

    def reset(self) -> GaussianShift:
        """Restart the noise stream from ``seed``."""
        self._generators.clear()
        return self

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self.seed is None:
                gen.seed()
            else:
                gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen

    def _scale(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (device, dtype)
        if key not in self._scales:
            self._scales[key] = (self.std * self.intensity).to(device=device, dtype=dtype)
        return self._scales[key]

    def apply(self, numeric: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shift a batch and say which rows were shifted.

        Args:
            numeric: float [B, F] numeric features (NaN = missing); not modified.

        Returns:
            ``(shifted [B, F], rows bool [B])``: a new tensor, and True for shifted rows
            (all rows when ``mix_fraction`` is 1).
        """
        if not isinstance(numeric, torch.Tensor) or not numeric.is_floating_point():
            raise TypeError("numeric must be a floating-point torch.Tensor [B, F]")
        if numeric.dim() != 2 or numeric.shape[1] != self.std.numel():
            raise ValueError(
                f"numeric must have shape [B, {self.std.numel()}], got {tuple(numeric.shape)}"
            )
        device = numeric.device
        gen = self._generator(device)
        rows = numeric.shape[0]
        if self.mix_fraction >= 1.0:
            mask = torch.ones(rows, dtype=torch.bool, device=device)
        else:
            k = int(round(self.mix_fraction * rows))
            chosen = torch.randperm(rows, generator=gen, device=device)[:k]
            mask = torch.zeros(rows, dtype=torch.bool, device=device)
            mask[chosen] = True
        noise = torch.randn(numeric.shape, generator=gen, device=device, dtype=torch.float32)
        noise = noise.to(numeric.dtype) * self._scale(device, numeric.dtype)
        if self.mix_fraction < 1.0:
            noise = noise * mask.unsqueeze(1).to(numeric.dtype)
        # NaN + noise is NaN: missing values stay missing without a separate mask
        return numeric + noise, mask

    def __call__(self, numeric: torch.Tensor) -> torch.Tensor:
        """The shifted copy of ``numeric`` [B, F] (see :meth:`apply`)."""
        return self.apply(numeric)[0]
