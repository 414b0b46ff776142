"""Column coders: dense codes of a column's values, kept across chunks, with train counts.

A :class:`ColumnCoder` (one per field, ``coder.c``) gives every row of each chunk its code
(0 = missing, else 1 + the index of its value among the distinct values seen so far, in
order of first appearance) and counts each distinct value's train rows. Fitting then needs
only the distinct values and their counts (:meth:`ColumnCoder.state`: exactly what counting
the rows gives, whatever the chunking), and encoding a chunk is one gather per column through
a table of per-value answers indexed by code (:func:`gather_columns`).

Values are 64-bit: a categorical's key (a Criteo hash widened, or a string's 64-bit hash), or
a numeric's float64 bits (``-0.0`` made ``0.0`` first, so that equal numbers have equal bits;
the coder does it as it reads them).
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
    lib.coder_code.argtypes = [ptr, ptr, ctypes.c_int, ptr, ptr, i64, ptr, ptr]
    lib.coder_code.restype = i64
    lib.coder_state.argtypes = [ptr, i64, ptr, ptr, ptr]
    lib.coder_state.restype = None
    lib.gather_columns.argtypes = [i64, ptr, ptr, i64, i64, ptr]
    lib.gather_columns.restype = None


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
        self,
        values: np.ndarray,
        valid: np.ndarray | None,
        train: np.ndarray | None,
        out: np.ndarray | None = None,
        at: np.ndarray | None = None,
    ) -> np.ndarray:
        """[N] int32 codes of ``values`` ([N] uint64 keys, or float64 numbers: their bits are
        coded, ``-0.0`` as ``0.0``), counting the rows where ``train`` ([N] uint8, optional) is
        1; ``valid`` ([N] uint8, optional) is 0 where a value is missing. The code of row ``i``
        goes to ``out[at[i]]`` (``out`` [N] int32, ``at`` [N] int64 distinct positions in
        ``[0, N)``; default ``out[i]`` of a new array); returns ``out``."""
        numbers = values.dtype == np.float64
        values = np.ascontiguousarray(values, dtype=np.float64 if numbers else np.uint64)
        n = len(values)
        if valid is not None:
            valid = np.ascontiguousarray(valid, dtype=np.uint8)
        if train is not None:
            train = np.ascontiguousarray(train, dtype=np.uint8)
        if out is None:
            out = np.empty(n, dtype=np.int32)
        if out.dtype != np.int32 or len(out) != n or not out.flags.c_contiguous:
            raise ValueError("ColumnCoder.code: out must be [N] contiguous int32")
        if at is not None:
            at = np.ascontiguousarray(at, dtype=np.int64)
            if len(at) != n:
                raise ValueError("ColumnCoder.code: at must be [N]")
        d = self._lib.coder_code(
            self._handle,
            values.ctypes.data,
            int(numbers),
            None if valid is None else valid.ctypes.data,
            None if train is None else train.ctypes.data,
            n,
            out.ctypes.data,
            None if at is None else at.ctypes.data,
        )
        if d < 0:
            raise MemoryError("column coder: out of memory for the value table")
        self.distinct = int(d)
        return out

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


def gather_columns(tables: list[np.ndarray], codes: np.ndarray, outs: list[np.ndarray]) -> None:
    """``outs[j][:] = tables[j][codes[j]]`` for every column ``j``, in one call that releases
    the GIL: ``tables[j]`` [D_j + 1] 4-byte answers (int32 or float32), ``codes`` [F, N] int32
    in ``[0, D_j]`` as the coders give them (each row contiguous), ``outs[j]`` [N]
    contiguous, of its table's dtype; without NumPy's widening copy of the indices."""
    f, n = codes.shape
    if not (len(tables) == len(outs) == f) or codes.dtype != np.int32:
        raise ValueError("gather_columns: one table and one output per int32 row of codes")
    if n == 0:
        return
    if codes.strides[1] != 4:
        raise ValueError("gather_columns: each row of codes must be contiguous")
    for t, o in zip(tables, outs, strict=True):
        if t.dtype.itemsize != 4 or o.dtype != t.dtype or len(o) != n:
            raise ValueError("gather_columns: 4-byte tables and outputs of their dtype, n long")
        if not (t.flags.c_contiguous and o.flags.c_contiguous):
            raise ValueError("gather_columns: contiguous tables and outputs")
    pointers = ctypes.c_void_p * f
    _library().gather_columns(
        f,
        pointers(*(t.ctypes.data for t in tables)),
        codes.ctypes.data,
        codes.strides[0] // 4,
        n,
        pointers(*(o.ctypes.data for o in outs)),
    )


__all__ = ["ColumnCoder", "gather_columns"]
