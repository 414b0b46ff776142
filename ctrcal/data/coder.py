"""Column coders: dense codes of a column's values, kept across chunks, with train counts.

A :class:`ColumnCoder` (one per field, ``coder.c``) gives every row of each chunk its code
(0 = missing, else 1 + the index of its value among the distinct values seen so far, in
order of first appearance) and counts each distinct value's train rows. Fitting then needs
only the distinct values and their counts (:meth:`ColumnCoder.state`: exactly what counting
the rows gives, whatever the chunking), and encoding a chunk is one gather per column through
a table of per-value answers indexed by code (:func:`gather`).

Values are 64-bit: a categorical's key (a Criteo hash widened, or a string's 64-bit hash), or
a numeric's float64 bits (``-0.0`` made ``0.0`` first, so that equal numbers have equal bits).
Built with the system C compiler; where none is found the pipeline cannot run and says so.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ctrcal.core.cbuild import LazyLibrary
from ctrcal.core.errors import DataError

_SOURCE = Path(__file__).with_name("coder.c")


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.coder_new.argtypes = []
    lib.coder_new.restype = ptr
    lib.coder_free.argtypes = [ptr]
    lib.coder_free.restype = None
    lib.coder_code.argtypes = [ptr, ptr, ptr, ptr, i64, ptr]
    lib.coder_code.restype = i64
    lib.coder_state.argtypes = [ptr, i64, ptr, ptr, ptr]
    lib.coder_state.restype = None
    lib.gather4.argtypes = [ptr, ptr, i64, ptr]
    lib.gather4.restype = None


_LIBRARY = LazyLibrary(_SOURCE, "coder", _declare)


def _library() -> ctypes.CDLL:
    lib = _LIBRARY.get()
    if lib is None:
        raise DataError(
            f"cannot build ctrcal's column coder (a C compiler is needed to "
            f"prepare data): {_LIBRARY.error}"
        )
    return lib


class ColumnCoder:
    """One field's codes and train counts over all chunks coded so far."""

    def __init__(self) -> None:
        self._lib = _library()
        self._handle = self._lib.coder_new()
        if not self._handle:
            raise MemoryError("column coder: out of memory")
        self.distinct = 0

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.coder_free(handle)

    def code(
        self, values: np.ndarray, valid: np.ndarray | None, train: np.ndarray | None
    ) -> np.ndarray:
        """[N] int32 codes of ``values`` ([N] uint64), counting the rows where ``train`` ([N]
        uint8, optional) is 1; ``valid`` ([N] uint8, optional) is 0 where a value is missing."""
        values = np.ascontiguousarray(values, dtype=np.uint64)
        n = len(values)
        if valid is not None:
            valid = np.ascontiguousarray(valid, dtype=np.uint8)
        if train is not None:
            train = np.ascontiguousarray(train, dtype=np.uint8)
        codes = np.empty(n, dtype=np.int32)
        d = self._lib.coder_code(
            self._handle,
            values.ctypes.data,
            None if valid is None else valid.ctypes.data,
            None if train is None else train.ctypes.data,
            n,
            codes.ctypes.data,
        )
        if d < 0:
            raise MemoryError("column coder: out of memory for the value table")
        self.distinct = int(d)
        return codes

    def state(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(distinct [D] uint64, train_counts [D] int64, train_missing)``."""
        d = self.distinct
        distinct = np.empty(d, dtype=np.uint64)
        counts = np.empty(d, dtype=np.int64)
        missing = ctypes.c_int64(0)
        self._lib.coder_state(
            self._handle, d, distinct.ctypes.data, counts.ctypes.data, ctypes.byref(missing)
        )
        return distinct, counts, int(missing.value)


def numeric_bits(x: np.ndarray) -> np.ndarray:
    """[N] float64 -> [N] uint64 bits to code (``-0.0`` as ``0.0``)."""
    return (np.asarray(x, dtype=np.float64) + 0.0).view(np.uint64)


def gather(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """[N] ``table[codes]`` for a 4-byte ``table`` ([D + 1]; ``codes`` [N] int32 in
    ``[0, D]``, as a coder gives them), without numpy's widening copy of the indices."""
    out = np.empty(len(codes), dtype=table.dtype)
    table = np.ascontiguousarray(table)
    codes = np.ascontiguousarray(codes, dtype=np.int32)
    _library().gather4(table.ctypes.data, codes.ctypes.data, len(codes), out.ctypes.data)
    return out


__all__ = ["ColumnCoder", "gather", "numeric_bits"]
