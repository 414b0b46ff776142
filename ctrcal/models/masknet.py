"""MaskNet (Wang et al. 2021) with pluggable norms, serial or parallel; returns logits.

Structure (FuxiCTR semantics, the implementation the MC-LayerNorm paper trained on Criteo)::

    E      = FeatureEmbedding(categorical, numeric)          [B, F, D]
    v_emb  = flatten(E)                                      [B, F*D]   read by EVERY mask
    v_in   = flatten(FieldNorm_emb(E))                       [B, F*D]   (emb_norm, per field)

    serial:   h_0 = v_in; h_i = MaskBlock_i(v_emb, h_{i-1}) for each of hidden_units
              logit = Linear(h_last -> 1)
    parallel: o_k = MaskBlock_k(v_emb, v_in), k = 1..num_blocks, each block_dim wide
              logit = MLP(concat(o_1..o_K)) -> 1   (Linear -> ReLU -> Dropout per layer)

Norms are specs from :mod:`ctrcal.layers.registry` at two positions: ``emb_norm`` (per field
over D) and ``net_norm`` (in every MaskBlock). Init: Xavier-normal weights and zero biases for
every ``nn.Linear``; small-normal embeddings (``embedding_init_std``).

The model knows no optimizer, no file and no device; ``forward`` returns logits ``[B]`` (apply
``sigmoid`` for click probabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.core.typed import require_int, require_number
from ctrcal.layers.logit_head import sequential_logit
from ctrcal.layers.mask_block import MaskBlock, mask_hidden_layers, serial_logits
from ctrcal.models.common import EmbeddingModel
from ctrcal.models.replay import masknet_replay

VARIANTS = ("serial", "parallel")


class MaskNet(EmbeddingModel):
    """MaskNet CTR model.

    Args:
        vocab_sizes: per categorical field, its number of ids.
        num_numeric: number of numeric fields.
        embedding_dim: D.
        variant: ``serial`` or ``parallel``.
        hidden_units: serial only: output width of each MaskBlock.
        reduction_ratio: mask bottleneck ratio (first mask layer has ``floor(hidden*ratio)``).
        num_blocks: parallel only: number of MaskBlocks.
        block_dim: parallel only: output width of each MaskBlock.
        mlp_hidden_units: parallel only: hidden widths of the MLP on the concatenated blocks.
        emb_norm: norm spec per field over D (``"none"``: no norm).
        net_norm: norm spec inside every MaskBlock.
        dropout: dropout after every MaskBlock (and every parallel MLP layer).
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
        variant: Literal["serial", "parallel"] = "serial",
        hidden_units: Sequence[int] = (400, 400, 400),
        reduction_ratio: float = 1.0,
        num_blocks: int = 2,
        block_dim: int = 500,
        mlp_hidden_units: Sequence[int] = (400, 400),
        emb_norm: Any = "none",
        net_norm: Any = "layernorm",
        dropout: float = 0.0,
        numeric_embedding: Literal["linear", "scaled", "bucket"] = "linear",
        bucket_boundaries: Sequence[Sequence[float]] | None = None,
        embedding_init_std: float = 1e-4,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant: expected 'serial' or 'parallel', got {variant!r}")
        if variant == "serial":
            if not hidden_units:
                raise ValueError("hidden_units: a serial MaskNet needs at least one block width")
            for i, units in enumerate(hidden_units):
                require_int(f"hidden_units[{i}]", units, low=1)
        else:
            require_int("num_blocks", num_blocks, low=1)
            require_int("block_dim", block_dim, low=1)
            for i, units in enumerate(mlp_hidden_units):
                require_int(f"mlp_hidden_units[{i}]", units, low=1)
        require_number("reduction_ratio", reduction_ratio, low=0.0, low_open=True)
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
        self.variant = variant
        flat = self.embedding.output_dim

        def block(hidden: int, out: int) -> MaskBlock:
            return MaskBlock(flat, hidden, out, reduction_ratio, net_norm, dropout)

        if variant == "serial":
            widths = [flat, *hidden_units]
            self.blocks = nn.ModuleList(
                block(widths[i], widths[i + 1]) for i in range(len(hidden_units))
            )
            self.head = nn.Linear(widths[-1], 1)
        else:
            self.blocks = nn.ModuleList(block(flat, block_dim) for _ in range(num_blocks))
            layers: list[nn.Module] = []
            width = block_dim * num_blocks
            for units in mlp_hidden_units:
                layers += [nn.Linear(width, units), nn.ReLU()]
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
                width = units
            layers.append(nn.Linear(width, 1))
            self.head = nn.Sequential(*layers)
        self.reset_parameters()

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B]`` for ``batch.categorical`` ``[B, Fc]`` int64 ids and ``batch.numeric``
        ``[B, Fn]``."""
        emb = self.embed(batch.categorical, batch.numeric)
        v_emb = emb.flatten(1)
        v_in = self.flat_input(emb)
        # every mask reads v_emb: their first layers run as one product (see the function)
        hidden = mask_hidden_layers(self.blocks, v_emb)
        if hidden is None:
            hidden = [None] * len(self.blocks)
        if self.variant == "serial":
            # each block's norm, ReLU and dropout run inside one node with what reads their
            # output (the next block's masked input, the head) where the modules are the
            # stock ones: see serial_logits
            return serial_logits(list(self.blocks), self.head, v_emb, v_in, hidden)
        h = torch.cat(
            [blk(v_emb, v_in, mask_hidden=m) for blk, m in zip(self.blocks, hidden, strict=True)],
            dim=1,
        )
        # the tower's ReLU + Dropout pairs fused, its last layer a matrix-vector product
        return sequential_logit(self.head, h)

    def mc_replay(self, batch: Batch) -> Callable[[int], torch.Tensor] | None:
        """Monte-Carlo passes that compute the deterministic prefix once
        (:func:`ctrcal.models.replay.masknet_replay`); None for a subclass with its own forward."""
        if type(self).forward is not MaskNet.forward:
            return None
        return masknet_replay(self, batch)
