"""A predictions file from any system: read, check and encode its columns for the metrics.

Parquet or CSV (``.csv``, ``.tsv``, ``.txt``, optionally gzipped) with one row per impression:
a probability column, a label column, and optionally segment columns, a time column, a second
model's probabilities (``compare``) and a predictive standard deviation (``std``).

Every check names the file, the column and the first offending row (1-based among the data
rows; a CSV's line is one more, for its header): a probability outside [0, 1] or missing, a
label other than 0/1, a missing column, columns of different lengths (arrays given directly),
a time that is not a number or a date. Segment columns become integer codes: categories as
they are (a missing value is one more category), floating-point columns with many values are
bucketised into equal-mass buckets, as the report bucketises numeric fields.

A CSV is read by pyarrow the way pandas' ``read_csv`` reads it (pandas is not imported: it
costs more than reading a small file): blank lines are skipped, pandas' missing-value tokens
(``NA``, ``null``, an empty field, ...) are missing values, a column's type is that of all its
values (integers, numbers, ``True``/``False``, or else text; dates stay text), empty
header fields are named ``Unnamed: i`` and repeated names ``name.1``, ``name.2``. A row with
more or fewer fields than the header is refused, naming its line; so is a line longer than
:data:`MAX_CSV_BLOCK` (a longer line than pyarrow's block is read with larger blocks). A time
column of text holds
numbers or ISO 8601 dates and times (``2024-01-31``, ``2024-01-31T10:00:00+01:00``); a date in
another layout is refused rather than guessed (``01/02/2024`` is a day in January or in
February depending on who wrote it).
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError

__all__ = ["Predictions", "column_names", "read_predictions"]

NUMERIC_BUCKETS = 10
_CSV_SUFFIXES = (".csv", ".tsv", ".txt")


@dataclass(frozen=True)
class Predictions:
    """Checked columns of a predictions file, row-aligned.

    Attributes:
        source: where they came from (for messages).
        prob: [n] float64 probabilities of the model (column ``names["prob"]``).
        label: [n] float64 labels, 0/1 (None: read without labels, for label-free estimates).
        compare: [n] a second model's probabilities, or None.
        std: [n] predictive standard deviations, or None.
        time: [n] int64 or float64 times, or None.
        segments: segment name -> [n] int32 codes.
        segment_values: segment name -> the value of each code, as text (a bucket of a
            floating-point column is its range).
        names: role (``prob``, ``label``, ``compare``, ``std``, ``time``) -> column name.
        features: the model's input columns (name -> [n] values as read), read with
            ``features=True``: every column of the file that has no role.
    """

    source: str
    prob: np.ndarray
    label: np.ndarray | None
    compare: np.ndarray | None = None
    std: np.ndarray | None = None
    time: np.ndarray | None = None
    segments: dict[str, np.ndarray] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    segment_values: dict[str, list[str]] = field(default_factory=dict)
    features: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.prob.shape[0])

    @classmethod
    def from_columns(
        cls,
        columns: Mapping[str, Any],
        prob: str,
        label: str | None,
        *,
        segments: Sequence[str] = (),
        time: str | None = None,
        compare: str | None = None,
        std: str | None = None,
        source: str = "predictions",
        line_offset: int | None = None,
    ) -> Predictions:
        """Check and encode columns (name -> [n] values); DataError naming column and row.

        ``line_offset``: for a text file, the line of data row 1 (its header's line + 1), so
        messages also give the line.
        """
        roles = {"prob": prob, "label": label, "compare": compare, "std": std, "time": time}
        wanted = [c for c in roles.values() if c is not None] + list(segments)
        missing = [c for c in dict.fromkeys(wanted) if c not in columns]
        if missing:
            role = next((k for k, v in roles.items() if v == missing[0]), "segments")
            raise DataError(
                f"{source}: no column {missing[0]!r} (--{role}); columns: "
                f"{', '.join(map(str, columns))}"
            )
        arrays = {c: np.asarray(columns[c]) for c in dict.fromkeys(wanted)}
        n = arrays[prob].shape[0]
        for c, a in arrays.items():
            if a.shape[0] != n:
                raise DataError(
                    f"{source}: column {c!r} has {a.shape[0]} rows, column {prob!r} has {n}"
                )
        if n == 0:
            raise DataError(f"{source}: no rows")

        def where(c: str, i: int) -> str:
            line = "" if line_offset is None else f" (line {i + line_offset})"
            return f"{source}: column {c!r}, row {i + 1}{line}"

        p = _probabilities(arrays[prob], prob, where)
        y = _labels(arrays[label], label, where) if label is not None else None
        other = _probabilities(arrays[compare], compare, where) if compare else None
        sd = _std(arrays[std], std, where) if std else None
        t = _times(arrays[time], time, where) if time else None
        coded = {c: _codes(arrays[c], c, source) for c in segments}
        names = {k: v for k, v in roles.items() if v is not None}
        return cls(
            source,
            p,
            y,
            other,
            sd,
            t,
            {c: v[0] for c, v in coded.items()},
            names,
            {c: v[1] for c, v in coded.items()},
        )


def _numbers(a: np.ndarray, c: str, where) -> np.ndarray:
    if a.dtype.kind in "biuf":
        return a.astype(np.float64)
    out = np.empty(a.shape[0], dtype=np.float64)
    for i, v in enumerate(a):  # a text column: find the first value that is not a number
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise DataError(f"{where(c, i)}: {_show(v)} is not a number") from None
    return out


def _show(v: Any) -> str:
    """A value as the user wrote it (``1.3``, ``'yes'``), not as numpy prints it."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _probabilities(a: np.ndarray, c: str, where) -> np.ndarray:
    p = _numbers(a, c, where)
    bad = ~np.isfinite(p)
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where(c, i)}: missing or non-finite probability ({_show(p[i])})")
    bad = (p < 0.0) | (p > 1.0)
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where(c, i)}: {_show(p[i])} is not a probability in [0, 1]")
    return p


