"""The rows the parser gives (:func:`ctrcal.preparation.parse.iter_chunks`, the route ``prepare``
reads through) as one typed frame, for tests of the readers and of prepared data.

Imported by tests as ``from parsed_rows import read_rows`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.preparation import criteo
from ctrcal.preparation.parse import iter_chunks
from ctrcal.preparation.parsed import ParsedChunk


def chunk_frame(chunk: ParsedChunk) -> pl.DataFrame:
    """``label`` float32, ``I1..I13`` float64, ``C1..C26`` uint32 of one parsed chunk, null =
    missing (a chunk's arrays may be the reader's, reused by the next chunk: copied)."""
    cols = [pl.Series(LABEL, chunk.label.astype(np.float32), nan_to_null=True)]
    for j, name in enumerate(NUMERIC_COLUMNS):
        cols.append(_with_nulls(pl.Series(name, chunk.numeric[j].copy()), chunk.numeric_valid[j]))
    for j, name in enumerate(CATEGORICAL_COLUMNS):
        s = pl.Series(name, chunk.categorical[j].astype(np.uint32))
        cols.append(_with_nulls(s, chunk.categorical_valid[j]))
    return pl.DataFrame(cols)


def _with_nulls(s: pl.Series, valid: np.ndarray) -> pl.Series:
    missing = np.flatnonzero(valid == 0)
    return s.scatter(missing, None) if len(missing) else s


def read_rows(
    paths: str | Path | Sequence[str | Path], layout: str = "auto", on_bad_row: str = "error"
) -> pl.DataFrame:
    """Every good row of Criteo file(s) in any layout, as the parser gives them to ``prepare``.

    Raises:
        DataError: as the parser does (unknown layout, unreadable file, malformed row).
    """
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    formats = [criteo.detect_format(p, layout) for p in paths]
    frames = [
        chunk_frame(c)
        for p, f in zip(paths, formats, strict=True)
        for c in iter_chunks(p, f, on_bad_row)
    ]
    if not frames:  # nothing but a header
        schema = {LABEL: pl.Float32} | {n: pl.Float64 for n in NUMERIC_COLUMNS}
        return pl.DataFrame(schema=schema | {n: pl.UInt32 for n in CATEGORICAL_COLUMNS})
    return pl.concat(frames)
