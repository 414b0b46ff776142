"""How ctrcal's C kernels split a call between threads (the Python side of ``chunks.h``).

A call's rows (or elements) ``[0, n)`` are split into as many chunks as torch has intra-op
threads (:class:`Chunks`). Where torch runs on GNU OpenMP (the Linux wheels) the kernel
libraries are built with ``-fopenmp`` and run a call's chunks on torch's own OpenMP threads, in
one ctypes call (:func:`torch_uses_loaded_openmp`). Elsewhere the chunks run on a small Python
thread pool (ctypes releases the GIL). On a machine with as many threads as cores that pool
competes with torch's workers while they spin after an operator: in a MaskNet training step
it made the kernels' two threads barely faster than one.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

__all__ = ["HEADER", "Chunks", "runs_chunks_itself", "split_range", "torch_uses_loaded_openmp"]

HEADER = Path(__file__).with_name("chunks.h")  # included by every chunked kernel source

_GNU_OPENMP = "libgomp.so.1"  # the soname a -fopenmp build of GCC depends on
_pool: dict[str, ThreadPoolExecutor] = {}  # the fallback's thread pool, made on first use


def torch_uses_loaded_openmp() -> bool:
    """Whether torch runs its operators on GNU OpenMP and that runtime is already loaded here.

    Only then is a kernel library built with ``-fopenmp``: its dependency on ``libgomp.so.1``
    resolves to the loaded runtime (the same soname), so its parallel loops reuse torch's team
    of threads. Anywhere else (another runtime, or none) a second one would compete with
    torch's, and the chunks run on the thread pool instead.
    """
    if "OpenMP" not in torch.__config__.parallel_info() or not hasattr(os, "RTLD_NOLOAD"):
        return False
    try:  # a handle only if an object of that soname is loaded (what -lgomp binds to)
        ctypes.CDLL(_GNU_OPENMP, mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    return True


def runs_chunks_itself(lib: ctypes.CDLL) -> bool:
    """Whether ``lib`` runs a call's chunks in parallel itself (an OpenMP build)."""
    return bool(lib.chunks_in_parallel())


def split_range(n: int, min_chunk: int) -> list[tuple[int, int]]:
    """``[0, n)`` in at most ``torch.get_num_threads()`` chunks of at least ``min_chunk``."""
    threads = max(1, torch.get_num_threads())
    per = max(-(-n // threads), min_chunk, 1)
    return [(i, min(n, i + per)) for i in range(0, n, per)]


class Chunks:
    """The chunks one kernel call splits ``[0, n)`` into (rows or elements), and the call.

    Every chunked kernel takes ``bounds`` [chunks + 1] and the chunks ``[c0, c1)`` to run as
    its last three arguments; kernels that sum over rows write one partial sum per chunk
    (:meth:`partials`), which the caller adds up.
    """

    def __init__(self, n: int, min_chunk: int) -> None:
        parts = split_range(n, min_chunk)
        self.count = len(parts)
        self.bounds = torch.tensor([0] + [hi for _, hi in parts], dtype=torch.int64)

    def partials(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Zeroed ``[chunks, *shape]``: one partial sum per chunk."""
        return torch.zeros(self.count, *shape, dtype=dtype)

    def run(self, lib: ctypes.CDLL, name: str, *args: Any) -> list[Any]:
        """``lib.name(*args, bounds, c0, c1)`` over all chunks: in one call where the library
        runs them in parallel itself, else one call per chunk on the thread pool. Returns
        what the calls returned, in chunk order."""
        kernel, bounds = getattr(lib, name), self.bounds.data_ptr()
        if self.count <= 1 or runs_chunks_itself(lib):
            return [kernel(*args, bounds, 0, self.count)]
        return _on_pool(self.count, lambda c: kernel(*args, bounds, c, c + 1))


def _on_pool(count: int, fn: Callable[[int], Any]) -> list[Any]:
    """``[fn(c) for c in range(count)]``, in parallel: the calling thread runs the first itself
    (one hand-over fewer), the pool the others."""
    pool = _pool.get("pool")
    if pool is None:
        pool = _pool["pool"] = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
    futures = [pool.submit(fn, c) for c in range(1, count)]
    first = fn(0)
    return [first, *(future.result() for future in futures)]


def _reset_pool_after_fork() -> None:
    _pool.pop("pool", None)  # a forked child inherits the pool object but not its threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)
