"""The fused CPU kernel of MC-LayerNorm: build, load and call ``mcln_kernel.c``.

Per row: Floyd's algorithm draws a uniform d-subset (d = the smaller of k and N-k) with exact
bounded integers (Lemire's method) from SplitMix64 outputs keyed by one torch draw and the row
index; the row keeps the d drawn positions (int32), not an N-wide mask. The statistics are one
pass over the row corrected on those positions, then the output in a second pass. The
backward recomputes x_hat from the saved mean/rstd and rewrites the d positions' gradient.

The kernel is compiled once per machine with the system C compiler (about a second), cached
under ``~/.cache/ctrcal/kernels`` (or ``$CTRCAL_CACHE_DIR``), and loaded with ctypes; calls
release the GIL, so row chunks run on a thread pool.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ctrcal.cbuild import build_c_library

_C_SOURCE = Path(__file__).with_name("mcln_kernel.c").read_text()


def small_side(n: int, k: int) -> tuple[int, bool]:
    """Draw the smaller of the subset and its complement (cost grows with it): (d, invert)."""
    return (k, False) if k <= n - k else (n - k, True)


_MIN_CHUNK_ELEMENTS = 1 << 16  # a thread's chunk of rows spans at least this many elements


class _CKernel:
    """The compiled kernel and a thread pool over row chunks (ctypes releases the GIL)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.mcln_sample.argtypes = [ptr, i64, i64, i64, i64, ctypes.c_int, ctypes.c_uint64]
        lib.mcln_sample.restype = ctypes.c_int
        for suffix in ("f32", "f64"):
            getattr(lib, f"mcln_fwd_{suffix}").argtypes = (
                [ptr] * 7
                + [i64] * 6
                + [
                    ctypes.c_int,
                    ctypes.c_double,
                    ctypes.c_uint64,
                ]
            )
            getattr(lib, f"mcln_fwd_{suffix}").restype = ctypes.c_int
            getattr(lib, f"mcln_bwd_{suffix}").argtypes = [ptr] * 9 + [i64] * 6 + [ctypes.c_int]
        self.lib = lib
        self._pool: ThreadPoolExecutor | None = None

    @staticmethod
    def _p(t: Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    def chunks(self, rows: int, n: int) -> list[tuple[int, int]]:
        threads = max(1, torch.get_num_threads())
        per = max(-(-rows // threads), -(-_MIN_CHUNK_ELEMENTS // max(n, 1)))
        return [(r, min(rows, r + per)) for r in range(0, rows, per)]

    def run(self, parts: list[tuple[int, ...]], fn: Callable[..., None]) -> None:
        if len(parts) <= 1:
            for part in parts:
                fn(*part)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
        for future in [self._pool.submit(fn, *part) for part in parts]:
            future.result()

    def run_rows(self, rows: int, n: int, fn: Callable[[int, int], None]) -> None:
        self.run(self.chunks(rows, n), fn)

    def sample(self, mask: Tensor, r0: int, r1: int, n: int, d: int, inv: bool, key: int) -> None:
        _check(self.lib.mcln_sample(mask.data_ptr(), r0, r1, n, d, int(inv), key))

    def forward(
        self,
        x: Tensor,
        w: Tensor | None,
        b: Tensor | None,
        k: int,
        eps: float,
        key: int,
        groups: int = 1,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Rows of x [R, N] (row r uses affine row r % groups of w, b [groups, N]).

        Returns y [R, N], the drawn positions [R, d] (int32; see :func:`small_side`), and the
        per-row mean and 1/std [R].
        """
        rows, n = x.shape
        y = torch.empty_like(x)
        d, invert = small_side(n, k)
        idx = torch.empty(rows, d, dtype=torch.int32)
        mean = torch.empty(rows, dtype=x.dtype)
        rstd = torch.empty(rows, dtype=x.dtype)
        fn = self.lib.mcln_fwd_f64 if x.dtype == torch.float64 else self.lib.mcln_fwd_f32
        p = self._p
        args = (p(x), p(w), p(b), p(y), p(idx), p(mean), p(rstd))
        self.run_rows(
            rows,
            n,
            lambda r0, r1: _check(fn(*args, r0, r1, n, groups, k, d, int(invert), eps, key)),
        )
        return y, idx, mean, rstd

    def backward(
        self,
        dy: Tensor,
        x: Tensor,
        w: Tensor | None,
        idx: Tensor,
        mean: Tensor,
        rstd: Tensor,
        k: int,
        groups: int = 1,
    ) -> tuple[Tensor, Tensor, Tensor]:
        rows, n = x.shape
        d, invert = small_side(n, k)
        parts = self.chunks(rows, n)
        dx = torch.empty_like(x)
        # per-chunk partial sums of dweight / dbias, added up afterwards (one chunk: no sum)
        chunks = max(len(parts), 1)
        dw = torch.zeros(chunks, groups, n, dtype=x.dtype) if w is not None else None
        db = torch.zeros(chunks, groups, n, dtype=x.dtype)
        fn = self.lib.mcln_bwd_f64 if x.dtype == torch.float64 else self.lib.mcln_bwd_f32
        p = self._p
        head = (p(dy), p(x), p(w), p(idx), p(mean), p(rstd), p(dx))
        self.run(
            [(i, r0, r1) for i, (r0, r1) in enumerate(parts)],
            lambda i, r0, r1: fn(
                *head,
                p(dw[i]) if dw is not None else None,
                p(db[i]),
                r0,
                r1,
                n,
                groups,
                k,
                d,
                int(invert),
            ),
        )
        if chunks == 1:
            return dx, dw[0] if dw is not None else None, db[0]
        return dx, dw.sum(0) if dw is not None else None, db.sum(0)


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("MC-LayerNorm C kernel: out of memory for its scratch space")


_kernel_state: dict[str, Any] = {}
_kernel_lock = threading.Lock()


def _reset_pool_after_fork() -> None:
    # a forked child inherits the pool object but not its threads
    kernel = _kernel_state.get("kernel")
    if kernel is not None:
        kernel._pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _build_kernel() -> _CKernel:
    return _CKernel(build_c_library(_C_SOURCE, "mcln"))


def get_kernel() -> _CKernel:
    """The loaded C kernel, built on first use. Raises RuntimeError when it cannot be built."""
    with _kernel_lock:
        if "kernel" not in _kernel_state:
            try:
                _kernel_state["kernel"] = _build_kernel()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                _kernel_state["kernel"] = None
                _kernel_state["error"] = str(exc)
        kernel = _kernel_state["kernel"]
    if kernel is None:
        raise RuntimeError(f"MC-LayerNorm C kernel unavailable: {_kernel_state['error']}")
    return kernel


def kernel_available() -> bool:
    """Whether the fused C kernel for CPU builds and loads here (builds it on first call)."""
    try:
        get_kernel()
    except RuntimeError:
        return False
    return True


class KernelMCLayerNorm(torch.autograd.Function):
    """Eager autograd wrapper of the C kernel on x [R, N] (float32/float64, contiguous).

    ``weight``/``bias`` are [groups, N] (or None): row r uses affine row ``r % groups``, so
    ``groups = 1`` is the row layer and ``groups = F`` the per-field layer on [B * F, D].
    """

    @staticmethod
    def forward(ctx, x, weight, bias, k, eps, key, groups=1):  # type: ignore[override]
        y, idx, mean, rstd = get_kernel().forward(x, weight, bias, k, eps, key, groups)
        ctx.save_for_backward(x, weight, idx, mean, rstd)
        ctx.k, ctx.groups = k, groups
        ctx.bias_shape = bias.shape if bias is not None else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):  # type: ignore[override]
        x, w, idx, mean, rstd = ctx.saved_tensors
        dx, dw, db = get_kernel().backward(
            dy.contiguous(), x, w, idx, mean, rstd, ctx.k, ctx.groups
        )
        return (
            dx,
            dw.reshape(w.shape) if w is not None else None,
            db.reshape(ctx.bias_shape) if ctx.bias_shape is not None else None,
            None,
            None,
            None,
            None,
        )


# torch.library ops: opaque to torch.compile, so a compiled CPU graph keeps the kernel instead
# of tracing the pure-torch path (10-20x slower). Eager calls take the autograd Function above:
# the first eager call of a custom op imports torch._dynamo (about a second, and triton with
# it), which a CPU process that never compiles should not pay.


@torch.library.custom_op("ctrcal::mc_layer_norm_cpu_fwd", mutates_args=())
def mc_layer_norm_cpu_fwd(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, key: Tensor, groups: int, k: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Fused forward on x [R, N] float32/float64 contiguous, affine [groups, N] or None, the
    rows' key a one-element int64 tensor: (y [R, N], positions [R, d] int32, mean [R],
    rstd [R])."""
    return get_kernel().forward(x, weight, bias, k, eps, int(key.item()), groups)


@mc_layer_norm_cpu_fwd.register_fake
def _(x, weight, bias, key, groups, k, eps):
    rows, n = x.shape
    d, _ = small_side(n, k)
    stats = x.new_empty(rows)
    return torch.empty_like(x), x.new_empty(rows, d, dtype=torch.int32), stats, stats.clone()


@torch.library.custom_op("ctrcal::mc_layer_norm_cpu_bwd", mutates_args=())
def mc_layer_norm_cpu_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, idx: Tensor, mean: Tensor, rstd: Tensor,
    groups: int, k: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Fused backward: (dx [R, N], dweight [groups, N] (empty [0] without weight),
    dbias [groups, N])."""
    dx, dw, db = get_kernel().backward(dy, x, weight, idx, mean, rstd, k, groups)
    return dx, dw if dw is not None else x.new_empty(0), db


@mc_layer_norm_cpu_bwd.register_fake
def _(dy, x, weight, idx, mean, rstd, groups, k):
    part = x.new_empty(groups, x.shape[1])
    return torch.empty_like(x), part if weight is not None else x.new_empty(0), part.clone()


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _key, groups, k, _eps = inputs
    _y, idx, mean, rstd = output
    ctx.save_for_backward(x, weight, idx, mean, rstd)
    ctx.groups, ctx.k = groups, k
    ctx.bias_shape = bias.shape if bias is not None else None


def _backward(ctx, dy, _didx, _dmean, _drstd):
    x, weight, idx, mean, rstd = ctx.saved_tensors
    dx, dw, db = mc_layer_norm_cpu_bwd(
        dy.contiguous(), x, weight, idx, mean, rstd, ctx.groups, ctx.k
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


def kernel_mc_layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    k: int,
    eps: float,
    key: Tensor,
    groups: int = 1,
) -> Tensor:
    """MC-LayerNorm of x [R, N] (float32/float64) by the C kernel, differentiable.

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
    w = weight.reshape(groups, n).contiguous() if weight is not None else None
    b = bias.reshape(groups, n).contiguous() if bias is not None else None
    x = x.contiguous()
    if torch.compiler.is_compiling():
        y, _idx, _mean, _rstd = mc_layer_norm_cpu_fwd(x, w, b, key, groups, k, eps)
        return y
    return KernelMCLayerNorm.apply(x, w, b, k, eps, int(key.item()), groups)
