"""A feed-forward tower with a norm at every hidden layer: the deep part of CTR models.

Every hidden layer is ``Linear -> Norm -> ReLU -> Dropout`` (the order FuxiCTR's MLP blocks
use with batch norm, with any registry norm in the norm slot), so ``norm="layernorm"`` gives a
LayerNorm per hidden layer and ``replace_norms`` or a report variant can swap all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ctrcal.core.norm_spec import is_no_norm
from ctrcal.layers.dropout import run_sequential
from ctrcal.layers.registry import create_norm

__all__ = ["MLP"]


class MLP(nn.Module):
    """Hidden layers ``Linear -> Norm -> ReLU -> Dropout``, optionally a final ``Linear -> 1``.

    Args:
        input_dim: width of the input.
        hidden_units: width of each hidden layer (may be empty).
        norm: norm spec for every hidden layer (``"none"``: no norm layer at all).
        dropout: dropout rate after every hidden activation.
        output_dim: width of a final linear layer without activation (None: no such layer).

    Shapes:
        input ``[B, input_dim]`` -> ``[B, output_dim]``, or ``[B, hidden_units[-1]]`` (or
        ``[B, input_dim]`` with no hidden layers) without an output layer.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_units: Sequence[int],
        norm: Any = "none",
        dropout: float = 0.0,
        output_dim: int | None = None,
    ) -> None:
        super().__init__()
        if input_dim < 1 or any(int(u) < 1 for u in hidden_units):
            raise ValueError(
                f"MLP widths must be >= 1, got input {input_dim}, hidden {list(hidden_units)}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = []
        width = int(input_dim)
        for units in hidden_units:
            layers.append(nn.Linear(width, int(units)))
            if not is_no_norm(norm):
                layers.append(create_norm(norm, int(units)))
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = int(units)
        if output_dim is not None:
            layers.append(nn.Linear(width, int(output_dim)))
            width = int(output_dim)
        self.layers = nn.Sequential(*layers)
        self.output_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, input_dim]`` -> ``[B, output_dim]``; ReLU + Dropout pairs run fused."""
        return run_sequential(self.layers, x)
