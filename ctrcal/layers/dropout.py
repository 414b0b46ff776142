"""ReLU followed by inverted dropout, fused into one autograd node with a cheap mask on the CPU.

``relu_dropout(x, p, training)`` computes ``F.dropout(F.relu(x), p, training)``: in training
every element is kept independently with probability ``1 - p`` and scaled by ``1 / (1 - p)``;
in eval mode it is a ReLU. Layers keep their ``nn.ReLU`` and ``nn.Dropout`` modules (so
anything that finds and switches ``nn.Dropout`` modules, like MC-Dropout, still works) and
call this function with the dropout module's ``p`` and ``training``. What differs from the two
stock operators is the cost on the CPU:

* **The mask.** ``torch.bernoulli_`` draws one random number per element through a generic
  path (about 10 ns per element on a Zen 4 core, 40 ms for a 10000 x 400 activation). Here
  element ``i`` (flat index) is kept when ``u_i < t`` for ``t = round((1 - p) * 2**32)`` and
  ``u_i`` the high 32 bits of SplitMix64's output function applied to ``key + (i + 1) *
  0x9E3779B97F4A7C15`` (SplitMix64's own counter sequence), so the keep rate is ``1 - p`` to
  within 2**-32 (finer than float32 uniforms). ``key`` is one 63-bit draw from torch's
  default generator per call: ``torch.manual_seed`` therefore fixes every mask, and
  saving/restoring torch's RNG state (as checkpoints do) replays them; different seeds give
  independent masks. Every ``u_i`` is a pure function of ``(key, i)``, so no random state
  is carried from element to element.
* **The kernel.** On the CPU a small C kernel (:mod:`ctrcal.layers.kernels.cpu_kernels`, compiled
  once per machine like the MC-LayerNorm kernel) computes the draw, the ReLU and the scaling
  in one vectorised pass over the activation, and the backward in another, on chunks in
  parallel. Without a C compiler the same masks come from the same function written in
  torch (slower, identical results).
* **The node.** The backward is ``grad * scale`` where the output is positive and 0
  elsewhere: the output (saved anyway as the next layer's input) is all it needs, so no mask
  is stored and ReLU's own backward pass disappears.

Other devices (CUDA has a fused dropout kernel), ``p == 0`` and graphs that ``torch.compile``
traces take the stock operators.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_layer_norm, is_stock, unhooked

__all__ = [
    "dropout_keep_mask",
    "layer_norm_fusable",
    "layer_norm_relu_dropout",
    "relu_dropout",
    "run_sequential",
]

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MIN_CHUNK = 1 << 16  # elements per thread at least (below that a thread costs more)
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}  # the C kernels' dtypes
_KERNEL_DTYPES = tuple(_SUFFIX)


def _keep_threshold(p: float) -> int:
    """``t`` with P(uniform 32-bit draw < t) = round((1 - p) * 2**32) / 2**32."""
    return round((1.0 - p) * (1 << 32))


def _draw_key() -> int:
    """One 63-bit key from torch's default CPU generator (what seeds a call's mask)."""
    return int(torch.randint(0, (1 << 63) - 1, ()))


def _as_int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _keep_mask_torch(n: int, key: int, threshold: int) -> Tensor:
    """The kernel's mask for elements ``0..n-1``, in torch (int64 arithmetic wraps mod 2**64)."""
    z = torch.arange(1, n + 1, dtype=torch.int64).mul_(_as_int64(_GOLDEN)).add_(key)
    z = (z ^ _shift_right(z, 30)).mul_(_as_int64(_MIX1))
    z = (z ^ _shift_right(z, 27)).mul_(_as_int64(_MIX2))
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 32) < threshold


