"""What ctrcal's built-in models share beyond layers: the checks of their common arguments."""

from __future__ import annotations

from typing import Any

from ctrcal.core.typed import require_int, require_number

__all__ = ["check_embedding_args"]


def check_embedding_args(embedding_dim: Any, dropout: Any, embedding_init_std: Any) -> None:
    """The arguments every built-in model takes: D >= 1, dropout in [0, 1), init std > 0.

    Raises:
        ConfigError (a ValueError): naming the argument, what was expected and what came.
    """
    require_int("embedding_dim", embedding_dim, low=1)
    require_number("dropout", dropout, low=0.0, high=1.0, high_open=True)
    require_number("embedding_init_std", embedding_init_std, low=0.0, low_open=True)
