"""The C reader: a chunk of clean Criteo lines parsed by ``tsv_reader.c``, a piece per thread.

:func:`read_clean` gives a chunk's columns as :class:`~ctrcal.preparation.parsed.ParsedChunk` wants
them -- the label and ``I1..I13`` as float64, ``C1..C26`` read base 16 as ``uint32``, with 0/1
validity -- for chunks in the clean form only: fields separated by
one byte, the layout's canonical column order (``label, I1..I13, C1..C26`` or without the
label), integers spelled ``-?[0-9]{1,18}``, hashes of exactly 8 hex digits, every line with
the layout's fields or ending within its hash fields. For anything else (or where no C
compiler is found, or with ``CTRCAL_NATIVE_READER=0``) it returns None and
:mod:`ctrcal.preparation.parse` re-parses that chunk with polars, which reads the same values, so
what is accepted here is a subset of what polars accepts.

The chunk is cut at line boundaries into one piece per thread; each thread counts its lines,
then parses them into its rows of preallocated columns (ctypes releases the GIL).
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.cbuild import LazyLibrary
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS

ENV_SWITCH = "CTRCAL_NATIVE_READER"
"""Set to ``0`` to parse every chunk with polars (the C kernels are then never built)."""

_SOURCE = Path(__file__).with_name("tsv_reader.c")


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.tsv_count_rows.argtypes = [ptr, i64]
    lib.tsv_count_rows.restype = i64
    lib.tsv_parse.argtypes = [ptr, i64, cint, cint, cint, i64, i64, ptr, ptr, ptr, ptr]
    lib.tsv_parse.restype = i64


_LIBRARY = LazyLibrary(_SOURCE, "tsv_reader", _declare)


def available() -> bool:
    """Whether the C reader is switched on and builds here."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and _LIBRARY.get() is not None


def takes_layout(fmt: Any) -> bool:
    """Whether files of this :class:`~ctrcal.preparation.criteo.CriteoFormat` can be read in C at
    all (the canonical column order; a header is skipped before the chunks are cut)."""
    head = (LABEL,) if fmt.labelled else ()
    columns = (*head, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS)
    return len(fmt.separator) == 1 and tuple(fmt.columns) == columns and fmt.layout != "x1"


class Buffers:
    """The reader's output arrays, reused from chunk to chunk: fresh memory costs a page fault
    per page, as much as parsing into it. What :func:`read_clean` returns with them is valid
    until its next call."""

    def __init__(self) -> None:
        self.cap = 0
        self.arrays: tuple[np.ndarray, ...] = ()

    def get(self, nnum: int, ncat: int, n: int) -> tuple[tuple[np.ndarray, ...], int]:
        """Arrays of at least ``n`` columns (the row stride is the second value)."""
        if n > self.cap or self.arrays[0].shape[0] != nnum or self.arrays[2].shape[0] != ncat:
            self.cap = max(n, self.cap + self.cap // 4)
            self.arrays = (
                np.empty((nnum, self.cap), dtype=np.float64),
                np.empty((nnum, self.cap), dtype=np.uint8),
                np.empty((ncat, self.cap), dtype=np.uint32),
                np.empty((ncat, self.cap), dtype=np.uint8),
            )
        return self.arrays, self.cap


def read_clean(
    chunk: memoryview | bytes,
    fmt: Any,
    threads: int,
    buffers: Buffers | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The chunk's columns, or None when a line is not in the clean form.

    Args:
        chunk: whole lines of a file (see :func:`ctrcal.preparation.chunks.iter_text_chunks`).
        fmt: the file's format (:func:`takes_layout` must be true).
        threads: pieces parsed in parallel.
        buffers: reused output arrays (see :class:`Buffers`); None allocates new ones.
        pool: the threads that parse the pieces (a caller reading many chunks keeps one); None
            starts them for this chunk.

    Returns:
        ``(nums [I, N] float64, nvalid [I, N] uint8, cats [26, N] uint32, cvalid [26, N]
        uint8)``; ``nums`` holds the label first when ``fmt.labelled``, then ``I1..I13``.
        Each row of each array is contiguous.
    """
    lib = _LIBRARY.get()
    size = len(chunk)
    if size == 0:
        return None
    view = np.frombuffer(chunk, dtype=np.uint8)
    base = view.ctypes.data
    cuts = [0]
    for k in range(1, max(1, threads)):
        start = max(size * k // threads, cuts[-1])
        hits = np.flatnonzero(view[start : start + (1 << 20)] == 10)[:1]
        if not len(hits) or start + int(hits[0]) + 1 >= size:
            break
        cuts.append(start + int(hits[0]) + 1)
    cuts.append(size)
    spans = list(zip(cuts[:-1], cuts[1:], strict=True))
    nnum = len(NUMERIC_COLUMNS) + int(fmt.labelled)
    ncat = len(CATEGORICAL_COLUMNS)
    sep = ord(fmt.separator)

    def count(span: tuple[int, int]) -> int:
        return lib.tsv_count_rows(base + span[0], span[1] - span[0])

    def run(pool: ThreadPoolExecutor | None, fn: Any, *args: Any) -> list[int]:
        return list(pool.map(fn, *args)) if pool is not None else list(map(fn, *args))

    own = pool is None and len(spans) > 1
    if own:
        pool = ThreadPoolExecutor(len(spans))
    elif len(spans) == 1:
        pool = None
    try:
        counts = run(pool, count, spans)
        n = int(sum(counts))
        arrays, stride = (buffers or Buffers()).get(nnum, ncat, n)
        firsts = np.cumsum([0, *counts[:-1]]).tolist()
        pointers = [a.ctypes.data for a in arrays]

        def parse(span: tuple[int, int], first: int) -> int:
            return lib.tsv_parse(
                base + span[0], span[1] - span[0], sep, nnum, ncat, stride, first, *pointers
            )

        parsed = run(pool, parse, spans, firsts)
    finally:
        if own:
            pool.shutdown()
    del view
    if parsed != counts:
        return None  # a line not in the clean form: polars parses the chunk
    nums, nvalid, cats, cvalid = (a[:, :n] for a in arrays)
    return nums, nvalid, cats, cvalid


__all__ = ["ENV_SWITCH", "Buffers", "available", "read_clean", "takes_layout"]
