"""Files described by a :class:`~ctrcal.data.schema.DatasetSchema` -> checked chunks.

:func:`detect` checks a file against its schema (every column the schema names is in the
header or the parquet file; a headerless file has the schema's number of fields) and
:func:`iter_chunks` parses it chunk by chunk into the :class:`~ctrcal.data.parsed.ParsedChunk`
the pipeline codes: text (CSV/TSV, plain or gzip) with polars' text parser, a chunk of whole
lines at a time; parquet by record batches, its typed columns read as they are (no text round
trip). Every row is checked -- the label 0/1, numerics finite numbers, hex categoricals hex,
the time an integer -- and the first malformed row is named by file, line (parquet: row) and
column, or malformed rows are skipped and counted.

Categorical values become 64-bit keys: ``hex`` spellings their value read base 16, ``string``
spellings a 64-bit hash of the text (of the decimal text for an integer parquet column, so a
CSV and a parquet file of the same data agree).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrcal.core.errors import DataError
from ctrcal.data.chunks import BOM, is_gzip, iter_text_chunks
from ctrcal.data.parsed import ParsedChunk, file_not_utf8, not_utf8
from ctrcal.data.schema import DatasetSchema

_ROW = "__row"
_EXTRA = "__extra"
_HASH_SEED = 0x5EEDC7C1
"""The string hash's fixed seed: the same text gets the same key in every run."""


@dataclass(frozen=True)
class SchemaFormat:
    """How one file of a schema is laid out (the counterpart of
    :class:`~ctrcal.data.criteo.CriteoFormat` for schema'd data)."""

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


# ---------------------------------------------------------------------------------------------
# Typing and checking one chunk (a polars frame of the needed columns)


def _key(col: pl.Expr, spelling: str, dtype: pl.DataType) -> pl.Expr:
    """A categorical column's uint64 key (null where missing or, for hex, not hex)."""
    if spelling == "hex":
        if dtype.is_integer():
            return col.cast(pl.UInt32, strict=False).cast(pl.UInt64)
        return col.str.to_integer(base=16, dtype=pl.UInt32, strict=False).cast(pl.UInt64)
    text = col if dtype == pl.Utf8 else col.cast(pl.Utf8)
    return pl.when(text.is_not_null()).then(text.hash(_HASH_SEED))


def _typed(df: pl.DataFrame, fmt: SchemaFormat) -> tuple[pl.DataFrame, list[tuple[str, str]]]:
    """(typed frame, per checked column its name and what it should be); the frame has a
    ``__bad_k`` boolean per check."""
    s = fmt.schema
    exprs, checks = [], []

    def number(name: str) -> pl.Expr:
        col = pl.col(name)
        if df.schema[name] == pl.Utf8:
            col = col.str.strip_chars()
        return col.cast(pl.Float64, strict=False)

    if fmt.labelled:
        label = number(s.label)
        exprs.append(label.alias("label"))
        checks.append((s.label, "not 0 or 1", ~label.is_in([0.0, 1.0]).fill_null(False)))
    else:
        exprs.append(pl.lit(None, pl.Float64).alias("label"))
    for name in s.numeric:
        value = number(name)
        exprs.append(value.alias(f"n:{name}"))
        checks.append(
            (name, "not a number", pl.col(name).is_not_null() & ~value.is_finite().fill_null(False))
        )
    for name in s.categorical:
        key = _key(pl.col(name), s.categorical_spelling, df.schema[name])
        exprs.append(key.alias(f"c:{name}"))
        if s.categorical_spelling == "hex":
            checks.append(
                (
                    name,
                    "not a hex value of at most 8 digits",
                    pl.col(name).is_not_null() & key.is_null(),
                )
            )
    if s.time is not None:
        time = pl.col(s.time)
        time = (time.str.strip_chars() if df.schema[s.time] == pl.Utf8 else time).cast(
            pl.Int64, strict=False
        )
        exprs.append(time.alias("time"))
        checks.append((s.time, "not an integer time", time.is_null()))
    if _EXTRA in df.columns:
        checks.insert(0, ("", "more fields than the header", pl.col(_EXTRA).is_not_null()))
    typed = df.select(
        *exprs, pl.col(_ROW), *(c.alias(f"__bad_{k}") for k, (_, _, c) in enumerate(checks))
    )
    return typed, [(n, what) for n, what, _ in checks]


