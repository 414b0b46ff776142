"""Clean Criteo TSV files parsed by a small C kernel (``tsv_reader.c``), a chunk per thread.

:func:`read_clean` gives the frame :mod:`ctrcal.data.fastpath` reads with polars -- the label
and ``I1..I13`` as Int64, ``C1..C26`` as the ``uint64`` keys of their 8 bytes (see
:mod:`ctrcal.data.hexkeys`), null where a field is empty -- for files in the clean form only:
tab-separated without a header, every line with exactly the layout's fields, integers spelled
``-?[0-9]{1,18}``, hashes of exactly 8 hex digits. For anything else (or where no C compiler
is found, or with ``CTRCAL_NATIVE_READER=0``) it returns None and the caller reads the file
with polars as before, so what is accepted here is a subset of what polars accepts, read to
the same values.

The file is memory-mapped and cut at line boundaries into one chunk per thread; each thread
counts its lines, then parses them into its rows of preallocated columns (ctypes releases the
GIL, so the chunks run in parallel).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ctrcal.cbuild import LazyLibrary
from ctrcal.data.criteo import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS

ENV_SWITCH = "CTRCAL_NATIVE_READER"
"""Set to ``0`` to read every file with polars (the C reader is then never built)."""

_SOURCE = Path(__file__).with_name("tsv_reader.c")


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.tsv_count_rows.argtypes = [ptr, i64]
    lib.tsv_count_rows.restype = i64
    lib.tsv_parse.argtypes = [ptr, i64, ctypes.c_int, ctypes.c_int, i64, i64,
                              ptr, ptr, ptr, ptr]  # fmt: skip
    lib.tsv_parse.restype = i64


_LIBRARY = LazyLibrary(_SOURCE, "tsv_reader", _declare)


def _library() -> ctypes.CDLL | None:
    """The compiled reader, built on first use; None where it cannot be built."""
    return _LIBRARY.get()


def available() -> bool:
    """Whether the C reader is switched on and builds here."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and _library() is not None


def _clean_layout(fmt: Any) -> bool:
    head = (LABEL,) if fmt.labelled else ()
    columns = (*head, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS)
    return fmt.separator == "\t" and not fmt.has_header and tuple(fmt.columns) == columns


@dataclass
class CleanColumns:
    """A clean file's columns as the C reader leaves them (0/1 ``valid`` marks present values).

    ``ints`` [I, N] int64 and ``ivalid`` [I, N] uint8: the label (when ``labelled``), then
    ``I1..I13``; ``keys`` [26, N] uint64 and ``kvalid`` [26, N] uint8: ``C1..C26``'s keys (see
    :mod:`ctrcal.data.hexkeys`)."""

    ints: np.ndarray
    ivalid: np.ndarray
    keys: np.ndarray
    kvalid: np.ndarray
    labelled: bool

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    def frame(self) -> pl.DataFrame:
        """The columns as :func:`read_clean` gives them."""
        n = self.rows
        columns = [] if self.labelled else [pl.Series(LABEL, [None] * n, dtype=pl.Int64)]
        names = [LABEL] * self.labelled + list(NUMERIC_COLUMNS)
        columns += [nullable_series(m, self.ints[j], self.ivalid[j], pa.int64())
                    for j, m in enumerate(names)]  # fmt: skip
        columns += [nullable_series(m, self.keys[j], self.kvalid[j], pa.uint64())
                    for j, m in enumerate(CATEGORICAL_COLUMNS)]  # fmt: skip
        return pl.DataFrame(columns)


def read_clean(path: str | Path, fmt: Any, threads: int | None = None) -> pl.DataFrame | None:
    """The file's columns (see the module docstring), or None when it is not in the clean form.

    Args:
        path: an uncompressed text file.
        fmt: its :class:`~ctrcal.data.criteo.CriteoFormat`.
        threads: chunks parsed in parallel (default: polars' thread pool size, at most the
            cores).
    """
    columns = read_clean_columns(path, fmt, threads)
    return None if columns is None else columns.frame()


def read_clean_columns(
    path: str | Path, fmt: Any, threads: int | None = None
) -> CleanColumns | None:
    """:func:`read_clean`'s columns as numpy arrays (:class:`CleanColumns`), or None."""
    if not _clean_layout(fmt) or not available():
        return None
    lib = _library()
    size = os.path.getsize(path)
    if size == 0:
        return None  # polars reads an empty file
    threads = threads or min(pl.thread_pool_size(), os.cpu_count() or 1)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)
        try:
            return _parse(lib, mm, view.ctypes.data, size, fmt.labelled, max(1, threads))
        finally:
            del view  # the map closes only once no array looks at it


def _parse(
    lib: ctypes.CDLL, mm: mmap.mmap, base: int, size: int, labelled: bool, threads: int
) -> CleanColumns | None:
    cuts = [0]
    for k in range(1, threads):
        nl = mm.find(b"\n", max(size * k // threads, cuts[-1]))
        if nl < 0 or nl + 1 >= size:
            break
        cuts.append(nl + 1)
    cuts.append(size)
    spans = list(zip(cuts[:-1], cuts[1:], strict=True))
    with ThreadPoolExecutor(len(spans)) as pool:
        counts = list(pool.map(lambda s: lib.tsv_count_rows(base + s[0], s[1] - s[0]), spans))
        n = int(sum(counts))
        nint = len(NUMERIC_COLUMNS) + int(labelled)
        ncat = len(CATEGORICAL_COLUMNS)
        ints = np.empty((nint, n), dtype=np.int64)
        ivalid = np.empty((nint, n), dtype=np.uint8)
        keys = np.empty((ncat, n), dtype=np.uint64)
        kvalid = np.empty((ncat, n), dtype=np.uint8)
        firsts = np.cumsum([0, *counts[:-1]]).tolist()
        pointers = [a.ctypes.data for a in (ints, ivalid, keys, kvalid)]

        def parse(span: tuple[int, int], first: int) -> int:
            return lib.tsv_parse(base + span[0], span[1] - span[0], nint, ncat, n, first,
                                 *pointers)  # fmt: skip

        parsed = list(pool.map(parse, spans, firsts))
    if parsed != counts:
        return None  # a line not in the clean form: polars reads the file
    return CleanColumns(ints, ivalid, keys, kvalid, labelled)


def nullable_series(
    name: str,
    values: np.ndarray,
    valid: np.ndarray | None = None,
    dtype: pa.DataType | None = None,
) -> pl.Series:
    """``values`` ([N], contiguous) as a polars column without a copy, null where ``valid``
    ([N] bool or 0/1, optional) is 0 (an Arrow validity bitmap); ``dtype`` defaults to the
    Arrow type of ``values``. Built from Arrow buffers: polars' own conversion of numpy arrays
    (and ``pyarrow.array``) imports ``numpy.ma``, 10-50 ms once per process."""
    values = np.ascontiguousarray(values)
    dtype = dtype if dtype is not None else pa.from_numpy_dtype(values.dtype)
    nulls = 0 if valid is None else len(valid) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    array = pa.Array.from_buffers(dtype, len(values), [bitmap, pa.py_buffer(values)], nulls)
    return pl.Series(name, array)


__all__ = ["ENV_SWITCH", "CleanColumns", "available", "nullable_series", "read_clean",
           "read_clean_columns"]
