"""Files described by a :class:`~ctrcal.data.schema.DatasetSchema` -> checked chunks.

:func:`detect` checks a file against its schema (every column the schema names is in the header
or the parquet file; a headerless file has the schema's number of fields) and
:func:`iter_chunks` parses it chunk by chunk into the
:class:`~ctrcal.preparation.parsed.ParsedChunk` the pipeline codes: text (CSV/TSV, plain or
gzip) with polars' text parser, a chunk of whole lines at a time; parquet by record batches,
its typed columns read as they are (no text round trip). This module only describes the
schema's columns: every row is typed and checked by the one row validator
(:mod:`ctrcal.preparation.row_check`) -- the label 0/1, numerics finite numbers, hex
categoricals hex, the time an integer -- and the first malformed row is named by file, line
(parquet: row) and column, or malformed rows are skipped and counted.

Categorical values become 64-bit keys: ``hex`` spellings their value read base 16, ``string``
spellings a 64-bit hash of the text (of the decimal text for an integer parquet column, so a
CSV and a parquet file of the same data agree).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ctrcal.core.errors import DataError
from ctrcal.data.schema import DatasetSchema
from ctrcal.preparation.chunks import BOM, is_gzip, iter_text_chunks
from ctrcal.preparation.parsed import ParsedChunk, file_not_utf8, not_utf8
from ctrcal.preparation.row_check import EXTRA, Column, RowCheck


@dataclass(frozen=True)
class SchemaFormat:
    """How one file of a schema is laid out (the counterpart of
    :class:`~ctrcal.preparation.criteo.CriteoFormat` for schema'd data)."""

    schema: DatasetSchema
    parquet: bool
    columns: tuple[str, ...]  # the file's columns in order
    labelled: bool

    @property
    def layout(self) -> str:
        return f"{self.schema.name}{' parquet' if self.parquet else ''}"

    @property
    def header_lines(self) -> int:
        return int(self.schema.header and not self.parquet)

    @property
    def separator(self) -> str:
        return self.schema.delimiter


def _first_line(path: Path) -> str:
    import gzip

    opener = gzip.open if is_gzip(path) else open
    try:
        with opener(path, "rb") as fh:
            line = fh.readline(1 << 20)
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not line.strip():
        raise DataError(f"{path}: empty file")
    return line.removeprefix(BOM).decode("utf-8", errors="replace").rstrip("\r\n")


def detect(path: str | Path, schema: DatasetSchema) -> SchemaFormat:
    """Check ``path`` against ``schema``; DataError naming the column (and line) if it does
    not match."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    with open(path, "rb") as fh:
        parquet = fh.read(4) == b"PAR1"
    if parquet:
        import pyarrow.parquet as pq

        try:
            meta = pq.read_metadata(path)
            columns = tuple(meta.schema.to_arrow_schema().names)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise DataError(f"{path}: unreadable parquet: {exc}") from None
        if meta.num_rows == 0:
            raise DataError(f"{path}: empty file (a parquet file of 0 rows)")
        where = f"{path}"
    elif schema.header:
        columns = tuple(c.strip().strip('"') for c in _first_line(path).split(schema.delimiter))
        where = f"{path}: line 1 (header)"
    else:
        width = len(_first_line(path).split(schema.delimiter))
        if width != len(schema.columns):
            shown = ", ".join(schema.columns[:6])
            raise DataError(
                f"{path}: line 1: {width} fields separated by "
                f"{schema.delimiter!r}; schema {schema.name!r} expects "
                f"{len(schema.columns)} ({shown}, ...)"
            )
        columns = schema.columns
        where = str(path)
    for name in schema.needed:
        if name not in columns and name != schema.label:
            shown = ", ".join(columns[:8]) + (", ..." if len(columns) > 8 else "")
            raise DataError(
                f"{where}: no column {name!r}, which schema {schema.name!r} names (found {shown})"
            )
    if len(set(columns)) != len(columns):
        raise DataError(f"{where}: duplicate column names")
    return SchemaFormat(schema, parquet, columns, schema.label in columns)


def row_check(path: Path, fmt: SchemaFormat, on_bad_row: str) -> RowCheck:
    """The schema's columns for the row validator: its label (if the file has one), numerics
    (any finite number), categoricals as the schema spells them, and its time; a text row
    must not have more fields than the file's header (or the schema's columns)."""
    s = fmt.schema
    label = (Column(s.label, "label"),) if fmt.labelled else ()
    numeric = tuple(Column(n, "number") for n in s.numeric)
    categorical = tuple(Column(n, s.categorical_spelling) for n in s.categorical)
    time = (Column(s.time, "time", s.time_feature),) if s.time is not None else ()
    return RowCheck(
        path,
        fmt.layout,
        (*label, *numeric, *categorical, *time),
        on_bad_row,
        fields=None if fmt.parquet else len(fmt.columns),
        header_lines=fmt.header_lines,
        unit="row" if fmt.parquet else "line",
    )


def iter_chunks(
    path: Path, fmt: SchemaFormat, on_bad_row: str, chunk_bytes: int
) -> Iterator[ParsedChunk]:
    """The file's rows chunk by chunk (see the module docstring)."""
    if fmt.parquet:
        yield from _parquet_chunks(path, fmt, on_bad_row, chunk_bytes)
        return

    check = row_check(path, fmt, on_bad_row)
    schema = {c: pl.Utf8 for c in fmt.columns}
    schema[EXTRA] = pl.Utf8
    needed = [*fmt.schema.needed_in(fmt.columns), EXTRA]
    offset = 0
    for view in iter_text_chunks(path, chunk_bytes, fmt.header_lines):
        chunk = bytes(view)
        error = not_utf8(chunk, path, fmt, offset)
        if error is not None:
            raise error
        raw = pl.scan_csv(
            chunk,
            has_header=False,
            separator=fmt.separator,
            quote_char='"',
            schema=schema,
            missing_columns="insert",
            truncate_ragged_lines=True,
            raise_if_empty=False,
        ).select(needed)
        parsed = check.chunk(raw, offset)
        offset += parsed.records
        yield parsed