def _labels(a: np.ndarray, c: str, where) -> np.ndarray:
    y = _numbers(a, c, where)
    bad = ~((y == 0.0) | (y == 1.0))
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where(c, i)}: {_show(a[i])} is not a label 0 or 1")
    return y


def _std(a: np.ndarray, c: str, where) -> np.ndarray:
    s = _numbers(a, c, where)
    bad = ~np.isfinite(s) | (s < 0.0)
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where(c, i)}: {_show(s[i])} is not a standard deviation >= 0")
    return s


def _times(a: np.ndarray, c: str, where) -> np.ndarray:
    if a.dtype.kind == "M":
        t = a.astype("datetime64[ns]")
        bad = np.isnat(t)
        if bad.any():
            raise DataError(f"{where(c, _first(bad))}: missing time")
        return t.astype(np.int64)
    if a.dtype.kind in "biuf":
        t = a.astype(np.float64)
        bad = ~np.isfinite(t)
        if bad.any():
            raise DataError(f"{where(c, _first(bad))}: missing or non-finite time")
        return t
    # text: numbers if most values are numbers (a text value among them is the bad row), else
    # ISO 8601 dates
    t = _text_numbers(a)
    if 2 * int(np.count_nonzero(~np.isnan(t))) >= len(a):
        bad = ~np.isfinite(t)
        if bad.any():
            i = _first(bad)
            raise DataError(f"{where(c, i)}: {_show(a[i])} is neither a number nor a date")
        return t
    parsed = _iso_dates(a)
    if isinstance(parsed, int):
        raise DataError(f"{where(c, parsed)}: {_show(a[parsed])} is neither a number nor a date")
    return parsed.astype(np.int64)


def _text_numbers(a: np.ndarray) -> np.ndarray:
    """[n] float64: each value of a text column as a number, NaN where it is none (surrounding
    spaces allowed; ``1e3``, ``inf`` and ``nan`` are numbers, ``1_000`` is not)."""
    import polars as pl

    text = [_number_text(v) for v in a.tolist()]
    numbers = pl.Series(text, dtype=pl.String).cast(pl.Float64, strict=False)
    return numbers.fill_null(float("nan")).to_numpy()


