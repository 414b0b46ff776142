"""Random model inputs for the model and layer tests.

Imported by tests as ``from batches import random_batch`` (``tests/`` is on ``sys.path``
through its ``conftest.py``).
"""

from __future__ import annotations

import torch


def random_batch(
    vocab_sizes: list[int], num_numeric: int, rows: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible batch: categorical ids [rows, len(vocab_sizes)] int64, each column within
    its vocabulary, and standard-normal numerics [rows, num_numeric]."""
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, v, (rows,), generator=g) for v in vocab_sizes], dim=1)
    return cat, torch.randn(rows, num_numeric, generator=g)
