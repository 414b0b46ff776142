"""Column coders: dense codes of a column's values, kept across chunks, with train counts.

A :class:`ColumnCoder` (one per field, ``coder.c``) gives every row of each chunk its code
(0 = missing, else 1 + the index of its value among the distinct values seen so far, in
order of first appearance) and counts each distinct value's train rows. Fitting then needs
only the distinct values and their counts (:meth:`ColumnCoder.state`: exactly what counting
the rows gives, whatever the chunking), and encoding a chunk is one gather per column through
a table of per-value answers indexed by code (:class:`Answers`).

Values are 64-bit: a categorical's key (a Criteo hash widened, or a string's key), or
a numeric's float64 bits (``-0.0`` made ``0.0`` first, so that equal numbers have equal bits;
the coder does it as it reads them).

A string categorical's key is :data:`STRING_HASH` of its text (:func:`string_keys`): XXH64,
xxHash's 64-bit function, of the value's UTF-8 bytes with seed 0. It is ours, not a library's
(polars does not keep its string hash from one version to the next), so a vocabulary keyed by
it stays valid across upgrades; prepare and serving both key strings here, and a prepared
directory records the name (:func:`check_string_hash`).

Built with the system C compiler; where none is found the pipeline cannot run and says so.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.cbuild import LazyLibrary
from ctrcal.core.errors import DataError

_SOURCE = Path(__file__).with_name("coder.c")


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.coder_new.argtypes = [i64]
    lib.coder_new.restype = ptr
    lib.coder_free.argtypes = [ptr]
    lib.coder_free.restype = None
    lib.coder_code.argtypes = [ptr, ptr, ctypes.c_int, ptr, ptr, i64, ptr, ptr, i64, ptr]
    lib.coder_code.restype = i64
    lib.coder_state.argtypes = [ptr, i64, ptr, ptr, ptr]
    lib.coder_state.restype = None
    lib.gather_columns.argtypes = [i64, ptr, ptr, i64, i64, ptr, i64]
    lib.gather_columns.restype = None
    lib.hash_string_stream.argtypes = [ptr, ptr, i64]
    lib.hash_string_stream.restype = i64


_LIBRARY = LazyLibrary(_SOURCE, "coder", _declare)
_KINDS = {np.dtype(np.uint64): 0, np.dtype(np.uint32): 1, np.dtype(np.float64): 2}
"""The value kinds of ``coder_code`` (``coder.c``): 64-bit keys, 32-bit keys, float64 numbers."""


def _library() -> ctypes.CDLL:
    lib = _LIBRARY.get()
    if lib is None:
        raise DataError(
            "cannot build ctrcal's column coder (a C compiler is needed to prepare data "
            f"and to key string categoricals): {_LIBRARY.error}"
        )
    return lib


FOLD = 2**32 - 1
"""Rows after which the coder moves its 32-bit per-value counts into 64-bit totals (so that no
count wraps); tests fold every few rows."""


class ColumnCoder:
    """One field's codes and train counts over all chunks coded so far (``fold``: see
    :data:`FOLD`)."""

    def __init__(self, fold: int = FOLD) -> None:
        if not 1 <= fold <= FOLD:
            raise ValueError(f"ColumnCoder: fold must be in [1, {FOLD}], got {fold}")
        self._lib = _library()
        self._handle = self._lib.coder_new(fold)
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
        out: np.ndarray | Sequence[np.ndarray] | None = None,
        at: np.ndarray | None = None,
    ) -> np.ndarray | Sequence[np.ndarray]:
        """The int32 codes of ``values`` ([N] uint64 or uint32 keys, a key the same number in
        either; or float64 numbers, their bits coded with ``-0.0`` as ``0.0``), counting the
        rows where ``train`` ([N] uint8, optional) is 1; ``valid`` ([N] uint8, optional) is 0
        where a value is missing.

        Row ``i``'s code goes to ``out[i]`` (``out`` [N] int32; default a new array), or with
        ``at`` ([N] int64) to ``out[at[i]]``, or, ``out`` being a list of contiguous int32
        segments, to ``out[at[i] >> 32][at[i] & 0xFFFFFFFF]`` (the pipeline codes a chunk's
        rows straight into their splits' blocks). Returns ``out``.

        Raises:
            ValueError: a position outside its segment (the codes written so far stand).
        """
        kind = _KINDS.get(values.dtype)
        if kind is None:
            raise ValueError(
                f"ColumnCoder.code: uint64, uint32 or float64 values, got {values.dtype}"
            )
        values = np.ascontiguousarray(values)
        n = len(values)
        if valid is not None:
            valid = np.ascontiguousarray(valid, dtype=np.uint8)
        if train is not None:
            train = np.ascontiguousarray(train, dtype=np.uint8)
        if out is None:
            out = np.empty(n, dtype=np.int32)
        segments = [out] if isinstance(out, np.ndarray) else list(out)
        for o in segments:
            if o.dtype != np.int32 or o.ndim != 1 or not o.flags.c_contiguous:
                raise ValueError("ColumnCoder.code: out must be contiguous int32 [N] arrays")
        if at is not None:
            at = np.ascontiguousarray(at, dtype=np.int64)
            if len(at) != n:
                raise ValueError("ColumnCoder.code: at must be [N]")
        elif len(segments) != 1 or len(segments[0]) < n:
            raise ValueError("ColumnCoder.code: without at, out is one [N] array")
        k = len(segments)
        d = self._lib.coder_code(
            self._handle,
            values.ctypes.data,
            kind,
            None if valid is None else valid.ctypes.data,
            None if train is None else train.ctypes.data,
            n,
            (ctypes.c_void_p * k)(*(o.ctypes.data for o in segments)),
            (ctypes.c_int64 * k)(*(len(o) for o in segments)),
            k,
            None if at is None else at.ctypes.data,
        )
        if d == -2:
            raise ValueError("ColumnCoder.code: a position of at is outside its segment")
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


class Answers:
    """Per column the answer of every code (entry 0: missing), gathered by code in one call.

    Args:
        tables: per column ``[D_j + 1]`` 4-byte answers (int32 ids or float32 model values),
            for the codes ``[0, D_j]`` its coder gives.
    """

    def __init__(self, tables: list[np.ndarray]) -> None:
        self.tables = [np.ascontiguousarray(t) for t in tables]
        if any(t.dtype.itemsize != 4 or t.ndim != 1 for t in self.tables):
            raise ValueError("Answers: tables of 4-byte answers")
        self._pointers = (ctypes.c_void_p * len(tables))(*(t.ctypes.data for t in self.tables))

    def gather(self, codes: np.ndarray, out: np.ndarray) -> None:
        """``out[j] = tables[j][codes[j]]`` for every column ``j`` in one call that releases
        the GIL, without NumPy's widening copy of the indices: ``codes`` [F, N] int32 as the
        coders give them, ``out`` [F, N] of 4-byte items (each row of both contiguous; the
        rows of ``out`` hold the bits of their tables' dtypes)."""
        f, n = codes.shape
        if f != len(self.tables) or out.shape != (f, n):
            raise ValueError("Answers.gather: codes and out [F, N] for the F tables")
        if codes.dtype != np.int32 or out.dtype.itemsize != 4:
            raise ValueError("Answers.gather: int32 codes, 4-byte out")
        if n == 0:
            return
        if codes.strides[1] != 4 or out.strides[1] != 4:
            raise ValueError("Answers.gather: the rows of codes and out must be contiguous")
        _library().gather_columns(
            f,
            self._pointers,
            codes.ctypes.data,
            codes.strides[0] // 4,
            n,
            out.ctypes.data,
            out.strides[0] // 4,
        )


STRING_HASH = "xxh64"
"""The name of the function that keys string categoricals (XXH64 of the UTF-8 bytes, seed 0;
``coder.c``), as a prepared directory records it."""


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p


def string_keys(texts: Any, out: np.ndarray | None = None) -> np.ndarray:
    """[N] uint64 keys of string categorical values: :data:`STRING_HASH` of each text's UTF-8
    bytes, 0 where a value is null (its validity says missing; the key is not read).

    Args:
        texts: a polars String Series, or any Arrow array of strings, string views or large
            strings (an object with ``__arrow_c_stream__``: a pyarrow ChunkedArray), read in
            place chunk by chunk through the Arrow C stream interface; or a sequence of
            ``str`` / None.
        out: a contiguous [N] uint64 array to write the keys into (default a new one).

    Raises:
        ValueError: values that are not strings, or an ``out`` of another shape or dtype.
    """
    if not hasattr(texts, "__arrow_c_stream__"):
        import polars as pl

        texts = pl.Series(list(texts), dtype=pl.String)
    n = len(texts)
    if out is None:
        out = np.empty(n, dtype=np.uint64)
    if out.dtype != np.uint64 or out.shape != (n,) or not out.flags.c_contiguous:
        raise ValueError("string_keys: out must be a contiguous uint64 [N] array")
    capsule = texts.__arrow_c_stream__()  # owns the stream: released with it
    stream = _capsule_pointer(capsule, b"arrow_array_stream")
    got = _library().hash_string_stream(stream, out.ctypes.data, n)
    if got != n:
        raise ValueError(f"string_keys: {n} values that are not all strings")
    return out


def check_string_hash(feature_map: dict[str, Any], where: str) -> None:
    """Raise DataError (one line) when a prepared directory's string categoricals were keyed
    by another function than :data:`STRING_HASH`: by the name its feature map records, or, with
    none recorded, by polars' string hash (what ctrcal used before). Their vocabulary would
    miss every value encoded now. A directory without string categoricals passes."""
    schema = feature_map.get("schema") or {}
    if schema.get("categorical_spelling") != "string" or not schema.get("categorical"):
        return
    recorded = feature_map.get("string_hash")
    if recorded == STRING_HASH:
        return
    made = (
        f"keyed by {recorded!r}"
        if recorded is not None
        else "keyed by polars' string hash (an earlier ctrcal)"
    )
    raise DataError(
        f"{where}: its string categoricals were {made}, which this ctrcal does not use "
        f"(it keys them with {STRING_HASH}): re-run prepare"
    )


__all__ = ["FOLD", "STRING_HASH", "Answers", "ColumnCoder", "check_string_hash", "string_keys"]
