"""DCNv2 (Wang et al. 2021, "DCN V2"): a cross network and a deep tower; returns logits.

Structure (the paper's, with FuxiCTR's structure names)::

    E   = FeatureEmbedding(categorical, numeric)          [B, F, D]
    x0  = flatten(FieldNorm_emb(E))                       [B, F*D]   (emb_norm, per field)
    crossnet_only:    h = Cross(x0)
    stacked:          h = Deep_s(Cross(x0))
    parallel:         h = concat(Cross(x0), Deep_p(x0))
    stacked_parallel: h = concat(Deep_s(Cross(x0)), Deep_p(x0))
    logit = Linear(h -> 1)

``Cross`` is :class:`~ctrcal.layers.cross.CrossNet` (full rank, low rank, or a mixture of
low-rank experts); each deep tower is an :class:`~ctrcal.layers.mlp.MLP` with the
``net_norm`` after every hidden linear layer. Norms are registry specs: ``net_norm`` (every
deep layer) and ``emb_norm`` (per field over D). Init: Xavier-normal weights, zero biases,
small-normal embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.core.typed import require_int
from ctrcal.layers.cross import CrossNet
from ctrcal.layers.mlp import MLP
from ctrcal.models.common import EmbeddingModel
from ctrcal.models.replay import dcnv2_replay

__all__ = ["DCNv2", "STRUCTURES"]

STRUCTURES = ("crossnet_only", "stacked", "parallel", "stacked_parallel")


class DCNv2(EmbeddingModel):
    """DCNv2 CTR model.

    Args:
        vocab_sizes: per categorical field, its number of ids.
        num_numeric: number of numeric fields.
        embedding_dim: D.
        structure: ``crossnet_only``, ``stacked``, ``parallel`` or ``stacked_parallel``.
        num_cross_layers: cross layers.
        low_rank: rank r of the cross matrices; 0 = full rank.
        num_experts: low-rank experts per cross layer (DCN-Mix when > 1).
        stacked_dnn_hidden_units: the tower on top of the cross network (stacked).
        parallel_dnn_hidden_units: the tower beside it (parallel).
        net_norm: norm spec after every hidden linear layer of the deep towers.
        emb_norm: norm spec per field over D (``"none"``: no norm).
        dropout: dropout after every hidden activation.
        numeric_embedding: ``linear`` | ``scaled`` | ``bucket``.
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
        structure: Literal["crossnet_only", "stacked", "parallel", "stacked_parallel"] = "parallel",
        num_cross_layers: int = 3,
        low_rank: int = 0,
        num_experts: int = 1,
        stacked_dnn_hidden_units: Sequence[int] = (500, 500, 500),
        parallel_dnn_hidden_units: Sequence[int] = (500, 500, 500),
        net_norm: Any = "none",
        emb_norm: Any = "none",
        dropout: float = 0.0,
        numeric_embedding: Literal["linear", "scaled", "bucket"] = "linear",
        bucket_boundaries: Sequence[Sequence[float]] | None = None,
        embedding_init_std: float = 1e-4,
    ) -> None:
        if structure not in STRUCTURES:
            raise ValueError(
                f"structure: unknown DCNv2 structure {structure!r} (valid: {', '.join(STRUCTURES)})"
            )
        require_int("num_cross_layers", num_cross_layers, low=0)
        require_int("low_rank", low_rank, low=0)
        require_int("num_experts", num_experts, low=1)
        if num_experts > 1 and low_rank == 0:
            raise ValueError(
                "num_experts: a mixture of experts (num_experts > 1) needs low_rank > 0"
            )
        for key, units in (
            ("stacked_dnn_hidden_units", stacked_dnn_hidden_units),
            ("parallel_dnn_hidden_units", parallel_dnn_hidden_units),
        ):
            for i, width in enumerate(units):
                require_int(f"{key}[{i}]", width, low=1)
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
        self.structure = structure
        flat = self.embedding.output_dim
        self.cross = CrossNet(flat, num_cross_layers, low_rank, num_experts)
        stacked = structure in ("stacked", "stacked_parallel")
        parallel = structure in ("parallel", "stacked_parallel")
        self.stacked_dnn = (
            MLP(flat, stacked_dnn_hidden_units, net_norm, dropout) if stacked else None
        )
        self.parallel_dnn = (
            MLP(flat, parallel_dnn_hidden_units, net_norm, dropout) if parallel else None
        )
        width = self.stacked_dnn.output_dim if self.stacked_dnn is not None else flat
        if self.parallel_dnn is not None:
            width += self.parallel_dnn.output_dim
        self.head = nn.Linear(width, 1)
        self.reset_parameters()

    def _reset_layers(self) -> None:
        """The cross network's own init (its matrices are parameters, not ``nn.Linear``)."""
        self.cross.reset_parameters()

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B]`` for ``batch.categorical`` ``[B, Fc]`` int64 ids and ``batch.numeric``
        ``[B, Fn]``."""
        return self.from_embedding(self.embed(batch.categorical, batch.numeric))

    def from_embedding(self, emb: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from the feature embedding ``[B, F, D]`` (the forward after it)."""
        x0 = self.flat_input(emb)
        h = self.cross(x0)
        if self.stacked_dnn is not None:
            h = self.stacked_dnn(h)
        if self.parallel_dnn is not None:
            h = torch.cat([h, self.parallel_dnn(x0)], dim=1)
        return self.head(h).squeeze(-1)

    def mc_replay(self, batch: Batch) -> Callable[[int], torch.Tensor] | None:
        """Monte-Carlo passes that compute the deterministic prefix once
        (:func:`ctrcal.models.replay.dcnv2_replay`); None for a subclass with its own forward."""
        if type(self).forward is not DCNv2.forward:
            return None
        return dcnv2_replay(self, batch)