def _number_text(v: Any) -> str | None:
    """A value of a text column as the text of a number (None: missing, or no number)."""
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)):
        return repr(float(v))
    return None


def _iso_dates(a: np.ndarray) -> np.ndarray | int:
    """[n] datetime64[ns] of ISO 8601 texts (an offset or ``Z`` converted to UTC), or the
    index of the first value that is none (missing included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's note that offsets are deprecated: UTC is meant
        try:
            t = a.astype("datetime64[ns]")  # all at once; one value at a time finds the bad one
        except (ValueError, TypeError, OverflowError):
            t = None
        if t is None:
            values = []
            for i, v in enumerate(a.tolist()):
                try:
                    d = np.datetime64(v, "ns")
                except (ValueError, TypeError, OverflowError):
                    return i
                if np.isnat(d):  # missing
                    return i
                values.append(d)
            t = np.array(values, dtype="datetime64[ns]")
    bad = np.isnat(t)
    return _first(bad) if bad.any() else t


def _codes(a: np.ndarray, c: str, source: str) -> tuple[np.ndarray, list[str]]:
    """Codes of a segment column and the value of each code; DataError above the cap."""
    from ctrcal.metrics import MAX_SEGMENT_VALUES, bucketize

    if a.dtype.kind == "f" and np.unique(a[np.isfinite(a)]).size > 2 * NUMERIC_BUCKETS:
        codes = bucketize(a, NUMERIC_BUCKETS).astype(np.int32)
        values = []
        for k in range(int(codes.max()) + 1):
            sel = a[(codes == k) & np.isfinite(a)]
            values.append(f"[{sel.min():.4g}, {sel.max():.4g}]" if sel.size else "missing")
        return codes, values
    codes, uniques = _factorize(a)
    if len(uniques) > MAX_SEGMENT_VALUES:
        raise DataError(
            f"{source}: segment column {c!r} has {len(uniques):,} distinct values, more than "
            f"the {MAX_SEGMENT_VALUES:,} a segment may have (an identifier, not a segment)"
        )
    return codes.astype(np.int32), [_value_name(v) for v in uniques]


def _factorize(a: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """[n] codes numbering the distinct values of ``a`` in order of first appearance, and
    those values; every missing value (None, NaN) is one value, NaN."""
    if a.dtype.kind == "O":
        values = a.tolist()
        nan = float("nan")
        values = [nan if v is None or (isinstance(v, float) and v != v) else v for v in values]
        index: dict[Any, int] = {}
        for v in values:
            index.setdefault(v, len(index))  # NaN is one object here: one key
        codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
        return codes, list(index)
    uniques, first, inverse = np.unique(a, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank[inverse.reshape(-1)], [a[i] for i in first[order]]


def _value_name(v: Any) -> str:
    """A segment value as text: a number as Python prints it, a time as ``2024-01-31
    10:00:00`` (with the fraction of a second where there is one)."""
    if isinstance(v, np.datetime64) and not np.isnat(v):
        ns = int(v.astype("datetime64[ns]").astype(np.int64))
        unit = "s" if ns % 10**9 == 0 else "us" if ns % 1000 == 0 else "ns"
        return str(np.datetime_as_string(v, unit=unit)).replace("T", " ")
    return str(v)


def _csv_separator(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    return "\t" if name.endswith((".tsv", ".txt")) else ","


def _not_utf8(path: Path) -> DataError:
    """The line and column of a CSV's first byte that is not UTF-8 text."""
    from ctrcal.preparation.parsed import TextLayout, file_not_utf8

    sep = _csv_separator(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        header = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    columns = tuple(c.strip().strip('"') for c in header.split(sep))
    error = file_not_utf8(path, TextLayout(sep, columns, 1))
    return error or DataError(f"{path}: not UTF-8 text; save the file as UTF-8")


# pandas' read_csv's missing-value tokens: what a file written by pandas, R or a spreadsheet
# means by "missing"
_NA_TOKENS = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)
_TRUE, _FALSE = ("True", "TRUE", "true"), ("False", "FALSE", "false")
_FIELDS = re.compile(r"Expected \d+ columns, got \d+")
# pyarrow reads a CSV in blocks (1 MiB by default) and refuses a line longer than a block; a
# longer line is read again with blocks that hold it, up to this size (memory per thread)
MAX_CSV_BLOCK = 256 << 20


