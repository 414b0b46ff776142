"""torch's devices and seeds: kept apart from :mod:`ctrcal.core.utils`, which the data commands
import and which must not reach torch (its import costs more than preparing a small file)."""

from __future__ import annotations

import random


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 - legacy global RNG some code still uses
    torch.manual_seed(seed)


def resolve_device(spec: str = "auto"):
    """``auto`` -> CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


__all__ = ["resolve_device", "seed_everything"]
