"""Dense codes of integer columns with their train counts, from a small C kernel.

:func:`code_columns` runs ``column_codes.c`` over each column (a column per thread; ctypes
releases the GIL): one pass gives every row's code (0 = missing, else 1 + the index of its
value among the column's distinct values) and each distinct value's number of train rows.
Fitting then needs only the distinct values, and encoding a column is one gather through a
table indexed by code (:meth:`ColumnCodes.gather`), the same per-value answer for every row
that carries the value.

Like :mod:`ctrcal.data.tsv_reader` (whose columns it reads), it is built with the system C
compiler; where none is found :func:`available` is False and callers take the polars way.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.cbuild import LazyLibrary
from ctrcal.data.tsv_reader import ENV_SWITCH

_SOURCE = Path(__file__).with_name("column_codes.c")
MAX_ROWS = (1 << 31) - 1
"""Rows one call can code (codes and destinations are int32)."""


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.code_column.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr]
    lib.code_column.restype = i64
    lib.gather4.argtypes = [ptr, ptr, i64, ptr]
    lib.gather4.restype = None


_LIBRARY = LazyLibrary(_SOURCE, "column_codes", _declare)


def _library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be built."""
    return _LIBRARY.get()


def available() -> bool:
    """Whether the kernel is switched on (the C reader's switch) and builds here."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and _library() is not None


@dataclass
class ColumnCodes:
    """One column coded: ``codes`` [N] int32 (0 = missing), ``distinct`` [D] values (the
    column's dtype, in order of first appearance), ``train_counts`` [D] int64 and
    ``train_missing`` (missing values among the train rows)."""

    codes: np.ndarray
    distinct: np.ndarray
    train_counts: np.ndarray
    train_missing: int

    def gather(self, per_value: np.ndarray, missing: Any, reuse: bool = False) -> np.ndarray:
        """[N] ``per_value[index of the row's value]``, ``missing`` where the value is missing.

        Args:
            per_value: [D] the answer for each distinct value.
            missing: the answer for a missing value (of ``per_value``'s dtype).
            reuse: write 4-byte answers over ``codes`` (then no longer usable) instead of
                into new memory: the last gather of a column costs no fresh pages.
        """
        table = np.empty(len(per_value) + 1, dtype=per_value.dtype)
        table[0] = missing
        table[1:] = per_value
        if table.itemsize != 4:
            return table.take(self.codes)
        out = self.codes.view(table.dtype) if reuse else np.empty(len(self.codes), table.dtype)
        # codes lie in [0, len(per_value)] by construction (see code_column); each is read
        # before its own slot is written, so out may be codes itself
        _library().gather4(table.ctypes.data, self.codes.ctypes.data, len(out), out.ctypes.data)
        if reuse:
            self.codes = None  # type: ignore[assignment]
        return out


def code_column(
    values: np.ndarray, valid: np.ndarray | None, train: np.ndarray, dest: np.ndarray | None = None
) -> ColumnCodes:
    """Code one column (see the module docstring).

    Args:
        values: [N] int64 or uint64 (contiguous).
        valid: [N] uint8, 0 where the value is missing; None if none is.
        train: [N] uint8, 1 on the rows of the train split.
        dest: [N] int32, a permutation of ``range(N)``: row ``i``'s code is ``codes[dest[i]]``
            (rows reordered for free, e.g. grouped by split); None keeps the order.

    Raises:
        MemoryError: the kernel's table could not grow.
        ValueError: ``dest`` of the wrong shape or pointing outside ``range(N)``.
        RuntimeError: the kernel is unavailable (check :func:`available` first).
    """
    lib = _library()
    if lib is None:
        raise RuntimeError("the column_codes kernel is not available")
    n = len(values)
    if n > MAX_ROWS:
        raise ValueError(f"{n} rows: at most {MAX_ROWS} can be coded at once")
    values = np.ascontiguousarray(values)
    if values.dtype not in (np.int64, np.uint64):
        raise TypeError(f"code_column takes int64 or uint64 values, got {values.dtype}")
    train = np.ascontiguousarray(train, dtype=np.uint8)
    if valid is not None:
        valid = np.ascontiguousarray(valid, dtype=np.uint8)
    if dest is not None:
        dest = np.ascontiguousarray(dest, dtype=np.int32)
        if dest.shape != (n,):
            raise ValueError(f"dest has shape {dest.shape}, expected ({n},)")
    codes = np.empty(n, dtype=np.int32)
    distinct = np.empty(n, dtype=values.dtype)  # pages are touched only as far as used
    counts = np.empty(n, dtype=np.int64)
    missing = ctypes.c_int64(0)
    d = lib.code_column(values.ctypes.data, None if valid is None else valid.ctypes.data,
                        train.ctypes.data, None if dest is None else dest.ctypes.data, n,
                        codes.ctypes.data, distinct.ctypes.data,
                        counts.ctypes.data, ctypes.byref(missing))  # fmt: skip
    if d == -2:
        raise ValueError("dest points outside the rows")
    if d < 0:
        raise MemoryError("column_codes: out of memory for the value table")
    return ColumnCodes(codes, distinct[:d].copy(), counts[:d].copy(), int(missing.value))


def code_columns(
    columns: list[tuple[np.ndarray, np.ndarray | None]],
    train: np.ndarray,
    threads: int,
    dest: np.ndarray | None = None,
) -> list[ColumnCodes]:
    """:func:`code_column` of each ``(values, valid)``, ``threads`` columns at a time."""
    train = np.ascontiguousarray(train, dtype=np.uint8)
    if threads <= 1 or len(columns) <= 1:
        return [code_column(v, m, train, dest) for v, m in columns]
    with ThreadPoolExecutor(min(threads, len(columns))) as pool:
        return list(pool.map(lambda c: code_column(c[0], c[1], train, dest), columns))


__all__ = ["MAX_ROWS", "ColumnCodes", "available", "code_column", "code_columns"]