def _column_names(names: Sequence[str]) -> list[str]:
    """A header's names as pandas gives them: an empty one ``Unnamed: i``, a repeated one
    ``name.1``, ``name.2``."""
    out = [name if name else f"Unnamed: {i}" for i, name in enumerate(names)]
    counts: dict[str, int] = {}
    for i, name in enumerate(out):
        count = counts.get(name, 0)
        while count > 0:
            counts[name] = count + 1
            name = f"{name}.{count}"
            count = counts.get(name, 0)
        out[i] = name
        counts[name] = count + 1
    return out


def _ragged_line(path: Path, sep: str) -> tuple[int, int, int] | None:
    """(line, fields, the header's fields) of the first row whose field count is not the
    header's (blank lines skipped), or None."""
    import csv

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh, delimiter=sep)
        header = None
        try:
            for row in reader:
                if not row:
                    continue
                if header is None:
                    header = len(row)
                elif len(row) != header:
                    return reader.line_num, len(row), header
        except csv.Error:
            return None
    return None


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """Every column of a CSV file (name -> [n] values), read as pandas reads it (module
    docstring). DataError for an unreadable file."""
    import pyarrow as pa

    # pyarrow infers a column's type from all its values, as pandas does (a text value on the
    # last row makes the column text), but reads dates as dates: those are read again as text
    table = _arrow_csv(path, {})
    dates = [f.name for f in table.schema if pa.types.is_temporal(f.type)]
    if dates:
        table = _arrow_csv(path, dict.fromkeys(dates, pa.string()))
    if any(pa.types.is_binary(f.type) for f in table.schema):
        raise _not_utf8(path)
    columns = _numpy_columns(table, _column_names(table.column_names))
    for values in columns.values():
        if values.dtype.kind == "O":  # text (or True/False) with missing values: NaN, not None
            values[np.equal(values, None)] = np.nan
    return columns


