"""Monte-Carlo passes that share what is deterministic: the built-in models' ``mc_replay``.

The MC pass loop (:func:`ctrcal.layers.mc_layernorm.predict.sample_probabilities`) asks a
model for ``mc_replay(batch)``. The model computes the part of its forward before its first
stochastic layer once -- the embedding lookup, norms that do not sample, every MaskBlock's
instance-guided mask (it reads the raw embedding alone), the layers up to the first sampling
one -- and returns ``replay(s)``: the logits ``[s * B]`` of ``s`` passes (pass-major: rows
``i * B .. (i + 1) * B - 1`` are pass ``i``) that run only the rest, on the prefix's output
repeated ``s`` times. These are the logits of ``model(batch repeated s times)``, the full
passes the loop runs for other models: the stochastic layers see the same rows in the same
order and draw from torch's RNG in the same order, and a deterministic layer computes a row
as it does in the larger batch (bit for bit where a matrix product's rows do not depend on
the number of rows, as on the CPU; the tests check it for every model kind).

Which layers sample is read from the modules at call time (:func:`samples`): MC-LayerNorm in
:func:`~ctrcal.layers.mc_layernorm.mc_mode`, dropout kept training by MC-Dropout. A model
whose structure a replay cannot vouch for (a subclass with its own forward, a hooked model or
block, a replaced mask layer) gets None, and the loop runs full passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ctrcal.core.batch import Batch
from ctrcal.layers.dropout import run_sequential
from ctrcal.layers.kernels.fusion import is_stock, unhooked
from ctrcal.layers.logit_head import linear_logit, sequential_logit
from ctrcal.layers.mask_block import (
    MaskBlock,
    fused_route,
    layer_norm_relu_dropout_masked_rows,
    mask_hidden_layers,
    mask_products,
)
from ctrcal.layers.mlp import MLP

__all__ = ["Replay", "dcnv2_replay", "dnn_replay", "first_sampling", "masknet_replay", "samples"]

Replay = Callable[[int], Tensor]
"""``replay(s)``: logits ``[s * B]`` of ``s`` stochastic passes, pass-major."""


def samples(*modules: nn.Module | None) -> bool:
    """Whether a pass through ``modules`` may draw: one of their modules is in training mode
    (dropout under MC-Dropout) or has its ``mc_sampling`` flag set (MC-LayerNorm)."""
    return any(
        m.training or getattr(m, "mc_sampling", False)
        for module in modules
        if module is not None
        for m in module.modules()
    )


def first_sampling(layers: Sequence[nn.Module]) -> int:
    """Index of the first of ``layers`` that samples (``len(layers)``: none). A stock ReLU
    just before a sampling stock Dropout goes with it: :func:`run_sequential` runs the pair as
    one fused node, whose draws a replay must keep."""
    for i, layer in enumerate(layers):
        if samples(layer):
            if i > 0 and is_stock(layer, nn.Dropout) and is_stock(layers[i - 1], nn.ReLU):
                return i - 1
            return i
    return len(layers)


def repeat_rows(x: Tensor, s: int) -> Tensor:
    """``x`` [B, ...] repeated ``s`` times along the rows: [s * B, ...], pass-major."""
    return x if s == 1 else x.repeat(s, *([1] * (x.dim() - 1)))


def _once(logits: Tensor) -> Replay:
    """The replay of a model in which nothing samples: its logits, repeated."""
    return lambda s: repeat_rows(logits, s)


class _BlockMask:
    """A MaskBlock's instance-guided mask ``[B, N]`` for a batch, computed once and applied to
    every pass as :func:`~ctrcal.layers.mask_block.masked_input` applies it."""

    def __init__(self, layer: nn.Module, a: Tensor) -> None:
        self.layer = layer
        # the C paths add the bias to this product in float32: the same sum, the same mask
        self.product = mask_products(layer, a)
        self.mask = layer(a) if self.product is None else self.product + layer.bias

    def apply(self, v: Tensor, s: int) -> Tensor:
        """``mask ⊙ v`` for ``v`` ``[s * B, N]``."""
        if s == 1:
            return v * self.mask
        return (v.view(s, -1, v.shape[1]) * self.mask).view(v.shape)


def masknet_replay(model: nn.Module, batch: Batch) -> Replay | None:
    """:data:`Replay` of a serial or parallel :class:`~ctrcal.models.masknet.MaskNet` (whose
    own forward it is: the caller checks)."""
    blocks = list(model.blocks)
    if (
        not unhooked(model)
        or not all(type(b) is MaskBlock and unhooked(b) for b in blocks)
        or samples(model.embedding, *(m for b in blocks for m in (b.mask_layer, b.hidden_layer)))
    ):
        return None
    emb = model.embedding(batch.categorical, batch.numeric)
    hidden = mask_hidden_layers(blocks, emb.flatten(1))
    if hidden is None:
        return None
    masks = [_BlockMask(b.mask_layer[2], a) for b, a in zip(blocks, hidden, strict=True)]

    def v_in(e: Tensor) -> Tensor:
        return e.flatten(1) if model.emb_norm is None else model.emb_norm(e).flatten(1)

    if model.variant == "serial":
        return _serial_replay(model, blocks, masks, emb, v_in)
    return _parallel_replay(model, blocks, masks, emb, v_in)


def _serial_replay(model, blocks, masks, emb, v_in) -> Replay | None:
    """A serial MaskNet: ``h`` is the input of a block's norm, from which the block's tail
    (norm, ReLU, dropout) and the next block's masked linear layer lead to the next ``h``,
    through the same nodes :func:`~ctrcal.layers.mask_block.serial_logits` runs."""
    head, last, fused = model.head, blocks[-1], fused_route(blocks)
    if samples(head):
        return None

    def step(i: int, h: Tensor, s: int) -> Tensor:
        blk, nxt, mask = blocks[i], blocks[i + 1], masks[i + 1]
        z = None
        if fused and mask.product is not None:
            t = repeat_rows(mask.product, s)
            p, training = blk.dropout.p, blk.dropout.training
            z = layer_norm_relu_dropout_masked_rows(h, blk.norm, p, training, mask.layer, t)
        if z is None:
            z = mask.apply(blk.post_norm(h), s)
        return nxt.hidden_layer(z)

    def run(start: int, h: Tensor, s: int) -> Tensor:
        for i in range(start, len(blocks) - 1):
            h = step(i, h, s)
        if last.fusable_tail():
            return last.logit_from_pre_norm(h, head)
        return linear_logit(head, last.post_norm(h))

    def first(v: Tensor, s: int) -> Tensor:
        return blocks[0].hidden_layer(masks[0].apply(v, s))

    if samples(model.emb_norm):
        return lambda s: run(0, first(v_in(repeat_rows(emb, s)), s), s)
    h = first(v_in(emb), 1)
    start = next(
        (i for i, b in enumerate(blocks) if samples(b.norm, b.activation, b.dropout)), None
    )
    if start is None:
        return _once(run(0, h, 1))
    for i in range(start):
        h = step(i, h, 1)
    return lambda s: run(start, repeat_rows(h, s), s)


def _parallel_replay(model, blocks, masks, emb, v_in) -> Replay | None:
    """A parallel MaskNet: every block reads ``v_in``; their outputs, joined, feed the head
    (a tower whose ReLU + Dropout pairs run fused)."""
    head = model.head

    def pre(v: Tensor, s: int) -> list[Tensor]:
        return [b.hidden_layer(m.apply(v, s)) for b, m in zip(blocks, masks, strict=True)]

    def tails(pres: list[Tensor]) -> Tensor:
        return torch.cat([b.post_norm(h) for b, h in zip(blocks, pres, strict=True)], dim=1)

    if samples(model.emb_norm):
        return lambda s: sequential_logit(head, tails(pre(v_in(repeat_rows(emb, s)), s)))
    pres = pre(v_in(emb), 1)
    if any(samples(b.norm, b.activation, b.dropout) for b in blocks):
        return lambda s: sequential_logit(head, tails([repeat_rows(h, s) for h in pres]))
    h = tails(pres)
    if not is_stock(head, nn.Sequential):
        return (lambda s: linear_logit(head, repeat_rows(h, s))) if samples(head) else None
    *body, last = head
    if samples(last):
        return None
    i = first_sampling(body)
    x = run_sequential(body[:i], h)
    if i == len(body):
        return _once(linear_logit(last, x))
    return lambda s: linear_logit(last, run_sequential(body[i:], repeat_rows(x, s)))


def _tower_split(tower: MLP | None, x: Tensor) -> tuple[list[nn.Module], Tensor | None]:
    """An MLP's layers from its first sampling one, and its output up to there (None: no
    tower)."""
    if tower is None:
        return [], None
    layers = list(tower.layers)
    i = first_sampling(layers)
    return layers[i:], run_sequential(layers[:i], x)


def dnn_replay(model: nn.Module, batch: Batch) -> Replay | None:
    """:data:`Replay` of a :class:`~ctrcal.models.dnn.DNN` (whose own forward it is: the caller
    checks)."""
    if not unhooked(model) or not is_stock(model.mlp, MLP) or samples(model.embedding):
        return None
    emb = model.embedding(batch.categorical, batch.numeric)
    layers = list(model.mlp.layers)
    if samples(model.emb_norm):
        return lambda s: run_sequential(
            layers, model.emb_norm(repeat_rows(emb, s)).flatten(1)
        ).squeeze(-1)
    x = emb.flatten(1) if model.emb_norm is None else model.emb_norm(emb).flatten(1)
    rest, x = _tower_split(model.mlp, x)
    if not rest:
        return _once(x.squeeze(-1))
    return lambda s: run_sequential(rest, repeat_rows(x, s)).squeeze(-1)


def dcnv2_replay(model: nn.Module, batch: Batch) -> Replay | None:
    """:data:`Replay` of a :class:`~ctrcal.models.dcnv2.DCNv2` (whose own forward it is: the
    caller checks)."""
    towers = (model.stacked_dnn, model.parallel_dnn)
    if (
        not unhooked(model)
        or not all(t is None or is_stock(t, MLP) for t in towers)
        or samples(model.embedding, model.head)
    ):
        return None
    emb = model.embedding(batch.categorical, batch.numeric)
    if samples(model.emb_norm, model.cross):
        return lambda s: model.from_embedding(repeat_rows(emb, s))
    x0 = emb.flatten(1) if model.emb_norm is None else model.emb_norm(emb).flatten(1)
    cross = model.cross(x0)
    stacked, hs = _tower_split(model.stacked_dnn, cross)
    if hs is None:  # no tower on the cross network
        hs = cross
    parallel, hp = _tower_split(model.parallel_dnn, x0)

    def logits(s: int) -> Tensor:
        h = run_sequential(stacked, repeat_rows(hs, s))
        if hp is not None:
            h = torch.cat([h, run_sequential(parallel, repeat_rows(hp, s))], dim=1)
        return model.head(h).squeeze(-1)

    # the head runs on the repeated rows even where nothing samples: a one-output product's
    # rows may round differently at another number of rows
    return logits
