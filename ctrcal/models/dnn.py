"""DNN: the embedding + MLP baseline every CTR paper reports; returns logits.

Structure (FuxiCTR's DNN, the BARS baseline)::

    E     = FeatureEmbedding(categorical, numeric)        [B, F, D]
    x     = flatten(FieldNorm_emb(E))                     [B, F*D]   (emb_norm, per field)
    logit = MLP(x): (Linear -> Norm -> ReLU -> Dropout) per hidden layer, then Linear -> 1

Norms are specs from :mod:`ctrcal.layers.registry` at two positions: ``net_norm`` after every
hidden linear layer and ``emb_norm`` per field over D. Init: Xavier-normal linear weights,
zero biases, small-normal embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ctrcal.core.batch import Batch
from ctrcal.core.typed import require_int
from ctrcal.layers.mlp import MLP
from ctrcal.models.common import EmbeddingModel
from ctrcal.models.replay import dnn_replay

__all__ = ["DNN"]


class DNN(EmbeddingModel):
    """Embedding + MLP CTR model.

    Args:
        vocab_sizes: per categorical field, its number of ids.
        num_numeric: number of numeric fields.
        embedding_dim: D.
        hidden_units: width of each hidden layer.
        net_norm: norm spec after every hidden linear layer (``"none"``: no norm).
        emb_norm: norm spec per field over D (``"none"``: no norm).
        dropout: dropout after every hidden activation.
        numeric_embedding: ``linear`` | ``scaled`` | ``bucket`` (see
            :class:`~ctrcal.layers.embedding.FeatureEmbedding`).
        bucket_boundaries: per numeric field, for ``bucket``.
        embedding_init_std: std of the normal init of the embeddings.

    Shapes:
        ``forward(batch)``: ``batch.categorical`` int64 ``[B, Fc]``; ``batch.numeric`` float
        ``[B, Fn]`` (NaN = missing); output: logits ``[B]``.
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        num_numeric: int,
        embedding_dim: int = 16,
        hidden_units: Sequence[int] = (400, 400, 400),
        net_norm: Any = "none",
        emb_norm: Any = "none",
        dropout: float = 0.0,
        numeric_embedding: Literal["linear", "scaled", "bucket"] = "linear",
        bucket_boundaries: Sequence[Sequence[float]] | None = None,
        embedding_init_std: float = 1e-4,
    ) -> None:
        for i, units in enumerate(hidden_units):
            require_int(f"hidden_units[{i}]", units, low=1)
        super().__init__(
            vocab_sizes,
            num_numeric,
            embedding_dim,
            emb_norm,
            dropout,
            numeric_embedding,
            bucket_boundaries,
            embedding_init_std,
        )
        self.mlp = MLP(self.embedding.output_dim, hidden_units, net_norm, dropout, output_dim=1)
        self.reset_parameters()

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B]`` for ``batch.categorical`` ``[B, Fc]`` int64 ids and ``batch.numeric``
        ``[B, Fn]``."""
        x = self.flat_input(self.embed(batch.categorical, batch.numeric))
        return self.mlp(x).squeeze(-1)

    def mc_replay(self, batch: Batch) -> Callable[[int], torch.Tensor] | None:
        """Monte-Carlo passes that compute the deterministic prefix once
        (:func:`ctrcal.models.replay.dnn_replay`); None for a subclass with its own forward."""
        if type(self).forward is not DNN.forward:
            return None
        return dnn_replay(self, batch)
