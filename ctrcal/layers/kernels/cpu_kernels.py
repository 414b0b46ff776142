"""ctrcal's small CPU kernels of training (``cpu_kernels.c``): build and load.

The C source holds the fused ReLU + dropout and LayerNorm + ReLU + dropout
(:mod:`ctrcal.layers.dropout`), MaskBlock's masked input and the masks' first layers
(:mod:`ctrcal.layers.mask_block`), the last of those fused with a one-output head
(:mod:`ctrcal.layers.logit_head`), the embedding table gather / scatter-add
(:mod:`ctrcal.layers.table_lookup`), the numeric embeddings
(:mod:`ctrcal.layers.embedding`) and DCNv2's full-rank cross layers
(:mod:`ctrcal.layers.cross`). It is compiled once per machine with the system C compiler and
cached like the MC-LayerNorm kernel (:func:`ctrcal.core.cbuild.build_c_library`); where it cannot
be built, :func:`cpu_kernels` is ``None`` and the callers take their torch paths. When a
caller may run a kernel at all is one rule, :func:`ctrcal.layers.kernels.fusion.fusable_on_cpu`.

Threads: see :mod:`ctrcal.layers.kernels.chunks`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ctrcal.core.cbuild import LazyLibrary
from ctrcal.layers.kernels.chunks import HEADER, torch_uses_loaded_openmp

__all__ = ["cpu_kernels", "kernel_error"]


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
    lib.cross_fwd_f32.argtypes = [ptr] * 5 + [i64, *chunks]
    lib.cross_bwd_f32.argtypes = [ptr] * 6 + [i64, ctypes.c_int, *chunks]
    for name in _KERNELS:
        getattr(lib, name).restype = None
    lib.chunks_in_parallel.argtypes, lib.chunks_in_parallel.restype = [], ctypes.c_int


_KERNELS = (
    "relu_dropout_fwd_f32",
    "relu_dropout_fwd_f64",
    "relu_dropout_bwd_f32",
    "relu_dropout_bwd_f64",
    "dropout_keep_mask",
    "table_gather_f32",
    "table_scatter_add_f32",
    "ln_relu_dropout_fwd_f32",
    "ln_relu_dropout_bwd_f32",
    "masked_input_fwd_f32",
    "masked_input_bwd_f32",
    "mask_hidden_fwd_f32",
    "mask_hidden_bwd_f32",
    "ln_relu_dropout_logit_fwd_f32",
    "ln_relu_dropout_logit_bwd_f32",
    "ln_relu_dropout_mask_fwd_f32",
    "ln_relu_dropout_mask_bwd_f32",
    "numeric_embed_fwd_f32",
    "numeric_embed_bwd_f32",
    "cross_fwd_f32",
    "cross_bwd_f32",
)


_LIBRARY = LazyLibrary(
    Path(__file__).with_name("cpu_kernels.c"),
    "cpu_kernels",
    _declare,
    openmp=torch_uses_loaded_openmp,
    headers=[HEADER],
)


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
