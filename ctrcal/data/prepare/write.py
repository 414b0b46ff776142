"""The one writer: encoded rows of each split -> ``part-NNNNN.parquet`` files.

:class:`PartWriter` holds a split's rows in the buffers of one part of :data:`PART_ROWS` rows
(the last one of a split may be shorter), which the encoder fills in place
(:meth:`PartWriter.reserve`), and writes each full part in row groups of
:data:`ROW_GROUP_ROWS` rows, so the files written never depend on how the input was cut.
:func:`encoded_columns` is the columns' one definition.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from ctrcal.core.criteo_schema import LABEL

PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
PART_ROWS = 2 * ROW_GROUP_ROWS
"""Rows per parquet part (262k, ~14 MB of encoded data; ~40 MB while held)."""
COMPRESSION = "lz4"
"""The parts' codec (polars' ``lz4`` is parquet's LZ4_RAW), values plainly encoded: about
0.6x the time of pyarrow's dictionary-encoded parts, for files about 1.25x their size."""


@dataclass(frozen=True)
class Column:
    """One encoded column: its name, its NumPy dtype, and whether NaN in it means null."""

    name: str
    dtype: np.dtype
    nan_is_null: bool


def encoded_columns(numeric: list[str], categorical: list[str], with_prob: bool) -> list[Column]:
    """``label`` float32 (null = unlabelled), numerics float32 (null = missing), categoricals
    int32, then ``true_prob`` float32 for generated data. The encoder writes a missing label or
    numeric as NaN, which the part stores as null (a NaN read back from a part is null)."""
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    columns = [Column(LABEL, f32, True)]
    columns += [Column(n, f32, True) for n in numeric]
    columns += [Column(c, i32, False) for c in categorical]
    if with_prob:
        columns.append(Column(PROB_COL, f32, False))
    return columns


class PartWriter:
    """The ``rows`` encoded rows of one split -> ``directory/part-NNNNN.parquet`` (see the
    module docstring); :meth:`close` writes one empty part for a split that got no rows.

    A part's rows are held in one block, a row of 4-byte items per column (float32, or the
    bits of an int32 column); a full part is written by a job of ``pool`` (polars encodes a
    file's columns on its own threads; parts written side by side keep the cores busy through
    each file's serial steps); at most ``pool``'s worker count of parts wait, so memory is a
    few parts whatever the split's size.
    """

    def __init__(self, directory: Path, columns: list[Column], rows: int, pool: Executor) -> None:
        self.directory = directory
        self.columns = columns
        self.pool = pool
        directory.mkdir()
        self._left = rows  # rows not yet reserved: a split's last part is held at its size
        self._block: np.ndarray | None = None
        self._filled = 0
        self._parts = 0
        self._jobs: list[Future] = []

    def reserve(self, rows: int) -> np.ndarray:
        """[C, m] view of the next ``m = min(rows, room)`` rows of the current part (row ``j``:
        column ``j``), for the caller to fill before its next call; a full part is written
        first."""
        if self._block is not None and self._filled == self._block.shape[1]:
            self._submit()
        if self._block is None:
            size = min(PART_ROWS, self._left)
            self._block = np.empty((len(self.columns), size), dtype=np.float32)
        start = self._filled
        self._filled = min(self._block.shape[1], start + rows)
        if self._filled == start:
            raise ValueError(f"{self.directory}: more rows than the split's {self._left}")
        self._left -= self._filled - start
        return self._block[:, start : self._filled]

    def _submit(self) -> None:
        block = None if self._block is None else self._block[:, : self._filled]
        path = self.directory / f"part-{self._parts:05d}.parquet"
        self._block, self._filled = None, 0
        self._parts += 1
        limit = getattr(self.pool, "_max_workers", 1)
        while len(self._jobs) >= limit:
            self._jobs.pop(0).result()
        self._jobs.append(self.pool.submit(_write_part, path, self.columns, block))

    def close(self) -> None:
        """Write what is held and wait for every part; a split that got no rows gets one
        empty part."""
        if self._filled or self._parts == 0:
            self._submit()
        for job in self._jobs:
            job.result()
        self._jobs = []


def _write_part(path: Path, columns: list[Column], block: np.ndarray | None) -> None:
    """One part file in row groups of :data:`ROW_GROUP_ROWS` rows (``block``: [C, N], None
    for an empty part)."""
    if block is not None:
        frame = pl.DataFrame(
            [
                pl.Series(c.name, row.view(c.dtype), nan_to_null=c.nan_is_null)
                for c, row in zip(columns, block, strict=True)
            ]
        )
    else:
        dtypes = {np.dtype(np.float32): pl.Float32, np.dtype(np.int32): pl.Int32}
        frame = pl.DataFrame(schema={c.name: dtypes[c.dtype] for c in columns})
    with open(path, "wb") as fh:
        sink = _Sink(fh)
        try:
            frame.write_parquet(
                sink, compression=COMPRESSION, statistics=False, row_group_size=ROW_GROUP_ROWS
            )
        except pl.exceptions.PolarsError:
            if sink.error is not None:
                raise sink.error from None
            raise


class _Sink:
    """A file that keeps the ``OSError`` of a failed write (a full disk, say): polars reports
    it as a ``ComputeError``, the preparation as every other file's ``OSError``."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


__all__ = ["PART_ROWS", "PROB_COL", "ROW_GROUP_ROWS", "Column", "PartWriter", "encoded_columns"]