def dropout_keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A bool tensor of ``shape`` whose elements are True independently with prob. ``1 - p``.

    Keyed by one draw from torch's default CPU generator: the mask :func:`relu_dropout` uses
    after the same draw (see the module docstring).
    """
    n = 1
    for s in shape:
        n *= int(s)
    key, threshold = _draw_key(), _keep_threshold(p)
    lib = cpu_kernels()
    if lib is None:
        return _keep_mask_torch(n, key, threshold).view(shape)
    keep = torch.empty(n, dtype=torch.uint8)
    Chunks(n, _MIN_CHUNK).run(lib, "dropout_keep_mask", keep.data_ptr(), key, threshold)
    return keep.view(torch.bool).view(shape)


class _ReLUDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        scale = 1.0 / (1.0 - p)
        key, threshold = _draw_key(), _keep_threshold(p)
        lib = cpu_kernels() if x.dtype in _KERNEL_DTYPES else None
        if lib is not None:
            y = torch.empty_like(x)
            name = "relu_dropout_fwd_" + _SUFFIX[x.dtype]
            Chunks(x.numel(), _MIN_CHUNK).run(
                lib, name, x.data_ptr(), y.data_ptr(), key, threshold, scale
            )
        else:
            keep = _keep_mask_torch(x.numel(), key, threshold).view(x.shape)
            y = torch.where(keep, x, 0.0).clamp_min_(0.0).mul_(scale)
        ctx.scale = scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        ok = y.dtype in _KERNEL_DTYPES and grad.dtype == y.dtype
        lib = cpu_kernels() if ok else None
        if lib is None:
            # y > 0 exactly where the input was positive and the element was kept
            return torch.ops.aten.threshold_backward(grad, y, 0.0).mul_(ctx.scale), None
        grad = grad.contiguous()
        dx = torch.empty_like(y)
        Chunks(y.numel(), _MIN_CHUNK).run(
            lib,
            "relu_dropout_bwd_" + _SUFFIX[y.dtype],
            grad.data_ptr(),
            y.data_ptr(),
            dx.data_ptr(),
            ctx.scale,
        )
        return dx, None


def relu_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(F.relu(x), p, training)``, fused on the CPU (see the module docstring)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return F.relu(x)
    # a compiled graph takes the stock operators too: inductor fuses its own mask into the
    # neighbouring code (the 64-bit hash does not fit its index arithmetic), so compiled and
    # eager runs draw different masks
    if x.device.type != "cpu" or not x.is_floating_point() or torch.compiler.is_compiling():
        return F.dropout(F.relu(x), p, training=True)
    return _ReLUDropoutFn.apply(x.contiguous(), p)


_MIN_ROWS = 64  # rows per thread at least in the fused LayerNorm kernel


class _LayerNormReLUDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, p):  # type: ignore[override]
        lib = cpu_kernels()
        rows, n = x.shape
        scale = 1.0 / (1.0 - p)
        key, threshold = _draw_key(), _keep_threshold(p)
        y = torch.empty_like(x)
        mean = torch.empty(rows, dtype=x.dtype)
        rstd = torch.empty(rows, dtype=x.dtype)
        Chunks(rows, _MIN_ROWS).run(
            lib,
            "ln_relu_dropout_fwd_f32",
            x.data_ptr(),
            weight.data_ptr(),
            bias.data_ptr(),
            y.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            n,
            eps,
            key,
            threshold,
            scale,
        )
        ctx.scale = scale
        ctx.save_for_backward(x, weight, y, mean, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight, y, mean, rstd = ctx.saved_tensors
        lib = cpu_kernels()
        rows, n = x.shape
        grad = grad.contiguous()
        dx = torch.empty_like(x)
        chunks = Chunks(rows, _MIN_ROWS)
        dw, db = chunks.partials(n), chunks.partials(n)  # the affine gradients, per chunk
        chunks.run(
            lib,
            "ln_relu_dropout_bwd_f32",
            grad.data_ptr(),
            y.data_ptr(),
            x.data_ptr(),
            weight.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            dx.data_ptr(),
            dw.data_ptr(),
            db.data_ptr(),
            n,
            ctx.scale,
        )
        return dx, dw.sum(0), db.sum(0), None, None


def layer_norm_fusable(x: Tensor, norm: nn.Module, p: float, training: bool) -> bool:
    """Whether the C kernels may run ``F.dropout(F.relu(norm(x)), p, training)`` for x
    ``[B, N]``: training with ``0 < p < 1``, a plain affine ``nn.LayerNorm(N)`` without hooks,
    and :func:`~ctrcal.layers.kernels.fusion.fusable_on_cpu` for x and the norm's weight. Kernels
    that fuse more around the norm add their own conditions to it."""
    return (
        training
        and 0.0 < p < 1.0
        and is_layer_norm(norm)
        and unhooked(norm)
        and norm.weight is not None
        and norm.bias is not None
        and x.dim() == 2
        and tuple(norm.normalized_shape) == (x.shape[1],)
        and fusable_on_cpu(x, norm.weight, kernels=cpu_kernels)
    )


def layer_norm_relu_dropout(x: Tensor, norm: nn.LayerNorm, p: float, training: bool) -> Tensor:
    """``F.dropout(F.relu(norm(x)), p, training)``, as ONE pass each way on the CPU.

    The fused kernel (:mod:`ctrcal.layers.kernels.cpu_kernels`) normalises a row, applies the
    affine, the ReLU and the dropout mask of :func:`relu_dropout` (the same draw, so the same mask)
    and writes the output once; its backward reads the output gradient, the output and the
    input once and writes the input gradient, with the affine gradients summed per thread
    chunk. Two activation-sized intermediate tensors (the norm's output and its gradient)
    and their passes disappear. Anything else -- another norm setup, dtype or device, eval
    mode, ``p == 0``, no C compiler -- runs the norm and :func:`relu_dropout`.

    Args:
        x: ``[B, N]`` input of the norm.
        norm: an ``nn.LayerNorm(N)`` with affine weight and bias.
        p: dropout rate; training: whether dropout is active.
    """
    if not layer_norm_fusable(x, norm, p, training):
        return relu_dropout(norm(x), p, training)
    return _LayerNormReLUDropoutFn.apply(x.contiguous(), norm.weight, norm.bias, norm.eps, p)


def run_sequential(layers: Iterable[nn.Module], x: Tensor) -> Tensor:
    """``nn.Sequential(*layers)(x)``, with every ``nn.ReLU`` directly followed by an
    ``nn.Dropout`` run as one :func:`relu_dropout` (the dropout module's ``p`` and
    ``training`` decide, as they would) where neither is hooked."""
    mods = list(layers)
    i = 0
    while i < len(mods):
        nxt = mods[i + 1] if i + 1 < len(mods) else None
        if is_stock(mods[i], nn.ReLU) and is_stock(nxt, nn.Dropout):
            x = relu_dropout(x, nxt.p, nxt.training)
            i += 2
        else:
            x = mods[i](x)
            i += 1
    return x
