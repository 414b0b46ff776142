"""Encoded parquet -> contiguous batches.

A :class:`Batch` is three tensors; models read ``categorical`` and ``numeric``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """One mini-batch of encoded Criteo rows.

    Attributes:
        categorical: int64 [B, Fc] ids into each field's vocabulary (field-local ids).
        numeric: float32 [B, Fn] continuous values in model-input space (NaN = missing).
        label: float32 [B] clicks (0/1).
    """

    categorical: torch.Tensor
    numeric: torch.Tensor
    label: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.categorical.to(device, non_blocking=non_blocking),
            self.numeric.to(device, non_blocking=non_blocking),
            self.label.to(device, non_blocking=non_blocking),
        )

    def __len__(self) -> int:
        return self.label.shape[0]
