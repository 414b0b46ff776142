"""The fused CPU kernel of MC-LayerNorm: build, load and call ``mcln_kernel.c``.

Per row: an exact uniform k-subset, kept as a bitmask of ``ceil(N / 64)`` words (see
:func:`mask_words`). Rows of at most 64 features draw the smaller side with Floyd's
algorithm; wider rows keep each feature on 16 random bits against ``floor(k * 2^16 / N)`` and
then correct the count to exactly k with uniform picks among the features left (exchangeable,
then order-free: uniform over all subsets). Every bounded pick is exact (Lemire's method);
the bits are SplitMix64 outputs keyed by one torch draw and the row index. The statistics are
one masked pass over the row, then the output in a second pass. The backward recomputes
x_hat from the saved mean/rstd and applies the subset term where the saved mask says.

The kernel is compiled once per machine with the system C compiler (about a second), cached
under ``~/.cache/ctrcal/kernels`` (or ``$CTRCAL_CACHE_DIR``), and loaded with ctypes; a call's
rows are split between threads by :mod:`ctrcal.layers.kernels.chunks`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ctrcal.core.cbuild import LazyLibrary
from ctrcal.layers.kernels.chunks import HEADER, Chunks, torch_uses_loaded_openmp


def small_side(n: int, k: int) -> tuple[int, bool]:
    """The smaller of the subset and its complement: (d, invert)."""
    return (k, False) if k <= n - k else (n - k, True)


def mask_words(n: int, k: int) -> int:
    """Words (64 bits) of a row's saved subset: none for the full set (k = n draws nothing)."""
    return 0 if k >= n else (n + 63) // 64


_MIN_CHUNK_ELEMENTS = 1 << 16  # a thread's chunk of rows spans at least this many elements


