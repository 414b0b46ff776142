"""The one row validator: one chunk's raw columns -> typed, checked columns (a ParsedChunk).

Every row that the C reader does not take is typed and checked here: Criteo's text layouts
(the chunks that :mod:`ctrcal.preparation.parse` hands to polars) and schema'd files
(:mod:`ctrcal.preparation.schema_reader`: CSV/TSV and parquet). A reader describes its columns -- a
short list of :class:`Column` -- and hands :meth:`RowCheck.chunk` a frame of one chunk's raw
columns; each column is typed by its kind, every row is checked, and either the first
malformed row is named in one line or the malformed rows are dropped and counted.

=========  =============================================  =====================================
kind       a good value (missing is fine unless said)      typed as; a bad value's message
=========  =============================================  =====================================
label      0 or 1 in any number spelling; missing is bad   float64; ``y is not 0 or 1``
integer    a whole number, ``260`` or ``260.0``            float64; ``I5 is not an integer``
           (Criteo's text layouts)
number     any finite number (Criteo_x1, schema'd data)    float64; ``a is not a number``
hex        at most 8 hex digits (a parquet integer         uint32 (read base 16);
           column: its value below 2^32)                   ``C7 is not a hex value of at most
                                                           8 digits``
decimal    a decimal id below 2^32 (Criteo_x1)             uint32; ``C7 is not a decimal id``
string     any text (a parquet column: its text form)      uint64, its key (XXH64 of the text:
                                                           :func:`~.coder.string_keys`); never bad
time       an integer; missing is bad                      int64; ``ts is not an integer time``
=========  =============================================  =====================================

A text row with more fields than its layout's (the reader puts what follows the last field in
the :data:`EXTRA` column) is malformed as well: ``more fields than the dac layout's 40``. A
label may carry surrounding blanks, and so may numbers and times where :attr:`RowCheck.blanks`
says (schema'd files, often written by hand); Criteo's machine-written layouts are read as the
C reader reads them, where a blank makes a number malformed. Categorical text is taken as
written. An empty field is missing whether it is quoted (``""``) or not; a string
categorical's empty text is a value, and a field of blanks is malformed where a number or an
id is expected.

The first malformed row of a chunk stops the run with one line (parquet counts rows, not
lines)::

    FILE: line N: malformed row: COL is not ... (got 'v'); K more malformed rows in the M rows
    read so far (use on_bad_row=skip to drop them)

(a chunk is only checked when the chunks before it had no malformed row, so the K rows are all
there are in the first M).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ctrcal.core.errors import DataError
from ctrcal.preparation.coder import string_keys
from ctrcal.preparation.parsed import ParsedChunk

__all__ = ["EXTRA", "KINDS", "Column", "RowCheck"]

_LABEL = "label"
_INTEGER = "integer"
_NUMBER = "number"
_HEX = "hex"
_DECIMAL = "decimal"
_STRING = "string"
_TIME = "time"
KINDS = (_LABEL, _INTEGER, _NUMBER, _HEX, _DECIMAL, _STRING, _TIME)
"""Column kinds (see the module docstring)."""
_NUMERIC = (_INTEGER, _NUMBER)
_CATEGORICAL = (_HEX, _DECIMAL, _STRING)
_EXPECTED = {
    _LABEL: "not 0 or 1",
    _INTEGER: "not an integer",
    _NUMBER: "not a number",
    _HEX: "not a hex value of at most 8 digits",
    _DECIMAL: "not a decimal id",
    _TIME: "not an integer time",
}

EXTRA = "_extra"
"""The column a text reader fills with whatever follows a row's last field (null if nothing)."""
_ROW = "_row"  # record index in the file (0-based, header excluded)
_BAD = "_bad"


@dataclass(frozen=True)
class Column:
    """One raw column and what its values must be.

    Attributes:
        name: the column's name in the raw frame and in messages.
        kind: one of :data:`KINDS`.
        feature: ``time`` only: ``value`` or ``hour_of_day`` (its last two digits) makes the
            time the last categorical field as well; ``none`` does not.
    """

    name: str
    kind: str
    feature: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: unknown kind {self.kind!r} ({KINDS})")


