"""The one writer: encoded rows of each split -> ``part-NNNNN.parquet`` files.

:class:`PartWriter` writes a split's rows, as they come chunk by chunk, into parts of
:data:`PART_ROWS` rows (the last one of a split may be shorter) in row groups of
:data:`ROW_GROUP_ROWS` rows, so the files written never depend on how the input was cut.
:func:`encoded_schema` is the columns' one definition.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ctrcal.core.criteo_schema import LABEL

PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
PART_ROWS = 2 * ROW_GROUP_ROWS
"""Rows per parquet part (262k, ~10 MB of encoded data; ~40 MB while held): parts are written
side by side, one per thread, so a split of a small file is a few parts, not one."""
COMPRESSION = "lz4_raw"
"""The parts' codec: as small as snappy's output here, and written in about 0.6x its time
(the dictionary encoding of the int32 codes does most of the compressing)."""


def encoded_schema(numeric: list[str], categorical: list[str], with_prob: bool) -> pa.Schema:
    """``label`` float32 (null = unlabelled), numerics float32 (null = missing), categoricals
    int32, then ``true_prob`` float32 for generated data."""
    fields = [pa.field(LABEL, pa.float32())]
    fields += [pa.field(n, pa.float32()) for n in numeric]
    fields += [pa.field(c, pa.int32()) for c in categorical]
    if with_prob:
        fields.append(pa.field(PROB_COL, pa.float32()))
    return pa.schema(fields)


class PartWriter:
    """Encoded rows of one split -> ``directory/part-NNNNN.parquet`` (see the module
    docstring); :meth:`close` writes one empty part for a split that got no rows.

    Rows are held until a part is full, then the part is written by a job of ``pool`` (parquet
    encodes a file on one thread: parts written side by side keep the cores busy); at most
    ``pool``'s worker count of parts wait, so memory is a few parts whatever the split's size.
    """

    def __init__(self, directory: Path, schema: pa.Schema, pool: Executor) -> None:
        self.directory = directory
        self.schema = schema
        self.pool = pool
        directory.mkdir()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._parts = 0
        self._jobs: list[Future] = []

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= PART_ROWS:
            self._submit(PART_ROWS)

    def _submit(self, rows: int) -> None:
        table = pa.concat_tables(self._pending) if self._pending else self.schema.empty_table()
        part, rest = table.slice(0, rows), table.slice(rows)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows
        path = self.directory / f"part-{self._parts:05d}.parquet"
        self._parts += 1
        limit = getattr(self.pool, "_max_workers", 1)
        while len(self._jobs) >= limit:
            self._jobs.pop(0).result()
        self._jobs.append(self.pool.submit(_write_part, path, part, self.schema))

    def close(self) -> None:
        """Write what is pending and wait for every part; a split that got no rows gets one
        empty part."""
        if self._pending_rows or self._parts == 0:
            self._submit(self._pending_rows)
        for job in self._jobs:
            job.result()
        self._jobs = []


def _write_part(path: Path, table: pa.Table, schema: pa.Schema) -> None:
    """One part file in row groups of :data:`ROW_GROUP_ROWS` rows."""
    with pq.ParquetWriter(path, schema, compression=COMPRESSION, write_statistics=False) as w:
        if table.num_rows == 0:
            w.write_table(schema.empty_table())
        for start in range(0, table.num_rows, ROW_GROUP_ROWS):
            n = min(ROW_GROUP_ROWS, table.num_rows - start)
            w.write_table(table.slice(start, n), row_group_size=n)


__all__ = ["PART_ROWS", "PROB_COL", "ROW_GROUP_ROWS", "PartWriter", "encoded_schema"]
