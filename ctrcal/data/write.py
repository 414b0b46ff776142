"""The one writer: encoded rows of each split -> ``part-NNNNN.parquet`` files.

:class:`PartWriter` writes a split's rows, as they come chunk by chunk, into parts of at most
:data:`PART_ROWS` rows in row groups of exactly :data:`ROW_GROUP_ROWS` rows (the last one of a
split may be shorter), so the files written never depend on how the input was cut.
:func:`encoded_schema` is the columns' one definition.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ctrcal.data.criteo_schema import LABEL

PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
PART_ROWS = 128 * ROW_GROUP_ROWS
"""Rows per parquet part (16.8M, ~1 GB of encoded data)."""


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
    docstring); :meth:`close` writes one empty part for a split that got no rows."""

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.directory = directory
        self.schema = schema
        directory.mkdir()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._parts = 0
        self._part_rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        full = table.num_rows if final else table.num_rows - table.num_rows % ROW_GROUP_ROWS
        done = 0
        while done < full:
            if self._writer is None:
                path = self.directory / f"part-{self._parts:05d}.parquet"
                self._writer = pq.ParquetWriter(path, self.schema, compression="snappy",
                                                write_statistics=False)  # fmt: skip
                self._parts += 1
                self._part_rows = 0
            n = min(full - done, ROW_GROUP_ROWS, PART_ROWS - self._part_rows)
            self._writer.write_table(table.slice(done, n), row_group_size=n)
            done += n
            self._part_rows += n
            if self._part_rows >= PART_ROWS:
                self._writer.close()
                self._writer = None
        rest = table.slice(full)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> None:
        """Write what is pending; a split that got no rows gets one empty part."""
        self._flush(final=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._parts == 0:
            pq.write_table(self.schema.empty_table(), self.directory / "part-00000.parquet",
                           compression="snappy", write_statistics=False)  # fmt: skip


__all__ = ["PART_ROWS", "PROB_COL", "ROW_GROUP_ROWS", "PartWriter", "encoded_schema"]
