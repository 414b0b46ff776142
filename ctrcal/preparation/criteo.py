"""Criteo layout detection and readers (-> polars LazyFrame).

The column names and counts live in :mod:`ctrcal.core.criteo_schema` (no polars needed to
name them).

Supported layouts (``layout=`` names, detected automatically by :func:`detect_format`):

==============  ================================================================================
``dac``         Kaggle Display Advertising Challenge ``train.txt`` and the Criteo 1TB ``day_N``
                files (optionally ``.gz``): tab-separated, no header, 40 fields
                ``label, I1..I13, C1..C26``. Rows shorter than 40 fields are padded with missing
                (real files strip trailing empty fields).
``dac_test``    Kaggle ``test.txt``: the same without the label (39 fields); labels are null.
``kaggle_csv``  Kaggle competition CSV with a header ``Id,Label,I1..I13,C1..C26`` (``Label``
                absent in the test CSV).
``x4``          BARS/FuxiCTR Criteo_x4 CSV: header ``Label`` (or ``label``), ``I1..``, ``C1..``
                with raw values (also the DeepCTR ``criteo_sample.txt`` layout).
``x1``          BARS Criteo_x1 CSV: the same header, numerics already scaled to [0, 1] and
                categoricals already integer ids (decimal). No log transform is applied later.
``torchrec``    A header with torchrec's names ``label, int_0..int_12, cat_0..cat_25``.
==============  ================================================================================

Files are parsed chunk by chunk by :mod:`ctrcal.preparation.parse`: the C reader, else polars on
the strings of :func:`scan_raw`, typed and checked by the one row validator
(:mod:`ctrcal.preparation.row_check`). Hex categoricals would break float parsing (``623049e6``) and
lose leading zeros (``00018438``); integers may be negative (I2) or written ``260.0``.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ctrcal.core.criteo_schema import (
    COLUMNS,
    FEATURE_COLUMNS,
    LABEL,
    LAYOUTS,
    NUM_CATEGORICAL,
    NUM_NUMERIC,
    check_layout,
)
from ctrcal.core.errors import DataError
from ctrcal.preparation.chunks import BOM
from ctrcal.preparation.row_check import EXTRA

_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 200


@dataclass(frozen=True)
class CriteoFormat:
    """How one file is laid out.

    Attributes:
        layout: one of :data:`LAYOUTS`.
        separator: field separator.
        has_header: whether the first line holds column names.
        columns: canonical name of each field in file order (``_id`` for Kaggle's Id).
        labelled: whether the file has a label column.
    """

    layout: str
    separator: str
    has_header: bool
    columns: tuple[str, ...]
    labelled: bool

    @property
    def header_lines(self) -> int:
        return 1 if self.has_header else 0


# ---------------------------------------------------------------------------------------------
# Detection


def _open_text_head(path: Path) -> str:
    """The first bytes of a (possibly gzipped) file as text; DataError if unreadable."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a Criteo file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        if magic == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                raw = fh.read(_SNIFF_BYTES)
        else:
            with open(path, "rb") as fh:
                raw = fh.read(_SNIFF_BYTES)
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt or truncated gzip file ({exc})") from None
    if not raw.strip():
        raise DataError(f"{path}: empty file, expected Criteo rows")
    if raw[:4] == b"PAR1":
        raise DataError(
            f"{path}: is a parquet file; expected raw Criteo text (TSV/CSV). A directory "
            "prepared by 'ctrcal prepare' is used directly with --data"
        )
    raw = raw.removeprefix(BOM)  # Excel and many exporters start a UTF-8 CSV with one
    if b"\0" in raw:
        raise DataError(f"{path}: binary data, expected Criteo text (TSV/CSV)")
    text = raw.decode("utf-8", errors="replace")
    if len(raw) == _SNIFF_BYTES and "\n" in text:
        text = text[: text.rindex("\n")]  # drop the cut-off last line
    return text


def _canonical(name: str) -> str | None:
    n = name.strip().strip('"').lower()
    if n == "label":
        return LABEL
    if n == "id":
        return "_id"
    m = re.fullmatch(r"([ic])(\d+)", n)
    if m and 1 <= int(m.group(2)) <= (NUM_NUMERIC if m.group(1) == "i" else NUM_CATEGORICAL):
        return m.group(1).upper() + m.group(2)
    m = re.fullmatch(r"(int|cat)_(\d+)", n)
    if m:
        k = int(m.group(2))
        if m.group(1) == "int" and k < NUM_NUMERIC:
            return f"I{k + 1}"
        if m.group(1) == "cat" and k < NUM_CATEGORICAL:
            return f"C{k + 1}"
    return None


_ATTRIBUTION = {"campaign", "conversion", "attribution", "click_pos", "cost", "cpo"}
_UPLIFT = {"treatment", "exposure", "visit", "conversion"}
_EXPECTED = (
    "expected a Criteo CTR file: dac/day_N TSV (40 tab-separated fields, no header), "
    "dac test TSV (39 fields), or a CSV with header label/Label, I1..I13, C1..C26 "
    "(Kaggle Id,Label,..., Criteo_x4, Criteo_x1) or label, int_0..int_12, cat_0..cat_25"
)


def _looks_like_header(fields: list[str]) -> bool:
    return sum(bool(re.match(r"^[A-Za-z_\"]", f.strip())) for f in fields) > len(fields) // 2


def detect_format(path: str | Path, layout: str = "auto") -> CriteoFormat:
    """Detect (or check) the layout of one raw Criteo file from its first lines.

    Args:
        path: a raw file, plain or gzipped.
        layout: ``auto`` or one of :data:`LAYOUTS` to force.

    Raises:
        DataError: unreadable, empty, or not a Criteo CTR file (names what was found).
    """
    path = Path(path)
    if layout != "auto" and layout not in LAYOUTS:
        raise DataError(f"unknown layout {layout!r} (valid: auto, {', '.join(LAYOUTS)})")
    text = _open_text_head(path)
    lines = [ln.rstrip("\r") for ln in text.split("\n")[:_SNIFF_LINES]]
    lines = [ln for ln in lines if ln]
    first = lines[0]
    sep = "\t" if "\t" in first else ("," if "," in first else None)
    if sep is None:
        raise DataError(f"{path}: found no tab or comma separator in the first line; {_EXPECTED}")
    fields = first.split(sep)
    if _looks_like_header(fields):
        names = {f.strip().strip('"').lower() for f in fields}
        if len(names & _ATTRIBUTION) >= 3:
            raise DataError(
                f"{path}: this looks like the Criteo Attribution Modeling dataset "
                f"(columns {', '.join(sorted(names & _ATTRIBUTION))}); {_EXPECTED}"
            )
        if len(names & _UPLIFT) >= 3:
            raise DataError(
                f"{path}: this looks like the Criteo Uplift Modeling dataset "
                f"(columns {', '.join(sorted(names & _UPLIFT))}); {_EXPECTED}"
            )
        canon = [_canonical(f) for f in fields]
        unknown = [f for f, c in zip(fields, canon, strict=True) if c is None]
        present = {c for c in canon if c}
        missing = [c for c in FEATURE_COLUMNS if c not in present]
        if unknown or missing or len(present) != len(canon):
            shown = ", ".join(fields[:8]) + (", ..." if len(fields) > 8 else "")
            detail = []
            if unknown:
                detail.append(f"unknown columns {unknown[:5]}")
            if missing:
                detail.append(f"missing columns {missing[:5]}")
            if len(present) != len(canon) and not unknown:
                detail.append("duplicate columns")
            raise DataError(
                f"{path}: header ({shown}) is not a Criteo CTR header: "
                f"{'; '.join(detail)}; {_EXPECTED}"
            )
        labelled = LABEL in present
        if "_id" in present:
            found = "kaggle_csv"
        elif any(f.strip().lower().startswith("int_") for f in fields):
            found = "torchrec"
        else:
            found = "x1" if _looks_like_x1(lines[1:], canon, sep) else "x4"
        fmt = CriteoFormat(found, sep, True, tuple(canon), labelled)  # type: ignore[arg-type]
    else:
        if sep != "\t":
            raise DataError(
                f"{path}: comma-separated without a header ({len(fields)} fields); {_EXPECTED}"
            )
        # Short rows are stripped ones and a few long rows are malformed ones: any full-width
        # line decides.
        widths = Counter(len(ln.split("\t")) for ln in lines)
        if widths[len(COLUMNS)]:
            fmt = CriteoFormat("dac", "\t", False, COLUMNS, True)
        elif widths[len(COLUMNS) - 1]:
            fmt = CriteoFormat("dac_test", "\t", False, FEATURE_COLUMNS, False)
        else:
            width = widths.most_common(1)[0][0]
            raise DataError(f"{path}: found {width} tab-separated fields per line; {_EXPECTED}")
    check_layout(layout, fmt.layout, str(path))
    if layout != "auto" and layout != fmt.layout:
        # read as configured: the file's own columns (a dac file's may lack the label)
        fmt = CriteoFormat(layout, fmt.separator, fmt.has_header, fmt.columns, fmt.labelled)
    return fmt


def _looks_like_x1(lines: list[str], canon: list[str | None], sep: str) -> bool:
    """Criteo_x1: numerics in [0, 1] with fractions, categoricals decimal ids."""
    c_idx = [i for i, c in enumerate(canon) if c and c.startswith("C")]
    i_idx = [i for i, c in enumerate(canon) if c and c.startswith("I")]
    any_fraction = False
    seen = False
    for line in lines:
        fields = line.split(sep)
        for i in c_idx:
            if i < len(fields) and fields[i]:
                seen = True
                if not fields[i].isdigit():
                    return False
        for i in i_idx:
            if i < len(fields) and fields[i]:
                try:
                    v = float(fields[i])
                except ValueError:
                    return False
                if not math.isfinite(v):
                    continue  # malformed in any layout: the row validator names it
                if v < 0 or v > 1:
                    return False
                any_fraction |= v != int(v)
    return seen and any_fraction


# ---------------------------------------------------------------------------------------------
# Reading


def scan_raw(chunk: bytes, fmt: CriteoFormat) -> pl.LazyFrame:
    """A chunk's fields under canonical names, as strings, plus the validator's extra column.

    ``chunk`` holds whole lines of a file past its header (see
    :func:`~ctrcal.preparation.chunks.iter_text_chunks`). Missing fields (short rows) are null; the
    :data:`~ctrcal.preparation.row_check.EXTRA` column is non-null where a row has more fields than
    the layout.
    """
    schema = {name: pl.Utf8 for name in fmt.columns}
    schema[EXTRA] = pl.Utf8
    # Header files are read positionally too (their header is not in a chunk), so that names
    # never need to match and a row with too many fields lands in the extra column.
    return pl.scan_csv(
        chunk,
        has_header=False,
        separator=fmt.separator,
        quote_char=None,
        schema=schema,
        missing_columns="insert",
        truncate_ragged_lines=True,
        raise_if_empty=False,
    )
