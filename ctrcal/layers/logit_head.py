"""The last layer of a CTR model, ``Linear(width -> 1)``, as a matrix-vector product.

``nn.Linear(width, 1)`` runs as a matrix product with one output column (forward) and one
inner dimension (the input gradient ``[B, 1] x [1, width]``). GEMM libraries handle these
degenerate shapes poorly on the CPU: for B = 10000 rows of width 400 the three products of a
training step cost several times what the same work costs as ``addmv`` / ``mv`` / an outer
product, which run at memory speed. :func:`linear_logit` computes the same function with
those (autograd's ``addmv`` backward: the input gradient is ``outer(grad, w)``, the weight
gradient ``x^T · grad``), so only the summation order differs from ``layer(x)``.

:func:`layer_norm_relu_dropout_logit` goes one step further for MaskNet's last block: its
LayerNorm, ReLU, dropout and the head in one C pass each way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.dropout import (
    _draw_key,
    _keep_threshold,
    layer_norm_fusable,
    layer_norm_relu_dropout,
    run_sequential,
)
from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_stock

__all__ = ["layer_norm_relu_dropout_logit", "linear_logit", "sequential_logit"]


def linear_logit(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x).squeeze(-1)`` for a one-output ``nn.Linear``: logits ``[B]`` from ``[B, N]``.

    Any other layer (a replaced or hooked one, more outputs), input rank, device other than the
    CPU, or autocast (which decides the precision of ``nn.Linear`` itself) runs ``layer(x)``.
    """
    fusable = (
        is_stock(layer, nn.Linear)
        and layer.out_features == 1
        and x.dim() == 2
        # addmv / mv are torch ops: any dtype, nothing to build
        and fusable_on_cpu(x, layer.weight, dtypes=None, kernels=None)
    )
    if not fusable:
        return layer(x).squeeze(-1)
    weight = layer.weight[0]
    if layer.bias is None:
        return torch.mv(x, weight)
    return torch.addmv(layer.bias, x, weight)


def sequential_logit(head: nn.Module, x: Tensor) -> Tensor:
    """``head(x).squeeze(-1)`` for an ``nn.Sequential`` tower ending in a one-output linear:
    logits ``[B]`` from ``[B, N]``, every ReLU + Dropout pair run as one fused pass
    (:func:`~ctrcal.layers.dropout.run_sequential`) and the last layer as a matrix-vector
    product (:func:`linear_logit`). A head of another type, or with hooks, runs ``head(x)``.
    """
    if not is_stock(head, nn.Sequential):
        return linear_logit(head, x)
    *body, last = head
    return linear_logit(last, run_sequential(body, x))


_MIN_ROWS = 64  # rows per thread at least in the fused kernel


def layer_norm_relu_dropout_logit(
    x: Tensor, norm: nn.Module, p: float, training: bool, head: nn.Module
) -> Tensor:
    """``linear_logit(head, F.dropout(F.relu(norm(x)), p, training))``: a network's last
    LayerNorm, ReLU and dropout and its one-output head as ONE pass each way on the CPU.

    The activation between the dropout and the head is never stored: the C kernel
    (:mod:`ctrcal.layers.kernels.cpu_kernels`) normalises a row, applies the affine, the ReLU and
    the dropout mask of :func:`~ctrcal.layers.dropout.relu_dropout` (the same draw from
    torch's generator, so the same mask as the unfused layers) and sums the row against the
    head's weight. The backward reads only ``x`` (and two numbers per row) and recomputes the
    activation and the mask, where the unfused layers write, and read back, the activation,
    the head's ``[B, N]`` input gradient and their own intermediate tensors. Anything else --
    other modules, dtype or device, evaluation, ``p == 0``, no C compiler -- runs the layers.

    Args:
        x: ``[B, N]`` input of the norm.
        norm: an ``nn.LayerNorm(N)`` with affine weight and bias.
        p: dropout rate; training: whether dropout is active.
        head: an ``nn.Linear(N, 1)``.

    Returns:
        Logits ``[B]``.
    """
    fusable = (
        layer_norm_fusable(x, norm, p, training)
        and is_stock(head, nn.Linear)
        and head.out_features == 1
        and head.in_features == x.shape[1]
        and fusable_on_cpu(head.weight, kernels=cpu_kernels)
    )
    if not fusable:
        return linear_logit(head, layer_norm_relu_dropout(x, norm, p, training))
    logit = _LayerNormReLUDropoutLogitFn.apply(
        x.contiguous(), norm.weight, norm.bias, head.weight, norm.eps, p
    )
    return logit if head.bias is None else logit + head.bias


class _LayerNormReLUDropoutLogitFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, head_weight, eps, p):  # type: ignore[override]
        lib = cpu_kernels()
        rows, n = x.shape
        scale = 1.0 / (1.0 - p)
        key, threshold = _draw_key(), _keep_threshold(p)
        hw = head_weight.detach().reshape(n).contiguous()
        logit = torch.empty(rows, dtype=x.dtype)
        mean = torch.empty(rows, dtype=x.dtype)
        rstd = torch.empty(rows, dtype=x.dtype)
        Chunks(rows, _MIN_ROWS).run(
            lib,
            "ln_relu_dropout_logit_fwd_f32",
            x.data_ptr(),
            weight.data_ptr(),
            bias.data_ptr(),
            hw.data_ptr(),
            logit.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            n,
            eps,
            key,
            threshold,
            scale,
        )
        ctx.key, ctx.threshold, ctx.scale = key, threshold, scale
        ctx.save_for_backward(x, weight, bias, hw, mean, rstd)
        return logit

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight, bias, hw, mean, rstd = ctx.saved_tensors
        lib = cpu_kernels()
        rows, n = x.shape
        grad = grad.contiguous()
        dx = torch.empty_like(x)
        chunks = Chunks(rows, _MIN_ROWS)
        dw, db, dhw = (chunks.partials(n) for _ in range(3))  # parameter gradients, per chunk
        chunks.run(
            lib,
            "ln_relu_dropout_logit_bwd_f32",
            grad.data_ptr(),
            x.data_ptr(),
            weight.data_ptr(),
            bias.data_ptr(),
            hw.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            dx.data_ptr(),
            dw.data_ptr(),
            db.data_ptr(),
            dhw.data_ptr(),
            n,
            ctx.key,
            ctx.threshold,
            ctx.scale,
        )
        return dx, dw.sum(0), db.sum(0), dhw.sum(0).view(1, n), None, None
