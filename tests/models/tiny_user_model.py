"""A user's own CTR model, defined only for the tests (not part of the package).

It follows the user-model contract: ``TinyCTR(feature_map, **kwargs)``, ``forward(batch)``
returning logits ``[B]``; it holds two ``nn.LayerNorm``s for ``replace_norms`` to find.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyCTR(nn.Module):
    def __init__(self, feature_map, dim: int = 4, hidden: int = 16) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(v, dim) for v in feature_map.vocab_sizes)
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.01)
        fn = len(feature_map.numeric_fields)
        width = dim * len(self.tables) + fn
        self.net = nn.Sequential(
            nn.Linear(width, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, batch) -> torch.Tensor:
        cats = [t(batch.categorical[:, j]) for j, t in enumerate(self.tables)]
        x = torch.cat([*cats, torch.nan_to_num(batch.numeric)], dim=1)
        return self.net(x).squeeze(-1)


class WrongShape(TinyCTR):
    def forward(self, batch) -> torch.Tensor:
        return super().forward(batch).unsqueeze(-1)  # [B, 1]


class WrongDtype(TinyCTR):
    def forward(self, batch) -> torch.Tensor:
        return (super().forward(batch) > 0).long()


class NoLayerNorm(nn.Module):
    def __init__(self, feature_map) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, batch) -> torch.Tensor:
        return self.bias.expand(batch.categorical.shape[0])


class NotAModule:
    def __init__(self, feature_map) -> None:
        pass
