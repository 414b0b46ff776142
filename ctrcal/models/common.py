"""What ctrcal's built-in models share: the feature embedding with its per-field norm, the
initialisation, and the checks of their common arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from ctrcal.core.norm_spec import is_no_norm
from ctrcal.core.typed import require_int, require_number
from ctrcal.layers.embedding import FeatureEmbedding, FieldNorm

__all__ = ["EmbeddingModel", "check_embedding_args"]


def check_embedding_args(embedding_dim: Any, dropout: Any, embedding_init_std: Any) -> None:
    """The arguments every built-in model takes: D >= 1, dropout in [0, 1), init std > 0.

    Raises:
        ConfigError (a ValueError): naming the argument, what was expected and what came.
    """
    require_int("embedding_dim", embedding_dim, low=1)
    require_number("dropout", dropout, low=0.0, high=1.0, high_open=True)
    require_number("embedding_init_std", embedding_init_std, low=0.0, low_open=True)


class EmbeddingModel(nn.Module):
    """The base of the built-in models: ``embedding`` (a
    :class:`~ctrcal.layers.embedding.FeatureEmbedding`) and ``emb_norm`` (a
    :class:`~ctrcal.layers.embedding.FieldNorm` per field over D, or None), built once here.

    A subclass checks its own arguments, calls ``super().__init__`` (which checks the shared
    ones and registers ``embedding`` then ``emb_norm``, so the state-dict keys are
    ``embedding.*``, ``emb_norm.*``, then the subclass's), adds its layers, and ends with
    ``self.reset_parameters()``.

    Args:
        vocab_sizes: per categorical field, its number of ids.
        num_numeric: number of numeric fields.
        embedding_dim: D.
        emb_norm: norm spec per field over D (``"none"``: no norm).
        dropout: only checked here (the subclass places its dropout).
        numeric_embedding: ``linear`` | ``scaled`` | ``bucket``.
        bucket_boundaries: per numeric field, for ``bucket``.
        embedding_init_std: std of the normal init of the embeddings.
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        num_numeric: int,
        embedding_dim: int,
        emb_norm: Any,
        dropout: float,
        numeric_embedding: Literal["linear", "scaled", "bucket"],
        bucket_boundaries: Sequence[Sequence[float]] | None,
        embedding_init_std: float,
    ) -> None:
        super().__init__()
        check_embedding_args(embedding_dim, dropout, embedding_init_std)
        self.embedding = FeatureEmbedding(
            vocab_sizes,
            num_numeric,
            embedding_dim,
            numeric_embedding=numeric_embedding,
            bucket_boundaries=bucket_boundaries,
            init_std=embedding_init_std,
        )
        fields, dim = self.embedding.num_fields, self.embedding.embedding_dim
        self.emb_norm = None if is_no_norm(emb_norm) else FieldNorm(fields, dim, emb_norm)

    def reset_parameters(self) -> None:
        """Xavier-normal weights and zero biases of every ``nn.Linear``, then
        :meth:`_reset_layers`, then small-normal embeddings (this order keeps a seed's
        initial weights what they were)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self._reset_layers()
        self.embedding.reset_parameters()

    def _reset_layers(self) -> None:
        """Initialise the subclass's layers that are not ``nn.Linear`` (none by default)."""

    def embed(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        """The raw feature embedding ``[B, F, D]`` (before ``emb_norm``) of ids ``[B, Fc]``
        and numerics ``[B, Fn]``."""
        return self.embedding(categorical, numeric)

    def flat_input(self, emb: torch.Tensor) -> torch.Tensor:
        """``flatten(emb_norm(emb))`` ``[B, F*D]`` of an embedding ``[B, F, D]`` (no norm:
        the flattened embedding)."""
        return emb.flatten(1) if self.emb_norm is None else self.emb_norm(emb).flatten(1)
