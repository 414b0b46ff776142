"""ctrcal's small CPU kernels of training (``cpu_kernels.c``): build, load, run on chunks.

The C source holds the fused ReLU + dropout and LayerNorm + ReLU + dropout
(:mod:`ctrcal.layers.dropout`), MaskBlock's masked input and the masks' first layers
(:mod:`ctrcal.layers.mask_block`), the last of those fused with a one-output head
(:mod:`ctrcal.layers.logit_head`), the embedding table gather / scatter-add
(:mod:`ctrcal.layers.table_lookup`) and the numeric embeddings
(:mod:`ctrcal.layers.embedding`). It is compiled once per machine with the system C compiler
and cached like the MC-LayerNorm kernel (:func:`ctrcal.cbuild.build_c_library`); where it
cannot be built, :func:`cpu_kernels` is ``None`` and the callers take their torch paths.

Threads: a call's rows are split into as many chunks as torch has intra-op threads
(:class:`Chunks`). Where torch runs on GNU OpenMP (the Linux wheels) the library is built with
``-fopenmp`` and runs the chunks on torch's own OpenMP threads, in one ctypes call. Elsewhere
the chunks run on a small Python thread pool (ctypes releases the GIL), which on a machine
with as many threads as cores competes with torch's workers while they spin after an operator:
in a MaskNet step that made the kernels' two threads barely faster than one.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ctrcal.cbuild import LazyLibrary

__all__ = ["Chunks", "cpu_kernels", "kernel_error", "kernels_use_openmp", "run_chunks",
           "split_range", "torch_uses_loaded_openmp"]


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, u64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float
    chunks = [ptr, i64, i64]  # bounds, first chunk, end chunk: every kernel's last arguments
    for suffix, real in (("f32", f32), ("f64", ctypes.c_double)):
        getattr(lib, f"relu_dropout_fwd_{suffix}").argtypes = [ptr, ptr, u64, u64, real, *chunks]
        getattr(lib, f"relu_dropout_bwd_{suffix}").argtypes = [ptr, ptr, ptr, real, *chunks]
    lib.dropout_keep_mask.argtypes = [ptr, u64, u64, *chunks]
    lib.table_gather_f32.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, ptr, *chunks]
    lib.table_scatter_add_f32.argtypes = [ptr] * 4 + [i64] * 5 + chunks
    lib.ln_relu_dropout_fwd_f32.argtypes = [ptr] * 6 + [i64, f32, u64, u64, f32, *chunks]
    lib.ln_relu_dropout_bwd_f32.argtypes = [ptr] * 9 + [i64, f32, *chunks]
    lib.masked_input_fwd_f32.argtypes = [ptr] * 4 + [i64, *chunks]
    lib.masked_input_bwd_f32.argtypes = [ptr] * 7 + [i64, *chunks]
    lib.mask_hidden_fwd_f32.argtypes = [ptr] * 3 + [i64, i64, ptr, *chunks]
    lib.mask_hidden_bwd_f32.argtypes = [ptr] * 4 + [i64, i64, ptr, *chunks]
    lib.ln_relu_dropout_logit_fwd_f32.argtypes = [ptr] * 7 + [i64, f32, u64, u64, f32, *chunks]
    lib.ln_relu_dropout_logit_bwd_f32.argtypes = [ptr] * 11 + [i64, u64, u64, f32, *chunks]
    lib.ln_relu_dropout_mask_fwd_f32.argtypes = [ptr] * 8 + [i64, f32, u64, u64, f32, *chunks]
    lib.ln_relu_dropout_mask_bwd_f32.argtypes = [ptr] * 13 + [i64, u64, u64, f32, *chunks]
    lib.numeric_embed_fwd_f32.argtypes = [ptr] * 5 + [i64] * 3 + chunks
    lib.numeric_embed_bwd_f32.argtypes = [ptr] * 5 + [i64] * 3 + chunks
    for name in _KERNELS:
        getattr(lib, name).restype = None
    lib.cpu_kernels_openmp.argtypes, lib.cpu_kernels_openmp.restype = [], ctypes.c_int


_KERNELS = (
    "relu_dropout_fwd_f32", "relu_dropout_fwd_f64", "relu_dropout_bwd_f32",
    "relu_dropout_bwd_f64", "dropout_keep_mask", "table_gather_f32", "table_scatter_add_f32",
    "ln_relu_dropout_fwd_f32", "ln_relu_dropout_bwd_f32", "masked_input_fwd_f32",
    "masked_input_bwd_f32", "mask_hidden_fwd_f32", "mask_hidden_bwd_f32",
    "ln_relu_dropout_logit_fwd_f32", "ln_relu_dropout_logit_bwd_f32",
    "ln_relu_dropout_mask_fwd_f32", "ln_relu_dropout_mask_bwd_f32", "numeric_embed_fwd_f32",
    "numeric_embed_bwd_f32",
)  # fmt: skip


def torch_uses_loaded_openmp() -> bool:
    """Whether torch runs its operators on GNU OpenMP and that runtime is already loaded here.

    Only then is a kernel library built with ``-fopenmp``: its dependency on ``libgomp.so.1``
    resolves to the loaded runtime (the same soname), so its parallel loops reuse torch's team
    of threads. Anywhere else (another runtime, or none) a second one would compete with
    torch's, and the kernels keep the Python thread pool of :func:`run_chunks`.
    """
    if "OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "/libgomp" in maps


_LIBRARY = LazyLibrary(Path(__file__).with_name("cpu_kernels.c"), "cpu_kernels", _declare,
                       openmp=torch_uses_loaded_openmp)
_pool: dict[str, ThreadPoolExecutor] = {}  # the chunks' thread pool, made on first use


def cpu_kernels() -> ctypes.CDLL | None:
    """The loaded library, built on first use; ``None`` where it cannot be built, and while
    ``torch.compile`` traces: a ctypes call would split the graph, and inductor generates
    fused code for the plain torch ops the callers take instead."""
    if torch.compiler.is_compiling():
        return None
    return _LIBRARY.get()


def kernel_error() -> str | None:
    """Why :func:`cpu_kernels` is ``None`` (after a failed build), else ``None``."""
    return _LIBRARY.error


def split_range(n: int, min_chunk: int) -> list[tuple[int, int]]:
    """``[0, n)`` in at most ``torch.get_num_threads()`` chunks of at least ``min_chunk``."""
    threads = max(1, torch.get_num_threads())
    per = max(-(-n // threads), min_chunk, 1)
    return [(i, min(n, i + per)) for i in range(0, n, per)]


class Chunks:
    """The chunks one kernel call splits ``[0, n)`` into (rows or elements), and the call.

    Every kernel of ``cpu_kernels.c`` takes its chunks as ``bounds`` [chunks + 1] and the
    chunks ``[c0, c1)`` to run; kernels that sum over rows write one partial sum per chunk
    (:meth:`partials`), which the caller adds up.
    """

    def __init__(self, n: int, min_chunk: int) -> None:
        parts = split_range(n, min_chunk)
        self.count = len(parts)
        self.bounds = torch.tensor([0] + [hi for _, hi in parts], dtype=torch.int64)

    def partials(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Zeroed ``[chunks, *shape]``: one partial sum per chunk."""
        return torch.zeros(self.count, *shape, dtype=dtype)

    def run(self, kernel: Callable[..., Any], *args: Any) -> None:
        """``kernel(*args, bounds, c0, c1)`` over all chunks: in one call where the library
        runs them in parallel itself (OpenMP), else one call per chunk on the thread pool."""
        bounds = self.bounds.data_ptr()
        if self.count <= 1 or kernels_use_openmp():
            kernel(*args, bounds, 0, self.count)
        else:
            run_chunks([(c, c + 1) for c in range(self.count)],
                       lambda c0, c1: kernel(*args, bounds, c0, c1))  # fmt: skip


def kernels_use_openmp() -> bool:
    """Whether the loaded kernels run their chunks on torch's OpenMP threads."""
    lib = _LIBRARY.get()
    return lib is not None and bool(lib.cpu_kernels_openmp())


def run_chunks(parts: list[tuple[int, int]], fn: Callable[[int, int], Any]) -> list[Any]:
    """``fn(lo, hi)`` for every chunk, in parallel; the results in order. The calling thread
    runs the first chunk itself (one hand-over fewer, one pool thread fewer competing with
    torch's own threads), the pool the others."""
    if len(parts) <= 1:
        return [fn(lo, hi) for lo, hi in parts]
    pool = _pool.get("pool")
    if pool is None:
        pool = _pool["pool"] = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
    futures = [pool.submit(fn, lo, hi) for lo, hi in parts[1:]]
    first = fn(*parts[0])
    return [first, *(f.result() for f in futures)]


def _reset_pool_after_fork() -> None:
    _pool.pop("pool", None)  # a forked child inherits the pool object but not its threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)
