"""What a parser gives: the typed columns of one chunk (:class:`ParsedChunk`), and the one
UTF-8 check of the text parsers. A leaf, so that the parsers (:mod:`ctrcal.preparation.parse`, the C
and polars route for Criteo, and :mod:`ctrcal.preparation.schema_reader`) and the row validator
(:mod:`ctrcal.preparation.row_check`) import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError

__all__ = ["ParsedChunk", "TextLayout", "file_not_utf8", "not_utf8"]


@dataclass
class ParsedChunk:
    """The good rows of one chunk (valid until the next chunk of its file is asked for: the
    C reader's arrays are reused).

    Attributes:
        rows: [N] int64 record index of each row in its file (0-based, header excluded).
        label: [N] float64 click (0/1), NaN where the file has no labels.
        numeric: [Fn, N] float64 ``I1..I13``; numeric_valid: [Fn, N] uint8, 0 = missing.
        categorical: [Fc, N] ``C1..C26`` values: uint32 where every field is hex or decimal ids
            (Criteo's), else uint64 (string keys); categorical_valid: [Fc, N] uint8.
        time: [N] int64 the time column's value (schemas with a time column), else None.
        records: records read in the chunk (good and malformed).
        bad: malformed records skipped.
        native: parsed by the C reader.
    """

    rows: np.ndarray
    label: np.ndarray
    numeric: np.ndarray
    numeric_valid: np.ndarray
    categorical: np.ndarray
    categorical_valid: np.ndarray
    records: int
    bad: int = 0
    native: bool = False
    time: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class TextLayout:
    """What :func:`not_utf8` needs to know of a text file (a Criteo or schema format has the
    same attributes): its field separator, its columns in order, its lines before the data."""

    separator: str
    columns: tuple[str, ...]
    header_lines: int


def not_utf8(chunk: bytes, path: Path, fmt: Any, offset: int) -> DataError | None:
    """A DataError naming the first line of ``chunk`` that is not UTF-8 text, if one is not,
    and the column it is in (``fmt``: a :class:`TextLayout`; ``offset``: records before the
    chunk)."""
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = offset + chunk.count(b"\n", 0, exc.start) + 1 + fmt.header_lines
        start = chunk.rfind(b"\n", 0, exc.start) + 1
        return DataError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{chunk[exc.start]:02x} at "
            f"character {exc.start - start + 1}{_column(chunk[start : exc.start], fmt)}); "
            "save the file as UTF-8"
        )
    return None


def file_not_utf8(path: Path, fmt: Any) -> DataError | None:
    """:func:`not_utf8` over a whole (possibly gzipped) file: where a reader that takes the
    file at once failed, the line and column it failed on."""
    from ctrcal.preparation.chunks import iter_text_chunks

    offset = 0
    for view in iter_text_chunks(path, 1 << 24):
        chunk = bytes(view)
        error = not_utf8(chunk, path, TextLayout(fmt.separator, tuple(fmt.columns), 0), offset)
        if error is not None:
            return error
        offset += chunk.count(b"\n")
    return None


def _column(prefix: bytes, fmt: Any) -> str:
    """``, column 'name'`` of the field a line's ``prefix`` ends in (separators inside double
    quotes do not count), or '' when the layout does not say."""
    columns, sep = getattr(fmt, "columns", None), getattr(fmt, "separator", None)
    if not columns or not sep:
        return ""
    field, quoted = 0, False
    for ch in prefix.decode("utf-8", errors="replace"):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            field += 1
    return f", column {columns[field]!r}" if field < len(columns) else f", field {field + 1}"
