"""The batch every model reads: a leaf that data loaders and models both import.

Models import neither the data package nor the config: what they agree on with the loaders is
this one type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch"]


@dataclass
class Batch:
    """One mini-batch of encoded rows.

    Attributes:
        categorical: int64 [B, Fc] ids into each field's vocabulary (field-local ids).
        numeric: float32 [B, Fn] continuous values in model-input space (NaN = missing).
        label: float32 [B] clicks (0/1); None where a model is called (a model never sees
            labels).
    """

    categorical: torch.Tensor
    numeric: torch.Tensor
    label: torch.Tensor | None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.categorical.to(device, non_blocking=non_blocking),
            self.numeric.to(device, non_blocking=non_blocking),
            None if self.label is None else self.label.to(device, non_blocking=non_blocking),
        )

    def __len__(self) -> int:
        return self.categorical.shape[0]