def _to_chunk(typed: pl.DataFrame, fmt: SchemaFormat, records: int, bad: int) -> ParsedChunk:
    s = fmt.schema
    n = typed.height
    numeric = np.empty((len(s.numeric), n), dtype=np.float64)
    numeric_valid = np.empty((len(s.numeric), n), dtype=np.uint8)
    for j, name in enumerate(s.numeric):
        col = typed[f"n:{name}"]
        numeric_valid[j] = col.is_not_null().to_numpy()
        numeric[j] = col.fill_null(0.0).to_numpy()
    fields = s.categorical_fields
    categorical = np.empty((len(fields), n), dtype=np.uint64)
    categorical_valid = np.empty((len(fields), n), dtype=np.uint8)
    for j, name in enumerate(s.categorical):
        col = typed[f"c:{name}"]
        categorical_valid[j] = col.is_not_null().to_numpy()
        categorical[j] = col.fill_null(0).to_numpy()
    time = typed["time"].to_numpy() if s.time is not None else None
    if s.time_field:
        key = time % 100 if s.time_feature == "hour_of_day" else time
        categorical[-1] = key.astype(np.uint64)
        categorical_valid[-1] = 1
    label = typed["label"].fill_null(float("nan")).to_numpy()
    rows = typed[_ROW].cast(pl.Int64).to_numpy()
    return ParsedChunk(
        rows,
        label,
        numeric,
        numeric_valid,
        categorical,
        categorical_valid,
        records=records,
        bad=bad,
        time=time,
    )


def _check(
    df: pl.DataFrame, fmt: SchemaFormat, path: Path, on_bad_row: str, where: str
) -> ParsedChunk:
    """Type and check a frame of one chunk's rows (``__row`` = record index in the file)."""
    typed, checks = _typed(df, fmt)
    flags = [f"__bad_{k}" for k in range(len(checks))]
    bad_rows = typed.select(pl.any_horizontal(flags) if flags else pl.lit(False)).to_series()
    bad = int(bad_rows.sum())
    if bad:
        if on_bad_row == "error":
            first = typed.filter(bad_rows).row(0, named=True)
            k = next(k for k in range(len(checks)) if first[f"__bad_{k}"])
            name, what = checks[k]
            row = int(first[_ROW])
            number = row + 1 + fmt.header_lines
            if name:
                raw = df.filter(pl.col(_ROW) == row)[name][0]
                got = f" (got {raw!r})" if raw is not None else " (empty)"
                message = f"{name} is {what}{got}"
            else:
                message = what
            more = f"; {bad - 1} more malformed rows in this chunk" if bad > 1 else ""
            raise DataError(
                f"{path}: {where} {number}: malformed row: {message}{more} "
                "(use on_bad_row=skip to drop them)"
            )
        typed = typed.filter(~bad_rows)
    return _to_chunk(typed, fmt, df.height, bad)


def iter_chunks(
    path: Path, fmt: SchemaFormat, on_bad_row: str, chunk_bytes: int
) -> Iterator[ParsedChunk]:
    """The file's rows chunk by chunk (see the module docstring)."""
    if fmt.parquet:
        yield from _parquet_chunks(path, fmt, on_bad_row, chunk_bytes)
        return

    schema = {c: pl.Utf8 for c in fmt.columns}
    schema[_EXTRA] = pl.Utf8
    offset = 0
    for view in iter_text_chunks(path, chunk_bytes, fmt.header_lines):
        chunk = bytes(view)
        error = not_utf8(chunk, path, fmt, offset)
        if error is not None:
            raise error
        try:
            df = pl.read_csv(
                chunk,
                has_header=False,
                separator=fmt.separator,
                quote_char='"',
                schema=schema,
                missing_columns="insert",
                truncate_ragged_lines=True,
                raise_if_empty=False,
            )
        except pl.exceptions.PolarsError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{path}: cannot read as {fmt.layout} data: {first}") from None
        df = df.select(*fmt.schema.needed_in(fmt.columns), _EXTRA)
        df = df.with_row_index(_ROW, offset=offset)
        parsed = _check(df, fmt, path, on_bad_row, "line")
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
        offset = 0
        for batch in batches:
            df = pl.from_arrow(batch).with_row_index(_ROW, offset=offset)
            parsed = _check(df, fmt, path, on_bad_row, "row")
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


__all__ = ["SchemaFormat", "detect", "iter_chunks", "time_counts"]