@dataclass(frozen=True)
class RowCheck:
    """How the rows of one file are typed and checked (see the module docstring).

    Attributes:
        path: the file, as messages name it.
        layout: what messages call its layout (``dac``, ``avazu parquet``).
        columns: the columns read, in the order their checks run; numerics and categoricals
            come out in this order. Without a ``label`` column the labels are NaN.
        on_bad_row: ``error`` (the first malformed row stops the run) or ``skip``.
        fields: the fields a text row has; a raw frame with an :data:`EXTRA` column refuses
            the rows with more. None for parquet (no such column).
        header_lines: lines before the first record (messages count lines from the top).
        unit: ``line`` (text) or ``row`` (parquet), as messages count records.
        blanks: whether numbers and times may carry surrounding blanks.
        first_number: what messages number the first record: 1 in a file, 0 in a list of
            rows (its index).
        skip: how the caller asks to drop malformed rows, as the message's advice; None where
            it cannot.
    """

    path: Path
    layout: str
    columns: tuple[Column, ...]
    on_bad_row: str
    fields: int | None = None
    header_lines: int = 0
    unit: str = "line"
    blanks: bool = True
    first_number: int = 1
    skip: str | None = "on_bad_row=skip"

    def chunk(self, raw: pl.LazyFrame | pl.DataFrame, offset: int) -> ParsedChunk:
        """The good rows of one chunk's raw frame (``offset``: records of the file before it).

        Raises:
            DataError: polars cannot read the chunk, or with ``on_bad_row="error"`` a row is
                malformed (file, line or row, column, value).
        """
        lf = raw.lazy().with_row_index(_ROW, offset=offset)
        try:
            dtypes = lf.collect_schema()
            for c in self.columns:
                dtype = dtypes[c.name]
                if c.kind in (_HEX, _DECIMAL) and not (dtype == pl.Utf8 or dtype.is_integer()):
                    raise DataError(
                        f"{self.path}: column {c.name!r} holds {dtype} values; {c.kind} "
                        "categoricals are read from text or integers"
                    )
            values = [_value(c, dtypes[c.name], self.blanks) for c in self.columns]
            # each value typed once, in its own column, for both the output and the check
            staged = lf.with_columns(v.alias(f"__v{k}") for k, v in enumerate(values))
            checks = self._checks(dtypes)
            flags = [check for _, _, check in checks]
            df = staged.select(
                _ROW,
                *self._outputs(),
                (pl.any_horizontal(flags) if flags else pl.lit(False)).alias(_BAD),
            ).collect()
        except (pl.exceptions.PolarsError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{self.path}: cannot read as {self.layout} data: {first}") from None
        records = df.height
        bad_rows = df[_BAD]
        bad = int(bad_rows.sum())
        if bad:
            if self.on_bad_row == "error":
                row = int(df[_ROW].filter(bad_rows)[0])
                raise DataError(self._describe(staged, checks, row, bad, offset + records))
            df = df.filter(~bad_rows)
        return self._to_chunk(df, records, bad)

    def _outputs(self) -> list[pl.Expr]:
        """The typed values as the chunk hands them on: numerics and ids with 0 where missing
        and their validity ``__ok{k}`` beside them, the label with NaN; computed in the one
        query (a Series method is a query of its own, a fixed cost that would dominate a small
        chunk, such as a server's few rows)."""
        out = []
        for k, c in enumerate(self.columns):
            value = pl.col(f"__v{k}")
            if c.kind == _LABEL:
                out.append(value.fill_null(float("nan")))
            elif c.kind in (*_NUMERIC, _HEX, _DECIMAL):
                out += [value.fill_null(0), value.is_not_null().alias(f"__ok{k}")]
            elif c.kind == _STRING:  # keyed when handed on; null keys are not read
                out += [value, value.is_not_null().alias(f"__ok{k}")]
            else:
                out.append(value)
        return out

    def _checks(self, dtypes: pl.Schema) -> list[tuple[str, Column | None, pl.Expr]]:
        """Per check, in the order they name a row: what a failing value is, its column (None:
        the row's fields), and a boolean 'this row is malformed' reading the raw columns and
        the staged values ``__v{k}``."""
        checks: list[tuple[str, Column | None, pl.Expr]] = []
        if self.fields is not None and EXTRA in dtypes:
            what = f"more fields than the {self.layout} layout's {self.fields}"
            checks.append((what, None, pl.col(EXTRA).is_not_null()))
        for k, c in enumerate(self.columns):
            given = _given(pl.col(c.name), dtypes[c.name] == pl.Utf8)
            bad = _bad(c, given, pl.col(f"__v{k}"))
            if bad is not None:
                checks.append((f"{c.name} is {_EXPECTED[c.kind]}", c, bad))
        return checks

    def _describe(
        self,
        staged: pl.LazyFrame,
        checks: list[tuple[str, Column | None, pl.Expr]],
        row: int,
        bad: int,
        read: int,
    ) -> str:
        """The one line naming malformed record ``row`` (0-based) of ``staged``."""
        one = staged.filter(pl.col(_ROW) == row).select(
            pl.col([c.name for c in self.columns]),
            *(check.alias(f"__bad{k}") for k, (_, _, check) in enumerate(checks)),
        )
        first = one.collect().row(0, named=True)
        what, column, _ = next(c for k, c in enumerate(checks) if first[f"__bad{k}"])
        if column is not None:
            value = first[column.name]
            what += f" (got {value!r})" if value is not None else " (empty)"
        more = (
            f"; {bad - 1} more malformed rows in the {read:,} rows read so far" if bad > 1 else ""
        )
        advice = f" (use {self.skip} to drop them)" if self.skip else ""
        number = row + self.first_number + self.header_lines
        return f"{self.path}: {self.unit} {number}: malformed row: {what}{more}{advice}"

    def _to_chunk(self, df: pl.DataFrame, records: int, bad: int) -> ParsedChunk:
        """The typed frame's columns as the coder takes them."""
        n = df.height
        of = {c.kind: f"__v{k}" for k, c in enumerate(self.columns) if c.kind in (_LABEL, _TIME)}
        numerics = [f"__v{k}" for k, c in enumerate(self.columns) if c.kind in _NUMERIC]
        keys = [(f"__v{k}", c.kind) for k, c in enumerate(self.columns) if c.kind in _CATEGORICAL]
        time_column = next((c for c in self.columns if c.kind == _TIME), None)
        feature = time_column is not None and time_column.feature != "none"
        numeric = np.empty((len(numerics), n), dtype=np.float64)
        numeric_valid = np.empty((len(numerics), n), dtype=np.uint8)
        for j, name in enumerate(numerics):
            numeric_valid[j] = df[_ok(name)].to_numpy()
            numeric[j] = df[name].to_numpy()
        # uint32 where every key is (hex, decimal ids): what the C reader gives, a third less
        # memory than 64 bits; the coder takes either width
        narrow = not feature and all(
            c.kind in (_HEX, _DECIMAL) for c in self.columns if c.kind in _CATEGORICAL
        )
        categorical = np.empty((len(keys) + feature, n), dtype=np.uint32 if narrow else np.uint64)
        categorical_valid = np.empty((len(keys) + feature, n), dtype=np.uint8)
        for j, (name, kind) in enumerate(keys):
            categorical_valid[j] = df[_ok(name)].to_numpy()
            if kind == _STRING:
                string_keys(df[name], out=categorical[j])
            else:
                categorical[j] = df[name].to_numpy()
        time = df[of[_TIME]].to_numpy() if _TIME in of else None
        if feature:
            key = time % 100 if time_column.feature == "hour_of_day" else time
            categorical[-1] = key.astype(np.uint64)
            categorical_valid[-1] = 1
        if _LABEL in of:
            label = df[of[_LABEL]].to_numpy()
        else:
            label = np.full(n, np.nan)
        return ParsedChunk(
            df[_ROW].cast(pl.Int64).to_numpy(),
            label,
            numeric,
            numeric_valid,
            categorical,
            categorical_valid,
            records=records,
            bad=bad,
            time=time,
        )


def _ok(name: str) -> str:
    """The validity column of staged value ``__v{k}``: ``__ok{k}``."""
    return "__ok" + name.removeprefix("__v")


def _value(column: Column, dtype: pl.DataType, blanks: bool) -> pl.Expr:
    """The typed value of a raw column (null where missing or not of its kind); a string
    categorical's text, keyed when the chunk is handed on (:meth:`RowCheck._to_chunk`)."""
    col = pl.col(column.name)
    text = dtype == pl.Utf8
    kind = column.kind
    if kind in (_LABEL, _INTEGER, _NUMBER, _TIME):
        if text and (kind == _LABEL or blanks):
            col = col.str.strip_chars()
        return col.cast(pl.Int64 if kind == _TIME else pl.Float64, strict=False)
    if kind in (_HEX, _DECIMAL):
        if not text:
            return col.cast(pl.UInt32, strict=False)
        return col.str.to_integer(base=16 if kind == _HEX else 10, dtype=pl.UInt32, strict=False)
    return col if text else col.cast(pl.Utf8)


def _given(raw: pl.Expr, text: bool) -> pl.Expr:
    """'A value is given' of a raw column: not null, and for text not empty (a quoted empty
    field, ``""``, is as empty as an unquoted one; a field of blanks is given, and malformed
    where a value must be a number or an id)."""
    if not text:
        return raw.is_not_null()
    return raw.str.len_bytes().fill_null(0) > 0


def _bad(column: Column, given: pl.Expr, value: pl.Expr) -> pl.Expr | None:
    """'This value is malformed' of a column, from whether a value is given (:func:`_given`)
    and its typed value (None: never)."""
    kind = column.kind
    if kind == _LABEL:
        return ~value.is_in([0.0, 1.0]).fill_null(False)
    if kind == _TIME:
        return value.is_null()
    if kind == _INTEGER:
        # x - floor(x) is 0 for whole numbers only, NaN for NaN and +-inf (polars compares
        # NaN equal to NaN, never to 0); a value given but not read (null) fails too
        return given & ~((value - value.floor()) == 0).fill_null(False)
    if kind == _NUMBER:
        return given & ~value.is_finite().fill_null(False)
    if kind in (_HEX, _DECIMAL):
        return given & value.is_null()
    return None