def _parquet_chunks(
    path: Path, fmt: SchemaFormat, on_bad_row: str, chunk_bytes: int
) -> Iterator[ParsedChunk]:
    import pyarrow.parquet as pq

    needed = list(fmt.schema.needed_in(fmt.columns))
    try:
        pf = pq.ParquetFile(path)
        # about chunk_bytes of text's worth of rows per batch (~250 bytes a row)
        batches = pf.iter_batches(batch_size=max(1, chunk_bytes // 250), columns=needed)
        check = row_check(path, fmt, on_bad_row)
        offset = 0
        for batch in batches:
            parsed = check.chunk(pl.from_arrow(batch), offset)
            offset += parsed.records
            yield parsed
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
        raise DataError(f"{path}: unreadable parquet: {exc}") from None


def time_counts(path: Path, fmt: SchemaFormat) -> pl.DataFrame:
    """``time``, ``count`` of a file's time column (for time-ordered splits); rows whose time
    is not an integer are left out (they are malformed rows)."""
    name = fmt.schema.time
    try:
        if fmt.parquet:
            col = pl.read_parquet(path, columns=[name])[name]
        elif fmt.schema.header:
            col = pl.read_csv(
                path,
                separator=fmt.separator,
                columns=[name],
                quote_char='"',
                schema_overrides={name: pl.Utf8},
                truncate_ragged_lines=True,
            )[name]
        else:
            col = pl.read_csv(
                path,
                separator=fmt.separator,
                has_header=False,
                quote_char='"',
                columns=[fmt.columns.index(name)],
                new_columns=[name],
                infer_schema=False,
                truncate_ragged_lines=True,
            )[name]
    except (pl.exceptions.PolarsError, OSError) as exc:
        # the whole file is read at once here: a byte that is not UTF-8 may be in any column
        # and line, and is named by them
        where = None if fmt.parquet else file_not_utf8(path, fmt)
        if where is not None:
            raise where from None
        raise DataError(
            f"{path}: cannot read the time column {name!r}: {str(exc).splitlines()[0]}"
        ) from None
    if col.dtype == pl.Utf8:
        col = col.str.strip_chars()
    col = col.cast(pl.Int64, strict=False).drop_nulls()
    return col.value_counts(name="count").rename({name: "time"})


__all__ = ["SchemaFormat", "detect", "iter_chunks", "row_check", "time_counts"]
