"""The stored numeric transform, invertible on a batch: original space <-> model space.

A prepared directory stores each numeric feature in *model space* (what models read, see
:mod:`ctrcal.preparation.features`). The *original space* is the value as it stands in the input
file: raw integer counts for the dac / day_N / Kaggle / Criteo_x4 layouts, the given (already
scaled) values for Criteo_x1. The fitted transform maps one to the other, per feature ``j``::

    log_standardize   z = (sign(x)·log1p(|x|) - center_j) / scale_j
    standardize       z = (x - center_j) / scale_j
    identity          z = x

with ``center_j`` / ``scale_j`` from the train split. Bucketised embeddings cut ``z`` at stored
model-space boundaries inside the model, so they need nothing here.

Public API (all vectorised torch, on the input's device, never mutating the input, NaN =
missing preserved both ways)::

    codec = NumericTransform.from_feature_map(feature_map)   # or feature_map.numeric_codec()
    x_orig = codec.to_original(batch.numeric)    # [B, Fn] model space -> original space
    z = codec.to_model(x_orig + noise)           # [B, Fn] original space -> model space
    codec.original_std                           # [Fn] train-split std of original values

``to_model(to_original(z))`` reproduces ``z`` up to float32 rounding (the arithmetic runs in
float64 and the result takes the input's dtype). The train-split mean and std of the original
values (``original_mean`` / ``original_std``) are stored in the feature map beside the
model-space ones; a feature map written before they existed has none
(:attr:`NumericTransform.has_original_stats` is then false, and an original-space shift says
to prepare the data again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctrcal.core.errors import DataError

if TYPE_CHECKING:
    import torch

    from ctrcal.data.feature_map import FeatureMap

TRANSFORMS = ("log_standardize", "standardize", "identity")


@dataclass(frozen=True)
class NumericTransform:
    """The fitted per-feature numeric transform and the train-split statistics in both spaces.

    Attributes:
        kind: ``log_standardize``, ``standardize`` or ``identity``.
        center: [Fn] subtracted after the (optional) sign-aware log.
        scale: [Fn] divided by after centring (positive).
        model_mean / model_std: [Fn] train-split mean / std in model space.
        original_mean / original_std: [Fn] train-split mean / std of the original values, or
            None for a feature map that predates them (see :attr:`has_original_stats`).
        source: where the statistics came from (for error messages).
    """

    kind: str
    center: tuple[float, ...]
    scale: tuple[float, ...]
    model_mean: tuple[float, ...] = ()
    model_std: tuple[float, ...] = ()
    original_mean: tuple[float, ...] | None = None
    original_std: tuple[float, ...] | None = None
    source: str = "<feature map>"
    # (center, scale) per device, copied there once: a copy per batch would be a host-to-device
    # transfer (and on CUDA a host sync) at every training step of an original-space shift
    _on_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in TRANSFORMS:
            raise DataError(
                f"{self.source}: unknown numeric transform {self.kind!r} "
                f"(valid: {', '.join(TRANSFORMS)})"
            )
        if len(self.center) != len(self.scale):
            raise DataError(f"{self.source}: {len(self.center)} centers, {len(self.scale)} scales")
        if any(not s > 0 for s in self.scale):
            raise DataError(f"{self.source}: numeric transform scales must be positive")

    @property
    def num_features(self) -> int:
        return len(self.center)

    @property
    def has_original_stats(self) -> bool:
        return self.original_mean is not None and self.original_std is not None

    @classmethod
    def from_feature_map(cls, fmap: FeatureMap) -> NumericTransform:
        """The transform stored in a :class:`~ctrcal.data.feature_map.FeatureMap`."""
        feats = [f for f in fmap.extra.get("features", []) if f.get("kind") == "numeric"]
        source = fmap.source
        try:
            center = tuple(float(f["transform_center"]) for f in feats)
            scale = tuple(float(f["transform_scale"]) for f in feats)
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{source}: numeric features lack transform_center/scale") from None
        return cls(
            kind=fmap.numeric_transform,
            center=center,
            scale=scale,
            model_mean=tuple(fmap.numeric_mean),
            model_std=tuple(fmap.numeric_std),
            original_mean=_opt_tuple(fmap.numeric_original_mean),
            original_std=_opt_tuple(fmap.numeric_original_std),
            source=source,
        )

    # -- batch maps -----------------------------------------------------------------------

    def _params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if x.dim() < 1 or x.shape[-1] != self.num_features:
            raise DataError(
                f"expected numerics of shape [..., {self.num_features}], got {tuple(x.shape)}"
            )
        params = self._on_device.get(x.device)
        if params is None:
            kw = {"dtype": torch.float64, "device": x.device}
            params = self._on_device[x.device] = (
                torch.tensor(self.center, **kw),
                torch.tensor(self.scale, **kw),
            )
        return params

    def to_original(self, x_model: torch.Tensor) -> torch.Tensor:
        """Model-space numerics -> the values as they stand in the input file.

        Args:
            x_model: float [..., Fn] model-space values (NaN = missing), any device.

        Returns:
            A new tensor of the same shape, dtype and device (NaN stays NaN).
        """
        import torch

        if self.kind == "identity":
            return x_model.clone()
        center, scale = self._params(x_model)
        t = x_model.to(torch.float64) * scale + center
        if self.kind == "log_standardize":
            t = torch.sign(t) * torch.expm1(t.abs())
        return t.to(x_model.dtype)

    def to_model(self, x_original: torch.Tensor) -> torch.Tensor:
        """Original-space values -> model-space numerics (what the pipeline writes).

        Args:
            x_original: float [..., Fn] values as in the input file (NaN = missing); any
                real value is accepted (a shifted count need not be an integer).

        Returns:
            A new tensor of the same shape, dtype and device (NaN stays NaN).
        """
        import torch

        if self.kind == "identity":
            return x_original.clone()
        center, scale = self._params(x_original)
        x = x_original.to(torch.float64)
        if self.kind == "log_standardize":
            x = torch.sign(x) * torch.log1p(x.abs())
        return ((x - center) / scale).to(x_original.dtype)


def to_original(x_model: torch.Tensor, fmap: FeatureMap) -> torch.Tensor:
    """Shorthand for ``NumericTransform.from_feature_map(fmap).to_original(x_model)``."""
    return NumericTransform.from_feature_map(fmap).to_original(x_model)


def to_model(x_original: torch.Tensor, fmap: FeatureMap) -> torch.Tensor:
    """Shorthand for ``NumericTransform.from_feature_map(fmap).to_model(x_original)``."""
    return NumericTransform.from_feature_map(fmap).to_model(x_original)


def _opt_tuple(values: list[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)
