"""The batch every model reads: a leaf that data loaders and models both import.

Models import neither the data package nor the config: what they agree on with the loaders is
this one type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Batch"]


@dataclass
class Batch:
    """One mini-batch of encoded rows; what every model's ``forward(batch)`` takes.

    Attributes:
        categorical: int64 [B, Fc] ids into each field's vocabulary (field-local ids).
        numeric: float32 [B, Fn] continuous values in model-input space (NaN = missing).
        label: float32 [B] clicks (0/1); None where a model is called (a model never sees
            labels).
    """

    categorical: torch.Tensor
    numeric: torch.Tensor
    label: torch.Tensor | None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """A batch of ``fn`` applied to each tensor (a missing label stays None)."""
        return Batch(
            fn(self.categorical), fn(self.numeric), None if self.label is None else fn(self.label)
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def inputs(self) -> Batch:
        """The batch as a model gets it: the same tensors, ``label=None``."""
        return self if self.label is None else Batch(self.categorical, self.numeric, None)

    def __len__(self) -> int:
        return self.categorical.shape[0]
