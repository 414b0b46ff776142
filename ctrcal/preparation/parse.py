"""The one parser entry: a raw file's chunks of whole lines -> typed, checked columns.

:func:`iter_chunks` cuts a file (plain or gzip, decompressed as it is read) into chunks of
whole lines (:func:`~ctrcal.preparation.chunks.iter_text_chunks`; a small file is one chunk) and
parses each one with the C reader first (:mod:`ctrcal.preparation.tsv_reader`). A chunk the C reader
cannot take -- a header CSV layout with an ``Id`` column, decimal ids, a float-written integer,
a malformed row -- is re-read by polars' text parser, that chunk only, and typed and checked
row by row by the one row validator (:mod:`ctrcal.preparation.row_check`), to which this module only
describes Criteo's columns; the first malformed row is named by file, line and column, or
malformed rows are skipped and counted. Schema'd files go to
:mod:`ctrcal.preparation.schema_reader`, which does the same for its columns.

Both give the same :class:`ParsedChunk`: the label and numerics as float64, categoricals as
their ``uint32`` values (hex read base 16, or Criteo_x1's decimal ids), with 0/1 validity, and
each row's record index in its file (for the split).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.preparation import criteo, tsv_reader
from ctrcal.preparation.chunks import iter_text_chunks
from ctrcal.preparation.criteo import CriteoFormat
from ctrcal.preparation.parsed import ParsedChunk, not_utf8
from ctrcal.preparation.row_check import Column, RowCheck

CHUNK_BYTES = 32 << 20
"""Text bytes per chunk (~140k Criteo rows): memory is a few chunks whatever the file size."""
ON_BAD_ROW: tuple[str, ...] = ("error", "skip")
"""What a malformed input row does: stop with its file and line, or be dropped and counted."""


def threads() -> int:
    """Threads for one process's parsing and coding: polars' pool size, at most the cores."""
    return max(1, min(pl.thread_pool_size(), os.cpu_count() or 1))


def iter_chunks(
    path: Path,
    fmt: Any,
    on_bad_row: str,
    chunk_bytes: int = CHUNK_BYTES,
    workers: int | None = None,
    ring: int = 1,
) -> Iterator[ParsedChunk]:
    """Parse a file chunk by chunk (see the module docstring). ``fmt`` is a Criteo file's
    :class:`~ctrcal.preparation.criteo.CriteoFormat`, or a schema'd file's
    :class:`~ctrcal.preparation.schema_reader.SchemaFormat` (read by
    :mod:`ctrcal.preparation.schema_reader`).
    The C reader's arrays are reused: a chunk is valid until ``ring`` more are asked for.

    Raises:
        DataError: unreadable file, corrupt gzip, text that is not UTF-8 (naming the line),
            or with ``on_bad_row="error"`` the first malformed row (file, line, column).
    """
    from ctrcal.preparation import schema_reader

    if isinstance(fmt, schema_reader.SchemaFormat):
        yield from schema_reader.iter_chunks(path, fmt, on_bad_row, chunk_bytes)
        return
    workers = workers or threads()
    native = tsv_reader.takes_layout(fmt) and tsv_reader.available()
    buffers = [tsv_reader.Buffers() for _ in range(max(1, ring))]
    offset = 0
    with ThreadPoolExecutor(workers) as pool:
        for k, chunk in enumerate(iter_text_chunks(path, chunk_bytes, fmt.header_lines)):
            reused = buffers[k % len(buffers)]
            parsed = _native(chunk, fmt, offset, workers, reused, pool) if native else None
            if parsed is None:
                parsed = _polars(chunk, path, fmt, offset, on_bad_row)
            offset += parsed.records
            yield parsed


def _native(
    chunk: memoryview | bytes,
    fmt: CriteoFormat,
    offset: int,
    workers: int,
    buffers: tsv_reader.Buffers | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> ParsedChunk | None:
    out = tsv_reader.read_clean(chunk, fmt, workers, buffers, pool)
    if out is None:
        return None
    nums, nvalid, cats, cvalid = out
    n = nums.shape[1]
    if fmt.labelled:
        label = nums[0]
        if not (nvalid[0].all() and ((label == 0) | (label == 1)).all()):
            return None  # a label other than 0/1: polars names the row
        nums, nvalid = nums[1:], nvalid[1:]
    else:
        label = np.full(n, np.nan)
    rows = np.arange(offset, offset + n, dtype=np.int64)
    return ParsedChunk(rows, label, nums, nvalid, cats, cvalid, records=n, native=True)


def _polars(
    chunk: memoryview | bytes, path: Path, fmt: CriteoFormat, offset: int, on_bad_row: str
) -> ParsedChunk:
    chunk = bytes(chunk)  # the slow path's own copy: polars and the messages read bytes
    error = not_utf8(chunk, path, fmt, offset)
    if error is not None:
        raise error
    return row_check(path, fmt, on_bad_row).chunk(criteo.scan_raw(chunk, fmt), offset)


def detect_format(path: str | Path, schema: Any, layout: str = "auto") -> Any:
    """The format of a raw file, the one detection ``prepare`` and ``predict`` ask: the
    :class:`~ctrcal.preparation.schema_reader.SchemaFormat` of ``schema`` (a
    :class:`~ctrcal.data.schema.DatasetSchema`), or with None its Criteo layout
    (:func:`ctrcal.preparation.criteo.detect_format`; ``layout``: ``data.layout``).

    Raises:
        DataError: a file that matches neither.
    """
    if schema is None:
        return criteo.detect_format(path, layout)
    from ctrcal.preparation import schema_reader

    return schema_reader.detect(path, schema)


def row_check(path: Path, fmt: Any, on_bad_row: str) -> RowCheck:
    """What every row of a file of ``fmt`` is checked against (the one row validator's
    :class:`~ctrcal.preparation.row_check.RowCheck`): Criteo's columns, or a schema's
    (:func:`ctrcal.preparation.schema_reader.row_check`). Serving's raw-row encoder checks its rows
    with it too.

    Criteo's columns: the label (if the layout has one), integer fields (Criteo_x1: any
    number) and hex hashes (Criteo_x1: decimal ids); machine-written, so a blank makes a
    number malformed."""
    from ctrcal.preparation import schema_reader

    if isinstance(fmt, schema_reader.SchemaFormat):
        return schema_reader.row_check(path, fmt, on_bad_row)
    x1 = fmt.layout == "x1"
    label = (Column(LABEL, "label"),) if fmt.labelled else ()
    numeric = tuple(Column(n, "number" if x1 else "integer") for n in NUMERIC_COLUMNS)
    categorical = tuple(Column(n, "decimal" if x1 else "hex") for n in CATEGORICAL_COLUMNS)
    return RowCheck(
        path,
        fmt.layout,
        (*label, *numeric, *categorical),
        on_bad_row,
        fields=len(fmt.columns),
        header_lines=fmt.header_lines,
        blanks=False,
    )


__all__ = ["CHUNK_BYTES", "ON_BAD_ROW", "check_on_bad_row", "iter_chunks", "row_check", "threads"]


def check_on_bad_row(on_bad_row: str) -> str:
    """``on_bad_row`` if it is one of :data:`ON_BAD_ROW` (the rule's one statement).

    Raises:
        DataError: ``on_bad_row must be 'error' or 'skip', got ...``.
    """
    if on_bad_row not in ON_BAD_ROW:
        choices = " or ".join(repr(c) for c in ON_BAD_ROW)
        raise DataError(f"on_bad_row must be {choices}, got {on_bad_row!r}")
    return on_bad_row
