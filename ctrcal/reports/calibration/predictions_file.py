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
"""

from __future__ import annotations

import gzip
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError

__all__ = ["Predictions", "read_predictions"]

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
    import pandas as pd

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
    # dates (pandas' note that it parses each date on its own is no news to the user)
    numbers = pd.to_numeric(pd.Series(a), errors="coerce")
    if 2 * int(numbers.notna().sum()) >= len(a):
        t = numbers.to_numpy(dtype=np.float64)
        bad = ~np.isfinite(t)
        if bad.any():
            i = _first(bad)
            raise DataError(f"{where(c, i)}: {_show(a[i])} is neither a number nor a date")
        return t
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = pd.to_datetime(pd.Series(a), errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where(c, i)}: {_show(a[i])} is neither a number nor a date")
    return parsed.to_numpy().astype("datetime64[ns]").astype(np.int64)


def _codes(a: np.ndarray, c: str, source: str) -> tuple[np.ndarray, list[str]]:
    """Codes of a segment column and the value of each code; DataError above the cap."""
    import pandas as pd

    from ctrcal.metrics import MAX_SEGMENT_VALUES, bucketize

    if a.dtype.kind == "f" and np.unique(a[np.isfinite(a)]).size > 2 * NUMERIC_BUCKETS:
        codes = bucketize(a, NUMERIC_BUCKETS).astype(np.int32)
        values = []
        for k in range(int(codes.max()) + 1):
            sel = a[(codes == k) & np.isfinite(a)]
            values.append(f"[{sel.min():.4g}, {sel.max():.4g}]" if sel.size else "missing")
        return codes, values
    codes, uniques = pd.factorize(pd.Series(a), use_na_sentinel=False)
    if len(uniques) > MAX_SEGMENT_VALUES:
        raise DataError(
            f"{source}: segment column {c!r} has {len(uniques):,} distinct values, more than "
            f"the {MAX_SEGMENT_VALUES:,} a segment may have (an identifier, not a segment)"
        )
    return codes.astype(np.int32), [str(v) for v in uniques]


def _csv_separator(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    return "\t" if name.endswith((".tsv", ".txt")) else ","


def _not_utf8(path: Path) -> DataError:
    """The line and column of a CSV's first byte that is not UTF-8 text."""
    from ctrcal.data.parsed import TextLayout, file_not_utf8

    sep = _csv_separator(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        header = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    columns = tuple(c.strip().strip('"') for c in header.split(sep))
    error = file_not_utf8(path, TextLayout(sep, columns, 1))
    return error or DataError(f"{path}: not UTF-8 text; save the file as UTF-8")


def read_predictions(
    path: str | Path,
    prob: str,
    label: str | None,
    *,
    segments: Sequence[str] = (),
    time: str | None = None,
    compare: str | None = None,
    std: str | None = None,
) -> Predictions:
    """Read and check the named columns of a parquet or CSV predictions file.

    Raises:
        DataError: an unreadable file, a missing column or a bad value (naming the column
            and the row).
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    wanted = list(dict.fromkeys(c for c in (prob, label, compare, std, time, *segments) if c))
    name = path.name.lower().removesuffix(".gz")
    line_offset = None
    if name.endswith(".parquet") or name.endswith(".pq"):
        import pyarrow.parquet as pq

        try:
            have = pq.read_schema(path).names
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure is an unreadable file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from None
        table = pq.read_table(path, columns=[c for c in wanted if c in have])
        frame = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
        columns: Mapping[str, Any] = {c: frame.get(c) for c in have}
    elif name.endswith(_CSV_SUFFIXES):
        try:
            df = pd.read_csv(path, sep=_csv_separator(path), low_memory=False)
        except pd.errors.ParserError as exc:
            m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
            if m:
                raise DataError(
                    f"{path}: line {m.group(2)} has {m.group(3)} fields, the header {m.group(1)}"
                ) from None
            raise DataError(f"{path}: not a readable CSV file ({exc})") from None
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except pd.errors.EmptyDataError as exc:
            raise DataError(f"{path}: not a readable CSV file ({exc})") from None
        columns = {str(c): df[c].to_numpy() for c in df.columns}
        line_offset = 2
    else:
        raise DataError(f"{path}: expected a .parquet or .csv/.tsv file (optionally .gz)")
    return Predictions.from_columns(
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
