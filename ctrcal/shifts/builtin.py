"""Shift implementations: Gaussian numeric noise, categorical corruption, the temporal split.

The registry (names, intensity domains, defaults) is :mod:`ctrcal.shifts.registry`;
this module holds the tensors. :class:`GaussianShift` is the primitive on a numeric tensor:
every numeric feature j of a shifted row gets independent Gaussian noise with standard
deviation ``intensity · std_j``::

    x'_ij = x_ij + ε_ij,   ε_ij ~ N(0, (s · std_j)²)

:class:`GaussianNumericShift` applies it to a :class:`~ctrcal.core.batch.Batch` either in
model-input space (σ_j = ``FeatureMap.numeric_std``, the std of the transformed feature, 1 for
a standardised one) or in *original* space, the paper's "units of the standard deviation of
the original feature values": the batch's model-space values are mapped back to the values
of the input file with the stored (invertible) transform, the noise is added there with σ_j
the train-split std of the original values, and the fitted transform is applied again.

:class:`CategoricalCorruption` replaces each categorical value with probability p by an id
drawn uniformly from the field's kept vocabulary. :class:`TemporalShift` leaves the batch as
it is: its shift is in the data (a time-ordered split).

Missing values (NaN) stay missing: a shift perturbs values, it does not invent them. With
``mix_fraction < 1`` only that fraction of the rows of each batch is shifted (the paper's
"Mix" scenario); ``apply`` returns the row mask so metrics can be computed on those rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import DataError

__all__ = [
    "PAPER_INTENSITIES",
    "CategoricalCorruption",
    "GaussianNumericShift",
    "GaussianShift",
    "TemporalShift",
    "original_space_codec",
]

PAPER_INTENSITIES: tuple[float, ...] = (0.0625, 0.125, 0.25, 0.5)


class _Stream:
    """A seeded random stream per device, restartable (the determinism every shift shares)."""

    def __init__(self, seed: int | None) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def reset(self) -> None:
        self._generators.clear()

    def __call__(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self.seed is None:
                gen.seed()
            else:
                gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen


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
        self._stream = _Stream(seed)
        self.std = std_t
        self.intensity = intensity
        self.seed = seed
        self.mix_fraction = mix_fraction
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
        self._stream.reset()
        return self

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
        gen = self._stream(device)
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


# ---------------------------------------------------------------------------------------------
# Shifts on a whole batch (created by name through ctrcal.shifts.registry.create_shift)


def _row_mask(rows: int, fraction: float, gen: torch.Generator, device) -> torch.Tensor:
    """bool [rows]: all rows, or ``round(fraction · rows)`` of them chosen uniformly."""
    if fraction >= 1.0:
        return torch.ones(rows, dtype=torch.bool, device=device)
    k = int(round(fraction * rows))
    chosen = torch.randperm(rows, generator=gen, device=device)[:k]
    mask = torch.zeros(rows, dtype=torch.bool, device=device)
    mask[chosen] = True
    return mask


def _check_batch(batch: Any) -> None:
    if not isinstance(batch, Batch):
        raise TypeError(f"a shift applies to a ctrcal Batch, got {type(batch).__name__}")


def _check_mix(mix_fraction: float) -> float:
    mix_fraction = float(mix_fraction)
    if not 0.0 <= mix_fraction <= 1.0:
        raise ValueError(f"mix_fraction must lie in [0, 1], got {mix_fraction}")
    return mix_fraction


def original_space_codec(feature_map: Any, source: str = "feature map"):
    """``(to_original, to_model, original_std)`` of a feature map, or a clear error.

    ``to_original(x [B, Fn]) -> raw [B, Fn]`` inverts the stored numeric transform,
    ``to_model`` re-applies it (:meth:`ctrcal.preparation.features.FeatureMap.numeric_codec`),
    ``original_std`` [Fn] is the train-split std of the original values.

    Raises:
        DataError: the feature map was prepared without original-space statistics.
    """
    make = getattr(feature_map, "numeric_codec", None)
    codec = make() if callable(make) else None
    if codec is None or not getattr(codec, "has_original_stats", False):
        # space: model is a way out only where there are numerics to perturb
        model = "" if getattr(feature_map, "num_numeric", None) == 0 else ", or set space: model"
        raise DataError(
            f"{source}: the prepared data has no original-space numeric statistics, which "
            "gaussian_numeric with space: original needs (prepare the data again with this "
            f"version of ctrcal{model})"
        )
    return codec.to_original, codec.to_model, list(codec.original_std)


class GaussianNumericShift:
    """Gaussian noise on the numeric features of a batch, in original or model-input space.

    Args:
        std: [Fn] the σ_j of the chosen space (train split, finite, >= 0).
        intensity: s, noise std in units of σ_j (0 = clean; in original space s = 0 still
            maps through the transform and back, which reproduces the batch up to float32).
        seed: seed of the noise stream (None = fresh).
        mix_fraction: fraction of the rows of each batch to shift.
        space: ``"original"`` or ``"model"``.
        to_original, from_original: the stored transform and its inverse on ``[B, Fn]``
            tensors (original space only).
        model_std: [Fn] model-space stds, kept for :meth:`describe`.

    The noise stream draws, per batch, the row selection and then a full ``[B, Fn]`` standard
    normal matrix whatever ``s`` is, so two intensities with the same seed shift the same rows
    with proportional noise.
    """

    def __init__(
        self,
        std: Sequence[float],
        intensity: float,
        seed: int | None = 0,
        mix_fraction: float = 1.0,
        space: str = "model",
        to_original: Any = None,
        from_original: Any = None,
        model_std: Sequence[float] | None = None,
    ) -> None:
        if space not in ("original", "model"):
            raise ValueError(f"space must be 'original' or 'model', got {space!r}")
        if space == "original" and (to_original is None or from_original is None):
            raise ValueError("space 'original' needs to_original and from_original")
        self.space = space
        self._noise = GaussianShift(std, intensity, seed=seed, mix_fraction=mix_fraction)
        self._to_original = to_original
        self._from_original = from_original
        self.model_std = list(model_std) if model_std is not None else None

    @classmethod
    def from_feature_map(
        cls,
        feature_map: Any,
        intensity: float,
        seed: int | None = 0,
        mix_fraction: float = 1.0,
        space: str = "original",
    ) -> GaussianNumericShift:
        """The shift with σ_j from ``feature_map`` in the chosen ``space``.

        Raises:
            DataError: ``space="original"`` and the feature map lacks original-space statistics.
        """
        model_std = list(feature_map.numeric_std)
        if space == "model":
            return cls(model_std, intensity, seed, mix_fraction, "model", model_std=model_std)
        to_orig, from_orig, std = original_space_codec(feature_map)
        return cls(std, intensity, seed, mix_fraction, "original", to_orig, from_orig, model_std)

    @property
    def intensity(self) -> float:
        return self._noise.intensity

    @property
    def std(self) -> list[float]:
        """σ_j of the space the noise is added in."""
        return self._noise.std.tolist()

    def __repr__(self) -> str:
        return (
            f"GaussianNumericShift(space={self.space!r}, intensity={self.intensity}, "
            f"seed={self._noise.seed}, mix_fraction={self._noise.mix_fraction})"
        )

    def reset(self) -> GaussianNumericShift:
        self._noise.reset()
        return self

    def describe(self) -> dict[str, Any]:
        """The facts a report states: the space and the σ_j of both spaces."""
        out: dict[str, Any] = {"space": self.space, "model_std": self.model_std}
        out["original_std"] = self.std if self.space == "original" else None
        return out

    def apply(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """``(shifted batch, rows bool [B])``; ``batch`` is not modified."""
        _check_batch(batch)
        if self.space == "model":
            numeric, rows = self._noise.apply(batch.numeric)
        else:
            raw = self._to_original(batch.numeric)
            noisy, rows = self._noise.apply(raw)
            numeric = self._from_original(noisy).to(batch.numeric.dtype)
        return Batch(batch.categorical, numeric, batch.label), rows

    def __call__(self, batch: Batch) -> Batch:
        return self.apply(batch)[0]


class CategoricalCorruption:
    """Replace each categorical value with probability p by a uniformly drawn kept id.

    The replacement id of field f is uniform over ``[first_id, vocab_sizes[f])``, the ids of
    values kept in the train vocabulary (so a replacement is a real value of that field, not
    the missing or out-of-vocabulary id); a field without kept values is left as it is. The
    drawn id may equal the original one (probability 1 / kept values), as in Ovadia et al.'s
    corruption. Numerics are untouched.

    Args:
        vocab_sizes: [Fc] ids per field (reserved ids included).
        p: replacement probability in [0, 1].
        seed: seed of the stream (None = fresh).
        mix_fraction: fraction of the rows of each batch to shift.
        first_id: the first kept id (:data:`ctrcal.preparation.features.NUM_RESERVED`).
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        p: float,
        seed: int | None = 0,
        mix_fraction: float = 1.0,
        first_id: int = 3,
    ) -> None:
        p = float(p)
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"p must be a probability in [0, 1], got {p}")
        self.p = p
        self.mix_fraction = _check_mix(mix_fraction)
        sizes = torch.as_tensor(list(vocab_sizes), dtype=torch.int64)
        self.first_id = int(first_id)
        self.span = (sizes - self.first_id).clamp_min(0)  # kept ids per field
        self._stream = _Stream(seed)
        self._span_on: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_feature_map(
        cls, feature_map: Any, intensity: float, seed: int | None = 0, mix_fraction: float = 1.0
    ) -> CategoricalCorruption:
        from ctrcal.core.ids import NUM_RESERVED

        return cls(feature_map.vocab_sizes, intensity, seed, mix_fraction, NUM_RESERVED)

    @property
    def intensity(self) -> float:
        return self.p

    def __repr__(self) -> str:
        return f"CategoricalCorruption(p={self.p}, seed={self._stream.seed})"

    def reset(self) -> CategoricalCorruption:
        self._stream.reset()
        return self

    def describe(self) -> dict[str, Any]:
        return {"kept_ids_per_field": self.span.tolist()}

    def apply(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """``(shifted batch, rows bool [B])``; ``batch`` is not modified."""
        _check_batch(batch)
        cat = batch.categorical
        if cat.dim() != 2 or cat.shape[1] != self.span.numel():
            raise ValueError(
                f"categorical must have shape [B, {self.span.numel()}], got {tuple(cat.shape)}"
            )
        device = cat.device
        gen = self._stream(device)
        rows = _row_mask(cat.shape[0], self.mix_fraction, gen, device)
        span = self._span_on.get(device)
        if span is None:
            span = self._span_on[device] = self.span.to(device)
        # one uniform for the coin and one for the id, whatever p is: proportional streams
        coin = torch.rand(cat.shape, generator=gen, device=device)
        pick = torch.rand(cat.shape, generator=gen, device=device)
        replace = (coin < self.p) & (span > 0) & rows.unsqueeze(1)
        new_ids = (pick * span).long().clamp_max((span - 1).clamp_min(0)) + self.first_id
        out = torch.where(replace, new_ids.to(cat.dtype), cat)
        return Batch(out, batch.numeric, batch.label), rows

    def __call__(self, batch: Batch) -> Batch:
        return self.apply(batch)[0]


class TemporalShift:
    """The natural shift of a time-ordered split: the batch stays as it is.

    Its effect is in the data (models trained on earlier rows, evaluated on later ones); the
    report evaluates it on the test split of a time-ordered preparation.
    """

    def __init__(self, intensity: float = 1.0, seed: int | None = 0, mix_fraction: float = 1.0):
        self.intensity = float(intensity)

    @classmethod
    def from_feature_map(
        cls, feature_map: Any, intensity: float, seed: int | None = 0, mix_fraction: float = 1.0
    ) -> TemporalShift:
        return cls(intensity, seed, mix_fraction)

    def reset(self) -> TemporalShift:
        return self

    def describe(self) -> dict[str, Any]:
        return {}

    def apply(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        _check_batch(batch)
        return batch, torch.ones(len(batch), dtype=torch.bool, device=batch.label.device)

    def __call__(self, batch: Batch) -> Batch:
        return batch
