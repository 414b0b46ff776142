"""MaskBlock: the building block of MaskNet (Wang et al. 2021), with a pluggable norm.

A MaskBlock multiplies its input by an *instance-guided mask* computed from the raw flattened
feature embedding of the same row, then applies a linear layer, a norm, ReLU and dropout::

    mask = W2 · ReLU(W1 · v_emb + b1) + b2              [B, hidden_dim]  (no sigmoid)
    out  = Dropout(ReLU(Norm(W3 · (mask ⊙ v_hidden))))   [B, output_dim]  (W3 without bias)

``W1`` has ``floor(hidden_dim * reduction_ratio)`` outputs (at least 1). This follows FuxiCTR's
implementation, which the MC-LayerNorm paper trained on Criteo; there the norm is a LayerNorm,
here it is any registry norm (``norm_layer="mclayernorm"``, a class, a partial or a
``NormSpec``; ``"none"`` leaves it out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.dropout import (
    _draw_key,
    _keep_threshold,
    layer_norm_fusable,
    layer_norm_relu_dropout,
    relu_dropout,
)
from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_layer_norm, is_stock, unhooked
from ctrcal.layers.logit_head import layer_norm_relu_dropout_logit, linear_logit
from ctrcal.layers.registry import create_norm

_MIN_ROWS = 64  # rows per thread at least in the masked-input kernel


def reduced_width(width: int, reduction_ratio: float) -> int:
    """``floor(width * reduction_ratio)``, at least 1, robust to float error (0.29*100)."""
    return max(1, math.floor(width * reduction_ratio + 1e-9))


def mask_hidden_layers(
    blocks: Sequence[MaskBlock], v_emb: torch.Tensor
) -> list[torch.Tensor] | None:
    """``ReLU(W1_i · v_emb + b1_i)`` for every block ``i``, computed as ONE matrix product.

    Every MaskBlock of a MaskNet reads the same ``v_emb``, and each mask's first layer is
    narrow (``hidden * reduction_ratio`` units, 80 in the BARS setting): one product with the
    blocks' weights stacked (``[B, F*D] x [F*D, sum of widths]``) runs at a much higher
    GEMM efficiency than one narrow product per block, and in the backward pass the
    gradient with respect to ``v_emb`` is one product too instead of one per block plus
    their sum. The parameters stay the blocks' own (stacked at every call, which costs a
    copy of a few hundred kilobytes), so checkpoints and optimizers see no difference; the
    results equal the per-block products up to float reassociation.

    Args:
        blocks: MaskBlocks whose masks read ``v_emb``.
        v_emb: ``[B, input_dim]``, the same ``input_dim`` for every block.

    Returns:
        Per block its ``[B, mask_width_i]`` activations (each contiguous on the CPU in
        float32, where :class:`_MaskHiddenFn` computes them; column views of one tensor
        elsewhere), or
        ``None`` when a block's mask layer is not the stock ``Linear -> ReLU -> Linear`` (a
        user replaced or hooked it): the caller then runs the blocks one by one.
    """
    firsts = []
    for blk in blocks:
        first, act = blk.mask_layer[0], blk.mask_layer[1]
        if not (is_stock(first, nn.Linear) and is_stock(act, nn.ReLU) and first.bias is not None):
            return None
        firsts.append(first)
    if len(firsts) == 1:
        weight, bias = firsts[0].weight, firsts[0].bias
    else:
        weight = torch.cat([f.weight for f in firsts])
        bias = torch.cat([f.bias for f in firsts])
    widths = tuple(f.out_features for f in firsts)
    if v_emb.dim() == 2 and fusable_on_cpu(v_emb, weight, kernels=cpu_kernels):
        return list(_MaskHiddenFn.apply(v_emb.contiguous(), weight, bias, widths))
    # in place: addmm's backward does not need its output, ReLU's backward needs only its own
    hidden = torch.relu_(F.linear(v_emb, weight, bias))
    return list(hidden.split(widths, dim=1))


class _MaskHiddenFn(torch.autograd.Function):
    """``ReLU(v_emb @ W^T + b)`` split by block, with the bias, the ReLU and the split in one
    C pass (each block's activations contiguous, as the next products like them), and in the
    backward the blocks' gradients joined, masked by the ReLU and summed for the bias in one
    pass (instead of a concatenation, the ReLU's backward and the bias gradient's sum)."""

    @staticmethod
    def forward(ctx, v_emb, weight, bias, widths):  # type: ignore[override]
        lib = cpu_kernels()
        t = v_emb @ weight.t()  # the bias joins in the kernel, not in the matrix product
        rows = t.shape[0]
        h = torch.empty(rows * t.shape[1], dtype=t.dtype)  # the blocks' matrices, one by one
        w = torch.tensor(widths, dtype=torch.int64)
        Chunks(rows, _MIN_ROWS).run(
            lib,
            "mask_hidden_fwd_f32",
            t.data_ptr(),
            bias.data_ptr(),
            h.data_ptr(),
            rows,
            len(widths),
            w.data_ptr(),
        )
        ctx.save_for_backward(v_emb, weight, h, w)
        outs = h.split([rows * k for k in widths])
        return tuple(o.view(rows, k) for o, k in zip(outs, widths, strict=True))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):  # type: ignore[override]
        v_emb, weight, h, w = ctx.saved_tensors
        lib = cpu_kernels()
        rows, width = v_emb.shape[0], weight.shape[0]
        grads = [g.contiguous() for g in grads]
        g_ptrs = torch.tensor([g.data_ptr() for g in grads], dtype=torch.int64)
        dt = torch.empty(rows, width, dtype=h.dtype)
        chunks = Chunks(rows, _MIN_ROWS)
        db = chunks.partials(width)  # the bias gradient, per chunk
        chunks.run(
            lib,
            "mask_hidden_bwd_f32",
            g_ptrs.data_ptr(),
            h.data_ptr(),
            dt.data_ptr(),
            db.data_ptr(),
            rows,
            len(grads),
            w.data_ptr(),
        )
        dv = dt @ weight if ctx.needs_input_grad[0] else None
        dw = dt.t() @ v_emb if ctx.needs_input_grad[1] else None
        return dv, dw, db.sum(0), None


class _MaskedInputFn(torch.autograd.Function):
    """``(a @ W^T + b) * v`` with the bias add and the product in one C pass each way."""

    @staticmethod
    def forward(ctx, a, weight, bias, v):  # type: ignore[override]
        lib = cpu_kernels()
        t = a @ weight.t()  # the bias joins in the kernel, not in the matrix product
        z = torch.empty_like(t)
        rows, n = t.shape
        Chunks(rows, _MIN_ROWS).run(
            lib,
            "masked_input_fwd_f32",
            t.data_ptr(),
            bias.data_ptr(),
            v.data_ptr(),
            z.data_ptr(),
            n,
        )
        ctx.save_for_backward(a, weight, bias, v, t)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        a, weight, bias, v, t = ctx.saved_tensors
        lib = cpu_kernels()
        grad = grad.contiguous()
        rows, n = t.shape
        dt, dv = torch.empty_like(t), torch.empty_like(v)
        chunks = Chunks(rows, _MIN_ROWS)
        db = chunks.partials(n)  # the bias gradient, per chunk
        chunks.run(
            lib,
            "masked_input_bwd_f32",
            grad.data_ptr(),
            t.data_ptr(),
            bias.data_ptr(),
            v.data_ptr(),
            dt.data_ptr(),
            dv.data_ptr(),
            db.data_ptr(),
            n,
        )
        da = dt @ weight if ctx.needs_input_grad[0] else None
        dw = dt.t() @ a if ctx.needs_input_grad[1] else None
        return da, dw, db.sum(0), dv


def masked_input(layer: nn.Linear, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``layer(a) * v``: the mask (the mask generator's last layer) applied to the input.

    On the CPU in float32 the bias add and the product run as one C pass, and the backward
    computes both products' gradients and the bias gradient in one pass over the output
    gradient (instead of two products, and the bias gradient's own pass over their first):
    see :mod:`ctrcal.layers.kernels.cpu_kernels`. Anything else runs ``layer(a) * v``.

    Shapes:
        a: ``[B, mask_width]``; v: ``[B, hidden_dim]``; output ``[B, hidden_dim]``.
    """
    fusable = (
        is_stock(layer, nn.Linear)
        and layer.bias is not None
        and a.dim() == 2
        and v.shape == (a.shape[0], layer.out_features)
        and fusable_on_cpu(a, v, layer.weight, kernels=cpu_kernels)
    )
    if not fusable:
        return layer(a) * v
    return _MaskedInputFn.apply(a, layer.weight, layer.bias, v.contiguous())


class MaskBlock(nn.Module):
    """Instance-guided mask ⊙ hidden input -> Linear -> Norm -> ReLU -> Dropout.

    Args:
        input_dim: width of the flattened raw embedding the mask reads (F * D).
        hidden_dim: width of the masked input ``v_hidden``.
        output_dim: width of the block's output.
        reduction_ratio: the mask's first layer has ``floor(hidden_dim * ratio)`` units.
        norm_layer: norm spec for ``create_norm(norm_layer, output_dim)``.
        dropout: dropout rate after the activation (0: none).

    Shapes:
        v_emb: ``[B, input_dim]``; v_hidden: ``[B, hidden_dim]``; output: ``[B, output_dim]``.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        reduction_ratio: float = 1.0,
        norm_layer: Any = "layernorm",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if min(input_dim, hidden_dim, output_dim) < 1:
            raise ValueError(
                f"MaskBlock widths must be >= 1, got input {input_dim}, hidden {hidden_dim}, "
                f"output {output_dim}"
            )
        if reduction_ratio <= 0:
            raise ValueError(f"reduction_ratio must be > 0, got {reduction_ratio}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.input_dim, self.hidden_dim, self.output_dim = input_dim, hidden_dim, output_dim
        self.mask_layer = nn.Sequential(
            nn.Linear(input_dim, reduced_width(hidden_dim, reduction_ratio)),
            nn.ReLU(),
            nn.Linear(reduced_width(hidden_dim, reduction_ratio), hidden_dim),
        )
        self.hidden_layer = nn.Linear(hidden_dim, output_dim, bias=False)
        self.norm = create_norm(norm_layer, output_dim)
        self.activation = nn.ReLU()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(
        self,
        v_emb: torch.Tensor | None,
        v_hidden: torch.Tensor,
        mask_hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mask ``v_hidden`` [B, hidden_dim] with a mask read from ``v_emb`` [B, input_dim].

        ``mask_hidden`` [B, mask_width], when given, is ``ReLU(W1 · v_emb + b1)`` already
        computed (by :func:`mask_hidden_layers` for several blocks at once); ``v_emb`` is then
        not read.
        """
        return self.post_norm(self.pre_norm(v_emb, v_hidden, mask_hidden))

    def post_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The block from its norm on: ``Dropout(ReLU(Norm(h)))``, ``[B, output_dim]``."""
        if is_stock(self.activation, nn.ReLU) and is_stock(self.dropout, nn.Dropout):
            # one fused node with a cheaper mask (same dropout in law), with the LayerNorm in
            # it where the norm is one: ctrcal.layers.dropout
            p, training = self.dropout.p, self.dropout.training
            if is_layer_norm(self.norm):
                return layer_norm_relu_dropout(h, self.norm, p, training)
            return relu_dropout(self.norm(h), p, training)
        return self.dropout(self.activation(self.norm(h)))

    def pre_norm(
        self,
        v_emb: torch.Tensor | None,
        v_hidden: torch.Tensor,
        mask_hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The block up to its norm: ``W3 · (mask ⊙ v_hidden)``, ``[B, output_dim]``."""
        if mask_hidden is None:
            mask_hidden = self.mask_layer[1](self.mask_layer[0](v_emb))
        return self.hidden_layer(masked_input(self.mask_layer[2], mask_hidden, v_hidden))

    def forward_logit(
        self,
        v_emb: torch.Tensor | None,
        v_hidden: torch.Tensor,
        head: nn.Module,
        mask_hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[B]``: ``head`` (a one-output layer) applied to the block's output.

        For a network's last block. Where the block ends in the stock LayerNorm, ReLU and
        dropout modules (and nobody hooked the block), those and the head run as one fused
        node (:func:`~ctrcal.layers.logit_head.layer_norm_relu_dropout_logit`); otherwise
        this is ``linear_logit(head, self(v_emb, v_hidden, mask_hidden))``.
        """
        if not self.fusable_tail():
            return linear_logit(head, self(v_emb, v_hidden, mask_hidden=mask_hidden))
        return self.logit_from_pre_norm(self.pre_norm(v_emb, v_hidden, mask_hidden), head)

    def fusable_tail(self) -> bool:
        """Whether the block ends in the stock LayerNorm, ReLU and dropout modules and nobody
        hooked it: then its tail may run inside fused nodes with what follows it."""
        return (
            is_layer_norm(self.norm)
            and is_stock(self.activation, nn.ReLU)
            and is_stock(self.dropout, nn.Dropout)
            and unhooked(self)
        )

    def logit_from_pre_norm(self, h: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """``linear_logit(head, self.post_norm(h))`` as one fused node (a fusable tail)."""
        p, training = self.dropout.p, self.dropout.training
        return layer_norm_relu_dropout_logit(h, self.norm, p, training, head)

    def masked_by_next(
        self, h: torch.Tensor, nxt: MaskBlock, mask_hidden: torch.Tensor
    ) -> torch.Tensor:
        """``masked_input(nxt.mask_layer[2], mask_hidden, self.post_norm(h))``: the next
        block's masked input of this block's output, as one fused node (a fusable tail)."""
        p, training = self.dropout.p, self.dropout.training
        return layer_norm_relu_dropout_masked(
            h, self.norm, p, training, nxt.mask_layer[2], mask_hidden
        )


def fused_route(blocks: Sequence[nn.Module]) -> bool:
    """Whether :func:`serial_logits` runs the blocks' tails fused with what reads them: every
    block a plain :class:`MaskBlock` with a fusable tail."""
    return all(type(b) is MaskBlock and b.fusable_tail() for b in blocks)


def serial_logits(
    blocks: Sequence[MaskBlock],
    head: nn.Module,
    v_emb: torch.Tensor,
    v_in: torch.Tensor,
    hidden: Sequence[torch.Tensor | None],
) -> torch.Tensor:
    """Logits ``[B]`` of MaskBlocks in series (each block's output is the next one's
    ``v_hidden``, the first one's is ``v_in``) followed by a one-output ``head``.

    A block's output feeds nothing but the next block's masked input (or the head), so where
    every block is a plain :class:`MaskBlock` with a fusable tail, each block's LayerNorm,
    ReLU and dropout run inside one node with the next block's masked input
    (:func:`layer_norm_relu_dropout_masked`) and the last one's with the head
    (:func:`~ctrcal.layers.logit_head.layer_norm_relu_dropout_logit`): the blocks' outputs
    are never stored, and neither are their gradients. Otherwise the blocks run as modules.

    Args:
        blocks: the MaskBlocks, in order.
        head: the one-output layer after the last block.
        v_emb: ``[B, input_dim]``, read by every mask.
        v_in: ``[B, hidden_dim of the first block]``.
        hidden: per block its mask's first-layer activations, or None (computed here).
    """
    if not fused_route(blocks):
        h = v_in
        for blk, m in zip(blocks[:-1], hidden[:-1], strict=True):
            h = blk(v_emb, h, mask_hidden=m)
        last = blocks[-1]
        if type(last) is MaskBlock:
            return last.forward_logit(v_emb, h, head, mask_hidden=hidden[-1])
        return linear_logit(head, last(v_emb, h, mask_hidden=hidden[-1]))
    h = blocks[0].pre_norm(v_emb, v_in, hidden[0])
    for prev, blk, m in zip(blocks[:-1], blocks[1:], hidden[1:], strict=True):
        if m is None:
            m = blk.mask_layer[1](blk.mask_layer[0](v_emb))
        h = blk.hidden_layer(prev.masked_by_next(h, blk, m))
    return blocks[-1].logit_from_pre_norm(h, head)


def layer_norm_relu_dropout_masked(
    x: torch.Tensor,
    norm: nn.Module,
    p: float,
    training: bool,
    layer: nn.Module,
    a: torch.Tensor,
) -> torch.Tensor:
    """``masked_input(layer, a, F.dropout(F.relu(norm(x)), p, training))`` as ONE node.

    One block's LayerNorm, ReLU and dropout and the next block's masked input: the C kernel
    (:mod:`ctrcal.layers.kernels.cpu_kernels`) normalises a row of ``x``, applies the affine, the
    ReLU and the dropout mask of :func:`~ctrcal.layers.dropout.relu_dropout` (the same draw from
    torch's generator, so the same mask as the modules) and multiplies by the mask
    ``layer(a)``; the backward recomputes the activation from ``x``. Compared with the two
    fused nodes it replaces, the activation and its gradient are neither written nor read
    back (four fewer passes over ``[B, N]`` backward, two forward). Anything else -- other
    modules, dtype or device, evaluation, ``p == 0``, no C compiler -- runs the layers.

    Shapes:
        x: ``[B, N]``; a: ``[B, mask_width]``; output ``[B, N]``.
    """
    fusable = (
        layer_norm_fusable(x, norm, p, training)
        and is_stock(layer, nn.Linear)
        and layer.bias is not None
        and a.dim() == 2
        and a.shape[0] == x.shape[0]
        and layer.out_features == x.shape[1]
        and fusable_on_cpu(a, layer.weight, kernels=cpu_kernels)
    )
    if not fusable:
        return masked_input(layer, a, layer_norm_relu_dropout(x, norm, p, training))
    return _NormMaskedInputFn.apply(
        x.contiguous(), norm.weight, norm.bias, a, layer.weight, layer.bias, norm.eps, p
    )


def mask_products(layer: nn.Module, a: torch.Tensor) -> torch.Tensor | None:
    """``a @ layer.weight^T`` [B, hidden_dim] where :func:`masked_input` (and the fused node
    of :func:`layer_norm_relu_dropout_masked`) compute the mask ``layer(a)`` as that product
    plus the bias in a C pass (for a masked input of ``a``'s dtype and device, as in a
    MaskNet); None where they run ``layer(a)`` itself.

    Monte-Carlo passes compute a mask once per batch and reuse it for every pass
    (:mod:`ctrcal.models.replay`): from this product the reused mask is bit for bit the one
    each pass would have computed.
    """
    fusable = (
        is_stock(layer, nn.Linear)
        and layer.bias is not None
        and a.dim() == 2
        and fusable_on_cpu(a, layer.weight, kernels=cpu_kernels)
    )
    return a @ layer.weight.t() if fusable else None


def layer_norm_relu_dropout_masked_rows(
    x: torch.Tensor,
    norm: nn.Module,
    p: float,
    training: bool,
    layer: nn.Module,
    t: torch.Tensor,
) -> torch.Tensor | None:
    """:func:`layer_norm_relu_dropout_masked` without autograd from the mask's product
    ``t = a @ layer.weight^T`` [rows, N] (:func:`mask_products`, repeated for the rows of
    ``x``), or None where that function would not run its fused node."""
    fusable = (
        layer_norm_fusable(x, norm, p, training)
        and is_stock(layer, nn.Linear)
        and layer.bias is not None
        and t.shape == x.shape
        and fusable_on_cpu(t, layer.weight, kernels=cpu_kernels)
    )
    if not fusable:
        return None
    x, t = x.contiguous(), t.contiguous()
    return _norm_masked_forward(x, norm.weight, norm.bias, t, layer.bias, norm.eps, p)[0]


def _norm_masked_forward(x, weight, bias, t, mask_bias, eps, p):
    """The C forward of :class:`_NormMaskedInputFn` from the mask's product ``t``:
    ``(z, mean, rstd, key, threshold, scale)``."""
    lib = cpu_kernels()
    rows, n = x.shape
    scale = 1.0 / (1.0 - p)
    key, threshold = _draw_key(), _keep_threshold(p)
    z = torch.empty_like(x)
    mean = torch.empty(rows, dtype=x.dtype)
    rstd = torch.empty(rows, dtype=x.dtype)
    pointers = (x, weight, bias, t, mask_bias, z, mean, rstd)
    Chunks(rows, _MIN_ROWS).run(
        lib,
        "ln_relu_dropout_mask_fwd_f32",
        *(a.data_ptr() for a in pointers),
        n,
        eps,
        key,
        threshold,
        scale,
    )
    return z, mean, rstd, key, threshold, scale


class _NormMaskedInputFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, a, mask_weight, mask_bias, eps, p):  # type: ignore[override]
        t = a @ mask_weight.t()  # the mask's bias joins in the kernel
        z, mean, rstd, key, threshold, scale = _norm_masked_forward(
            x, weight, bias, t, mask_bias, eps, p
        )
        ctx.key, ctx.threshold, ctx.scale = key, threshold, scale
        ctx.save_for_backward(x, weight, bias, a, mask_weight, mask_bias, t, mean, rstd)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight, bias, a, mask_weight, mask_bias, t, mean, rstd = ctx.saved_tensors
        lib = cpu_kernels()
        rows, n = x.shape
        grad = grad.contiguous()
        dx, dt = torch.empty_like(x), torch.empty_like(t)
        chunks = Chunks(rows, _MIN_ROWS)
        dw, db, dc = (chunks.partials(n) for _ in range(3))  # the vector gradients, per chunk
        chunks.run(
            lib,
            "ln_relu_dropout_mask_bwd_f32",
            grad.data_ptr(),
            x.data_ptr(),
            weight.data_ptr(),
            bias.data_ptr(),
            t.data_ptr(),
            mask_bias.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            dx.data_ptr(),
            dt.data_ptr(),
            dw.data_ptr(),
            db.data_ptr(),
            dc.data_ptr(),
            n,
            ctx.key,
            ctx.threshold,
            ctx.scale,
        )
        da = dt @ mask_weight if ctx.needs_input_grad[3] else None
        dmw = dt.t() @ a if ctx.needs_input_grad[4] else None
        return dx, dw.sum(0), db.sum(0), da, dmw, dc.sum(0), None, None