_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
KERNEL_DTYPES = tuple(_SUFFIX)
"""The row dtypes the kernel takes: float32 and float64 rows compute in their own dtype;
bfloat16 rows are read and written as bf16 and compute in float32 (affine parameters and
their gradients float32), exactly as a float32 call on the widened rows rounded once."""


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a call's row statistics, affine parameters and their gradients."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _row_chunks(rows: int, n: int) -> Chunks:
    # a training step calls with the same few shapes every time: their chunks are kept
    key = (rows, n, torch.get_num_threads())
    chunks = _CHUNKS.get(key)
    if chunks is None:
        if len(_CHUNKS) >= 64:
            _CHUNKS.clear()
        chunks = _CHUNKS[key] = Chunks(rows, -(-_MIN_CHUNK_ELEMENTS // max(n, 1)))
    return chunks


_CHUNKS: dict[tuple[int, int, int], Chunks] = {}


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    chunks = [ptr, i64, i64]  # bounds, first chunk, end chunk (chunks.h)
    lib.mcln_sample.argtypes = [ptr, i64, i64, ctypes.c_uint64, *chunks]
    lib.mcln_sample.restype = c_int
    for suffix in _SUFFIX.values():
        fwd, bwd = getattr(lib, f"mcln_fwd_{suffix}"), getattr(lib, f"mcln_bwd_{suffix}")
        fwd.argtypes = [ptr] * 7 + [i64] * 3 + [ctypes.c_double, ctypes.c_uint64, *chunks]
        fwd.restype = c_int
        bwd.argtypes = [ptr] * 9 + [i64] * 3 + [*chunks]
        bwd.restype = None
    lib.chunks_in_parallel.argtypes, lib.chunks_in_parallel.restype = [], c_int


_LIBRARY = LazyLibrary(
    Path(__file__).with_name("mcln_kernel.c"),
    "mcln",
    _declare,
    openmp=torch_uses_loaded_openmp,
    headers=[HEADER],
)


def get_kernel() -> ctypes.CDLL:
    """The loaded C kernel, built on first use. Raises RuntimeError when it cannot be built."""
    lib = _LIBRARY.get()
    if lib is None:
        raise RuntimeError(f"MC-LayerNorm C kernel unavailable: {_LIBRARY.error}")
    return lib


def kernel_available() -> bool:
    """Whether the fused C kernel for CPU builds and loads here (builds it on first call)."""
    return _LIBRARY.get() is not None


def kernel_error() -> str | None:
    """Why the kernel is unavailable (after a failed build), else ``None``."""
    return _LIBRARY.error


def _p(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(failed: int) -> None:
    if failed:
        raise MemoryError("MC-LayerNorm C kernel: out of memory for its scratch space")


def subset_mask(rows: int, n: int, k: int, key: int) -> Tensor:
    """The rows' subsets as a uint8 0/1 mask [rows, n], exactly k ones a row (the subsets the
    forward draws from the same key)."""
    mask = torch.empty(rows, n, dtype=torch.uint8)
    failed = _row_chunks(rows, n).run(get_kernel(), "mcln_sample", mask.data_ptr(), n, k, key)
    _check(any(failed))
    return mask


def forward(
    x: Tensor, w: Tensor | None, b: Tensor | None, k: int, eps: float, key: int, groups: int = 1
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows of x [R, N] (row r uses affine row r % groups of w, b [groups, N]).

    Returns y [R, N], the subsets' bits [R, :func:`mask_words`] (int64; bit i of word j is
    feature 64 j + i), and the per-row mean and 1/std [R].
    """
    rows, n = x.shape
    y = torch.empty_like(x)
    words = mask_words(n, k)
    mask = torch.empty(rows, words, dtype=torch.int64)
    mean = torch.empty(rows, dtype=stats_dtype(x.dtype))
    rstd = torch.empty(rows, dtype=stats_dtype(x.dtype))
    name = "mcln_fwd_" + _SUFFIX[x.dtype]
    failed = _row_chunks(rows, n).run(
        get_kernel(),
        name,
        _p(x),
        _p(w),
        _p(b),
        _p(y),
        _p(mask) if words else None,
        _p(mean),
        _p(rstd),
        n,
        groups,
        k,
        eps,
        key,
    )
    _check(any(failed))
    return y, mask, mean, rstd


def backward(
    dy: Tensor,
    x: Tensor,
    w: Tensor | None,
    mask: Tensor,
    mean: Tensor,
    rstd: Tensor,
    k: int,
    groups: int = 1,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """dx [R, N], dweight [groups, N] (None without weight) and dbias [groups, N], from the
    forward's subsets ``mask``."""
    rows, n = x.shape
    chunks = _row_chunks(rows, n)
    dx = torch.empty_like(x)
    # per-chunk partial sums of dweight / dbias, added up afterwards
    dw = chunks.partials(groups, n, dtype=stats_dtype(x.dtype)) if w is not None else None
    db = chunks.partials(groups, n, dtype=stats_dtype(x.dtype))
    name = "mcln_bwd_" + _SUFFIX[x.dtype]
    chunks.run(
        get_kernel(),
        name,
        _p(dy),
        _p(x),
        _p(w),
        _p(mask) if mask_words(n, k) else None,
        _p(mean),
        _p(rstd),
        _p(dx),
        _p(dw),
        _p(db),
        n,
        groups,
        k,
    )
    if chunks.count == 1:  # one partial sum: it is the sum
        return dx, dw[0] if dw is not None else None, db[0]
    return dx, dw.sum(0) if dw is not None else None, db.sum(0)


class KernelMCLayerNorm(torch.autograd.Function):
    """Eager autograd wrapper of the C kernel on x [R, N] (float32/float64/bfloat16, contiguous).

    ``weight``/``bias`` are [groups, N] (or None): row r uses affine row ``r % groups``, so
    ``groups = 1`` is the row layer and ``groups = F`` the per-field layer on [B * F, D].
    """

    @staticmethod
    def forward(ctx, x, weight, bias, k, eps, key, groups=1):  # type: ignore[override]
        y, mask, mean, rstd = forward(x, weight, bias, k, eps, key, groups)
        ctx.save_for_backward(x, weight, mask, mean, rstd)
        ctx.k, ctx.groups = k, groups
        ctx.bias_shape = bias.shape if bias is not None else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):  # type: ignore[override]
        x, w, mask, mean, rstd = ctx.saved_tensors
        dx, dw, db = backward(dy.contiguous(), x, w, mask, mean, rstd, ctx.k, ctx.groups)
        return (
            dx,
            _shaped(dw, w.shape) if w is not None else None,
            _shaped(db, ctx.bias_shape) if ctx.bias_shape is not None else None,
            None,
            None,
            None,
            None,
        )


def _shaped(t: Tensor, shape: torch.Size) -> Tensor:
    return t if t.shape == shape else t.reshape(shape)


# torch.library ops: opaque to torch.compile, so a compiled CPU graph keeps the kernel instead
# of tracing the pure-torch path (10-20x slower). Eager calls take the autograd Function above:
# the first eager call of a custom op imports torch._dynamo (about a second, and triton with
# it), which a CPU process that never compiles should not pay.


@torch.library.custom_op("ctrcal::mc_layer_norm_cpu_fwd", mutates_args=())
def mc_layer_norm_cpu_fwd(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    key: Tensor,
    groups: int,
    k: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused forward on x [R, N] float32/float64/bfloat16 contiguous, affine [groups, N] or
    None, the rows' key a one-element int64 tensor: (y [R, N], subsets' bits [R, words] int64,
    mean [R], rstd [R])."""
    return forward(x, weight, bias, k, eps, int(key.item()), groups)


@mc_layer_norm_cpu_fwd.register_fake
def _(x, weight, bias, key, groups, k, eps):
    rows, n = x.shape
    stats = x.new_empty(rows, dtype=stats_dtype(x.dtype))
    mask = x.new_empty(rows, mask_words(n, k), dtype=torch.int64)
    return torch.empty_like(x), mask, stats, stats.clone()


@torch.library.custom_op("ctrcal::mc_layer_norm_cpu_bwd", mutates_args=())
def mc_layer_norm_cpu_bwd(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mask: Tensor,
    mean: Tensor,
    rstd: Tensor,
    groups: int,
    k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused backward: (dx [R, N], dweight [groups, N] (empty [0] without weight),
    dbias [groups, N])."""
    dx, dw, db = backward(dy, x, weight, mask, mean, rstd, k, groups)
    return dx, dw if dw is not None else x.new_empty(0), db


@mc_layer_norm_cpu_bwd.register_fake
def _(dy, x, weight, mask, mean, rstd, groups, k):
    part = x.new_empty(groups, x.shape[1], dtype=stats_dtype(x.dtype))
    return torch.empty_like(x), part if weight is not None else x.new_empty(0), part.clone()


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _key, groups, k, _eps = inputs
    _y, mask, mean, rstd = output
    ctx.save_for_backward(x, weight, mask, mean, rstd)
    ctx.groups, ctx.k = groups, k
    ctx.bias_shape = bias.shape if bias is not None else None


def _backward(ctx, dy, _dmask, _dmean, _drstd):
    x, weight, mask, mean, rstd = ctx.saved_tensors
    dx, dw, db = mc_layer_norm_cpu_bwd(
        dy.contiguous(), x, weight, mask, mean, rstd, ctx.groups, ctx.k
    )
    return (
        dx,
        dw.reshape(weight.shape) if weight is not None else None,
        db.reshape(ctx.bias_shape) if ctx.bias_shape is not None else None,
        None,
        None,
        None,
        None,
    )


mc_layer_norm_cpu_fwd.register_autograd(_backward, setup_context=_setup_context)


def _affine(p: Tensor | None, groups: int, n: int) -> Tensor | None:
    """An affine parameter as the kernel reads it: groups * n contiguous values (the row
    layer's [N] as it is; no reshape node in the graph where none is needed)."""
    if p is None or (p.is_contiguous() and (p.dim() == 1 if groups == 1 else p.dim() == 2)):
        return p
    return p.reshape(groups, n).contiguous()


def kernel_mc_layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    k: int,
    eps: float,
    key: Tensor,
    groups: int = 1,
) -> Tensor:
    """MC-LayerNorm of x [R, N] (float32/float64/bfloat16) by the C kernel, differentiable.

    Args:
        x: [R, N]; row r takes affine row ``r % groups``.
        weight: [groups, N] (or [N] when groups is 1) or None.
        bias: like weight.
        k: subset size; k = N is LayerNorm (no draw).
        eps: added to the variance inside the square root.
        key: one-element int64 CPU tensor keying every row's draw.
        groups: affine rows: 1 for the row layer, F for the per-field layer on [B * F, D].

    Returns:
        y [R, N].
    """
    n = x.shape[1]
    w = _affine(weight, groups, n)
    b = _affine(bias, groups, n)
    x = x.contiguous()
    if torch.compiler.is_compiling():
        y, _mask, _mean, _rstd = mc_layer_norm_cpu_fwd(x, w, b, key, groups, k, eps)
        return y
    return KernelMCLayerNorm.apply(x, w, b, k, eps, int(key.item()), groups)
