"""ctrcal's small CPU kernels of training (``cpu_kernels.c``): build, load, run on chunks.

The C source holds the fused ReLU + dropout and LayerNorm + ReLU + dropout
(:mod:`ctrcal.layers.dropout`), MaskBlock's masked input and the masks' first layers
(:mod:`ctrcal.layers.mask_block`), the last of those fused with a one-output head
(:mod:`ctrcal.layers.logit_head`)
the embedding table gather / scatter-add (:mod:`ctrcal.layers.table_lookup`) and the numeric
embeddings (:mod:`ctrcal.layers.embedding`). It is
compiled once per machine with the system C compiler and cached like the MC-LayerNorm kernel
(:func:`ctrcal.cbuild.build_c_library`); where it cannot be built,
:func:`cpu_kernels` is ``None`` and the callers take their torch paths. Calls go through
ctypes, which releases the GIL, so :func:`run_chunks` runs the chunks of one call on a small
thread pool (as many chunks as torch has intra-op threads).
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

__all__ = ["cpu_kernels", "kernel_error", "run_chunks", "split_range"]


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        fwd = getattr(lib, f"relu_dropout_fwd_{suffix}")
        fwd.argtypes, fwd.restype = [ptr, ptr, i64, i64, u64, u64, real], None
        bwd = getattr(lib, f"relu_dropout_bwd_{suffix}")
        bwd.argtypes, bwd.restype = [ptr, ptr, ptr, i64, i64, real], None
    lib.dropout_keep_mask.argtypes = [ptr, i64, i64, u64, u64]
    lib.dropout_keep_mask.restype = None
    lib.table_gather_f32.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64]
    lib.table_gather_f32.restype = i64
    lib.table_scatter_add_f32.argtypes = [ptr, ptr, ptr, ptr] + [i64] * 7
    lib.table_scatter_add_f32.restype = None
    f32 = ctypes.c_float
    lib.ln_relu_dropout_fwd_f32.argtypes = [ptr] * 6 + [i64] * 3 + [f32, u64, u64, f32]
    lib.ln_relu_dropout_fwd_f32.restype = None
    lib.ln_relu_dropout_bwd_f32.argtypes = [ptr] * 9 + [i64] * 3 + [f32]
    lib.ln_relu_dropout_bwd_f32.restype = None
    lib.masked_input_fwd_f32.argtypes = [ptr] * 4 + [i64] * 3
    lib.masked_input_fwd_f32.restype = None
    lib.masked_input_bwd_f32.argtypes = [ptr] * 7 + [i64] * 3
    lib.masked_input_bwd_f32.restype = None
    lib.mask_hidden_fwd_f32.argtypes = [ptr] * 3 + [i64] * 4 + [ptr]
    lib.mask_hidden_fwd_f32.restype = None
    lib.mask_hidden_bwd_f32.argtypes = [ptr] * 4 + [i64] * 4 + [ptr]
    lib.mask_hidden_bwd_f32.restype = None
    lib.ln_relu_dropout_logit_fwd_f32.argtypes = [ptr] * 7 + [i64] * 3 + [f32, u64, u64, f32]
    lib.ln_relu_dropout_logit_fwd_f32.restype = None
    lib.ln_relu_dropout_logit_bwd_f32.argtypes = [ptr] * 11 + [i64] * 3 + [u64, u64, f32]
    lib.ln_relu_dropout_logit_bwd_f32.restype = None
    lib.ln_relu_dropout_mask_fwd_f32.argtypes = [ptr] * 8 + [i64] * 3 + [f32, u64, u64, f32]
    lib.ln_relu_dropout_mask_fwd_f32.restype = None
    lib.ln_relu_dropout_mask_bwd_f32.argtypes = [ptr] * 13 + [i64] * 3 + [u64, u64, f32]
    lib.ln_relu_dropout_mask_bwd_f32.restype = None
    lib.numeric_embed_fwd_f32.argtypes = [ptr] * 5 + [i64] * 5
    lib.numeric_embed_fwd_f32.restype = None
    lib.numeric_embed_bwd_f32.argtypes = [ptr] * 5 + [i64] * 5
    lib.numeric_embed_bwd_f32.restype = None


_LIBRARY = LazyLibrary(Path(__file__).with_name("cpu_kernels.c"), "cpu_kernels", _declare)
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