def _numpy_columns(table: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The columns of a pyarrow table as numpy arrays under ``names``: missing values NaN in
    numbers (integers become floats), None in text; a column without any value is NaN.

    Converted by polars: pyarrow's own conversion imports pandas, which takes longer than
    reading a small file.
    """
    import polars as pl
    import pyarrow as pa

    out = {}
    for name, column in zip(names, table.columns, strict=True):
        if pa.types.is_null(column.type):
            out[name] = np.full(len(column), np.nan)
        else:
            out[name] = pl.from_arrow(column).to_numpy()
    return out


def _longest_line(path: Path) -> tuple[int, int]:
    """(1-based line number, bytes) of the file's longest line (its newline not counted)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    best_line, best_len = 1, 0
    line, length = 1, 0  # the line being read and its bytes so far
    with opener(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            if ends.size:
                sizes = np.diff(ends, prepend=-1) - 1
                sizes[0] += length
                i = int(np.argmax(sizes))
                if sizes[i] > best_len:
                    best_line, best_len = line + i, int(sizes[i])
                line += int(ends.size)
                length = len(chunk) - int(ends[-1]) - 1
            else:
                length += len(chunk)
    if length > best_len:
        best_line, best_len = line, length
    return best_line, best_len


def _block_size(path: Path) -> int:
    """A pyarrow block that holds the file's longest line; DataError naming the line when
    that exceeds :data:`MAX_CSV_BLOCK`."""
    line, size = _longest_line(path)
    block = 1 << 20
    while block <= size:
        block *= 2
    if block > MAX_CSV_BLOCK:
        raise DataError(
            f"{path}: line {line} is {size / 2**20:.1f} MiB long, more than the "
            f"{MAX_CSV_BLOCK >> 20} MiB a CSV line may have; check that line (a missing line "
            "break?), or write the predictions as parquet"
        )
    return block


def _arrow_csv(path: Path, types: dict[str, Any], block_size: int | None = None) -> Any:
    """The CSV file as a pyarrow table (``types``: column name -> type, instead of inferred).

    Raises:
        DataError: a row with more or fewer fields than the header (naming its line), text
            that is not UTF-8, or anything else pyarrow cannot read.
    """
    import pyarrow as pa
    import pyarrow.csv as pcsv

    sep = _csv_separator(path)
    options = pcsv.ConvertOptions(
        column_types=types,
        null_values=list(_NA_TOKENS),
        true_values=list(_TRUE),
        false_values=list(_FALSE),
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
    )
    compression = "gzip" if path.name.lower().endswith(".gz") else None
    read = pcsv.ReadOptions(block_size=block_size) if block_size else None
    try:
        with pa.input_stream(path, compression=compression) as stream:
            return pcsv.read_csv(
                stream,
                read_options=read,
                parse_options=pcsv.ParseOptions(delimiter=sep),
                convert_options=options,
            )
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except pa.ArrowInvalid as exc:
        text = str(exc)
        if "straddle" in text and block_size is None:
            return _arrow_csv(path, types, _block_size(path))
        if "Empty CSV file" in text:
            text = "No columns to parse from file"  # pandas' words, which users know
        elif _FIELDS.search(text):
            ragged = _ragged_line(path, sep)
            if ragged is not None:
                line, got, expected = ragged
                raise DataError(
                    f"{path}: line {line} has {got} fields, the header {expected}"
                ) from None
        raise DataError(f"{path}: not a readable CSV file ({text})") from None


def column_names(path: str | Path) -> list[str]:
    """The column names of a parquet or CSV predictions file (a CSV's header as pandas names
    its columns), without reading its rows."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure is an unreadable file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    import csv

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
        header = next(csv.reader(fh, delimiter=_csv_separator(path)), [])
    return _column_names(header)


def read_predictions(
    path: str | Path,
    prob: str,
    label: str | None,
    *,
    segments: Sequence[str] = (),
    time: str | None = None,
    compare: str | None = None,
    std: str | None = None,
    features: bool = False,
) -> Predictions:
    """Read and check the named columns of a parquet or CSV predictions file (with
    ``features``, every other column too, as :attr:`Predictions.features`).

    Raises:
        DataError: an unreadable file, a missing column or a bad value (naming the column
            and the row).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    wanted = list(dict.fromkeys(c for c in (prob, label, compare, std, time, *segments) if c))
    name = path.name.lower().removesuffix(".gz")
    line_offset = None
    if name.endswith(".parquet") or name.endswith(".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            have = pq.read_schema(path).names
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure is an unreadable file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from None
        # one file, read as one (pq.read_table goes through pyarrow's datasets, which import
        # pandas), mapped instead of copied into read buffers, and decoded into the system
        # allocator's memory, as numpy's own arrays are: arrow's default pool (mimalloc) asks
        # for huge pages, whose first touch the kernel may stall on (compaction, 2 MB zeroed
        # at a time): 1 s of system time per 330 MB of columns against 0.2 s measured (a
        # reference and its analysis with 39 feature columns of 1M rows each)
        default = pa.default_memory_pool()
        pa.set_memory_pool(pa.system_memory_pool())
        try:
            with pq.ParquetFile(path, memory_map=True) as parquet:
                table = parquet.read(columns=None if features else [c for c in wanted if c in have])
        finally:
            pa.set_memory_pool(default)
        frame = _numpy_columns(table, table.column_names)
        columns: Mapping[str, Any] = {c: frame.get(c) for c in have}
    elif name.endswith(_CSV_SUFFIXES):
        columns = _read_csv(path)
        line_offset = 2
    else:
        raise DataError(f"{path}: expected a .parquet or .csv/.tsv file (optionally .gz)")
    preds = Predictions.from_columns(
        columns,
        prob,
        label,
        segments=segments,
        time=time,
        compare=compare,
        std=std,
        source=str(path),
        line_offset=line_offset,
    )
    if not features:
        return preds
    rest = {str(c): np.asarray(v) for c, v in columns.items() if c not in wanted}
    return dataclasses.replace(preds, features=rest)
