"""The in-memory path's fast way: integer parsing, integer keys, a column per thread.

:func:`encode_fast` writes exactly what the strict way of
:func:`ctrcal.data.encode.encode_in_memory` writes (the same fitted state and rows, bit for
bit), for the input nearly every Criteo file is: well formed, integer numerics, hex hashes.
It is optimistic:

* the CSV reader parses the label and the ``I`` fields as Int64 itself (``1.0``, ``inf``,
  ``nan`` or ``x`` fail the read; an accepted value equals the float the strict way reads);
* each categorical becomes, as it is parsed, the ``uint64`` key of its 8 bytes
  (:mod:`ctrcal.data.hexkeys`); keys are counted and looked up as integers, and read as hex
  numbers only for the distinct values of the train split and the values outside the
  vocabulary. A column with values of another length (short hashes, other datasets) is read
  base 16 by polars as the strict way reads it, and the other columns keep their keys;
* numeric columns spanning few integers are counted with a bincount and encoded through a
  table of their model values (elementwise the same numbers as transforming every row).

Whenever the input is not what it assumes -- the read fails, a row has more fields than the
layout, a label is not 0/1, a categorical is not hex -- :func:`encode_fast` returns False
*before writing anything*, and the strict way (which flags such rows with file, line and
column, or skips them) prepares the data instead.

Clean files (see :mod:`ctrcal.data.tsv_reader`) go further in C: their parsed arrays are coded
column by column (:mod:`ctrcal.data.column_codes`, :mod:`ctrcal.data.coded_fit`), so the fit
reads each column's distinct values and train counts, the encoding answers once per distinct
value, and the rows come out grouped by split (each split written as a slice, not a filter).

Otherwise work per column is independent: the fit's counts of each column (train rows only), then,
after :meth:`~ctrcal.data.features.FeaturePipeline.fit_stats`, the encoding of each column,
run on a thread per core (numpy and polars release the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ctrcal.data import coded_fit, column_codes, criteo, tsv_reader
from ctrcal.data.coded_fit import CodedInput
from ctrcal.data.criteo import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.data.features import MISSING_ID, OOV_ID, FeaturePipeline, FitStats
from ctrcal.data.hexkeys import hex8_to_u32, key_expr, u32_to_hex8
from ctrcal.data.lookup import ValueIndex
from ctrcal.data.splits import SPLITS, SplitPlan

_DENSE_WIDTH = 1
"""A numeric column whose values span at most this many integers per row is counted with a
bincount and encoded through a table of its model values (cheaper than per-row logs)."""


class _NotFast(Exception):
    """The input needs the strict way (see the module docstring)."""


class _Numeric:
    """One Int64 numeric column; ``index`` (value - ``low``) when its values are dense."""

    def __init__(self, series: pl.Series) -> None:
        self.series = series
        self.valid = series.is_not_null().to_numpy() if series.null_count() else None
        self.index = None
        if series.null_count() < len(series):
            low, high = int(series.min()), int(series.max())
            if high - low < _DENSE_WIDTH * len(series):
                self.low, self.width = low, high - low + 1
                self.index = series.fill_null(low).to_numpy() - low


def encode_fast(
    tmp: Path,
    sources: list[Any],
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Any,
    tally: Any,
    write: Callable[[pl.DataFrame, Path], None],
) -> bool:
    """Prepare ``sources`` into ``tmp`` the fast way; False (nothing written) when the input
    needs the strict way. Fills ``tally`` (rows and labels per split, ``with_prob``)."""
    if any(s.fmt.layout == "x1" for s in sources):
        return False  # decimal ids and scaled numerics: the strict way reads those
    try:
        enc, masks = _parse_fit_encode(sources, plan, pipe, clock, tally)
    except _NotFast:
        return False
    for k, name in enumerate(SPLITS):
        (tmp / name).mkdir()
        rows = masks[k]
        part = enc.slice(*rows) if isinstance(rows, tuple) else enc.filter(pl.Series(rows))
        write(part, tmp / name / "part-00000.parquet")
    clock.add("write")
    tally.fast = True
    return True


def _odd(name: str) -> str:
    return f"__other_length_{name}"


def _parse(sources: list[Any]) -> tuple[pl.DataFrame | CodedInput, list[int]]:
    """Every source's rows: ``label`` and ``I1..I13`` Int64, ``C1..C26`` integer keys (null =
    missing): ``uint64`` keys of their 8-byte values (see :mod:`ctrcal.data.hexkeys`), or for
    a column with values of other lengths the values read base 16 (``uint32``, polars'
    ``str.to_integer``, as the strict way reads them). The keys are taken as the text is
    parsed, so the strings of a whole file are never held at once. Files in the clean form
    are read by :mod:`ctrcal.data.tsv_reader` instead (the same frame, in C, a chunk per
    thread). Also each source's rows.

    Raises:
        _NotFast: anything the strict way must flag (see the module docstring).
    """
    native = [tsv_reader.read_clean_columns(s.read_path, s.fmt) for s in sources]
    if all(f is not None for f in native):
        heights = [f.rows for f in native]
        if column_codes.available() and sum(heights) <= column_codes.MAX_ROWS:
            coded = CodedInput.join(native)
            _check_labels(coded.label_series())
            return coded, heights
        frames = [f.frame() for f in native]
        frame = frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=False)
        _check_labels(frame[LABEL])
        return frame, heights
    del native
    queries = []
    for s in sources:
        lf = criteo.scan_raw(s.read_path, s.fmt, integers=True, row_index=False)
        label = pl.col(LABEL) if s.fmt.labelled else pl.lit(None, pl.Int64).alias(LABEL)
        other = [(pl.col(c).is_not_null() & key_expr(c).is_null()).alias(_odd(c))
                 for c in CATEGORICAL_COLUMNS]  # fmt: skip
        keys = [key_expr(c) for c in CATEGORICAL_COLUMNS]
        queries.append(lf.select(label, *NUMERIC_COLUMNS, *keys, *other, criteo.EXTRA_COL))
    try:
        frames = pl.collect_all(queries, engine="streaming")
    except pl.exceptions.PolarsError:
        raise _NotFast from None  # e.g. a numeric that is not an integer
    heights = [f.height for f in frames]
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=False)
    del frames
    if frame[criteo.EXTRA_COL].null_count() != frame.height:
        raise _NotFast  # a row with more fields than the layout
    _check_labels(frame[LABEL])
    flags = frame.select(pl.col(_odd(c)).any() for c in CATEGORICAL_COLUMNS).row(0)
    frame = frame.drop(criteo.EXTRA_COL, *(_odd(c) for c in CATEGORICAL_COLUMNS))
    other = [c for c, flag in zip(CATEGORICAL_COLUMNS, flags, strict=True) if flag]
    if other:
        frame = frame.with_columns(_read_base16(sources, other))
    return frame, heights


def _check_labels(label: pl.Series) -> None:
    if label.null_count() != len(label) and (label.min() < 0 or label.max() > 1):
        raise _NotFast  # a label other than 0 / 1


def _read_base16(sources: list[Any], names: list[str]) -> pl.DataFrame:
    """Categorical columns ``names`` read base 16 (``uint32``), reading the sources again."""
    queries = [criteo.scan_raw(s.read_path, s.fmt, row_index=False).select(names)
               for s in sources]  # fmt: skip
    strings = pl.concat(pl.collect_all(queries, engine="streaming"))
    values = strings.select(pl.col(n).str.to_integer(base=16, dtype=pl.UInt32, strict=False)
                            for n in names)  # fmt: skip
    if values.null_count().row(0) != strings.null_count().row(0):
        raise _NotFast  # a value that is not hex: the strict way names its row
    return values


def _parse_fit_encode(
    sources: list[Any], plan: SplitPlan, pipe: FeaturePipeline, clock: Any, tally: Any
) -> tuple[pl.DataFrame, list[np.ndarray] | list[tuple[int, int]]]:
    """Parse, fit on the train rows and encode every row; (encoded frame, per split its row
    mask, or its (offset, rows) in a frame whose rows are grouped by split)."""
    from ctrcal.data.encode import PROB_COL, check_rows

    frame, heights = _parse(sources)
    clock("parse")
    n = sum(heights)
    file = np.repeat(np.arange(len(heights), dtype=np.int64), heights)
    row = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum([0, *heights[:-1]]), heights)
    codes = plan.codes(file, row)
    masks = [codes == k for k in range(len(SPLITS))]
    train = masks[0]
    label = frame.label_series() if isinstance(frame, CodedInput) else frame[LABEL]
    labelled = label.is_not_null().to_numpy()
    label_np = label.fill_null(0).to_numpy().astype(np.float64)
    for k, mask in enumerate(masks):
        tally.rows[k] += int(mask.sum())
        tally.label_sum[k] += float(label_np[mask].sum())
        tally.labelled[k] += int((labelled & mask).sum())
    tally.chunks = 1
    check_rows(tally, sources)
    probs = _probs(sources, heights) if tally.with_prob else None
    tally.with_prob = probs is not None
    clock("split")
    if isinstance(frame, CodedInput):
        return _fit_encode_coded(frame, masks, pipe, tally, probs, clock)

    # -- fit: each column's counts over the train rows (polars, a column per thread) --------
    # each column is dropped once encoded, so memory shrinks as the encoded columns grow
    keys = {name: frame[name] for name in pipe.categorical_fields}
    numerics = {name: frame[name] for name in pipe.numeric_fields}
    del frame
    counted = FitStats(pipe.categorical_fields, pipe.numeric_fields)
    counted.add_rows(tally.rows[0])
    train_rows = pl.Series(train)
    _run([(lambda name, col: counted.update_field(name, col.filter(train_rows)), name, col)
          for name, col in (*numerics.items(), *keys.items())])  # fmt: skip
    stats = pipe.new_stats()
    stats.add_rows(counted.rows)
    for name in pipe.numeric_fields:
        stats.add_counts(name, counted.counts(name), counted.nulls[name])
    for name in pipe.categorical_fields:
        counts = counted.counts(name)
        if keys[name].dtype == pl.UInt64:
            values, valid, canonical = hex8_to_u32(counts["value"].to_numpy())
            if not valid.all():
                raise _NotFast  # not hex: the strict way names the row
            counts = counts.with_columns(pl.Series("value", values))
            if not canonical.all():
                # upper case spells the same value as lower case: count them together
                counts = counts.group_by("value").agg(pl.col("count").sum())
        stats.add_counts(name, counts, counted.nulls[name])
    pipe.fit_stats(stats)
    clock("fit")

    # -- encode every row ------------------------------------------------------------------
    def encode_categorical(name: str) -> pl.Series:
        key = keys.pop(name)
        if key.dtype != pl.UInt64:
            return pipe._encode_categorical(key)  # read base 16 as the strict way reads it
        valid = key.is_not_null().to_numpy() if key.null_count() else None
        key = key.fill_null(0).to_numpy() if valid is not None else key.to_numpy()
        vocab = pipe.vocab_[name]
        index = ValueIndex(u32_to_hex8(vocab["value"].to_numpy()), vocab["id"].to_numpy())
        skip = None if valid is None else ~valid
        ids = index.lookup(key, OOV_ID, skip=skip)
        if skip is not None:
            ids[skip] = MISSING_ID
        # A key outside the vocabulary is a rare value, a held-out row's value the fit never
        # saw (still it must be hex), or one spelled in upper case (whose value may be kept)
        rows = np.flatnonzero(ids == OOV_ID)
        values, hexadecimal, canonical = hex8_to_u32(key[rows])
        if not hexadecimal.all():
            raise _NotFast
        if not canonical.all():
            other = ~canonical
            ids[rows[other]] = pipe._index(name).lookup(values[other], OOV_ID)
        return pl.Series(name, ids)

    def encode_numeric(name: str, j: int) -> pl.Series:
        col = _Numeric(numerics.pop(name))
        if col.index is None:
            return pipe._encode_numeric(col.series, j)
        # the model value of each integer in the column's range, then one gather: the same
        # numbers as transforming every row (elementwise), at a fraction of the logs
        table = pipe._model_values(np.arange(col.low, col.low + col.width, dtype=np.float64), j)
        z = table.take(col.index)
        if col.valid is not None:
            z[~col.valid] = np.nan
        return pl.Series(name, z, nan_to_null=True)

    jobs = [(pipe._encode_label, label)]
    jobs += [(encode_numeric, m, j) for j, m in enumerate(pipe.numeric_fields)]
    jobs += [(encode_categorical, m) for m in pipe.categorical_fields]
    encoded = _run(jobs)
    if probs is not None:
        encoded.append(probs.alias(PROB_COL))
    clock.add("encode")
    # one chunk per column whatever the parse's chunking, so the files written do not depend
    # on how the streaming engine cut the text (reruns are byte-identical)
    return pl.DataFrame(encoded).rechunk(), masks


def _fit_encode_coded(
    data: CodedInput, masks: list[np.ndarray], pipe: FeaturePipeline, tally: Any,
    probs: pl.Series | None, clock: Any,
) -> tuple[pl.DataFrame, list[tuple[int, int]]]:
    """The fit and encoding of :mod:`ctrcal.data.coded_fit`: the frame below with its rows
    grouped by split (each split's rows in their order), and each split's (offset, rows)."""
    from ctrcal.data.encode import PROB_COL

    # the coding writes each row's code at its place in split order: a split is then a slice
    # of the encoded columns instead of a filter of all of them
    n = len(masks[0])
    order = np.concatenate([np.flatnonzero(m) for m in masks])
    dest = np.empty(n, dtype=np.int32)
    dest[order] = np.arange(n, dtype=np.int32)
    threads = min(pl.thread_pool_size(), os.cpu_count() or 1)
    coded = coded_fit.fit(data, masks[0], pipe, tally.rows[0], threads, dest)
    if coded is None:
        raise _NotFast  # a key that is not hex: the strict way names the row
    clock("fit")
    label = pipe._encode_label(data.label_series(order))
    columns = [label, *coded_fit.encode(coded, pipe, threads)]
    if probs is not None:
        columns.append(probs.gather(order).alias(PROB_COL))
    clock.add("encode")
    sizes = [int(m.sum()) for m in masks]
    offsets = np.cumsum([0, *sizes[:-1]]).tolist()
    return pl.DataFrame(columns), list(zip(offsets, sizes, strict=True))


def _probs(sources: list[Any], heights: list[int]) -> pl.Series | None:
    """True probabilities of generated sources, row-aligned; None if any file has another
    number of rows (edited since it was generated)."""
    if any(pq.ParquetFile(s.prob).metadata.num_rows != h
           for s, h in zip(sources, heights, strict=True)):  # fmt: skip
        return None
    probs = pl.concat([pl.read_parquet(s.prob, columns=["prob"]) for s in sources])
    return probs["prob"].cast(pl.Float32)


def _run(jobs: list[tuple[Any, ...]]) -> list[Any]:
    """``fn(*args)`` of every job, on a thread per core; results in order."""
    workers = min(len(jobs), pl.thread_pool_size(), os.cpu_count() or 1)
    if workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(fn, *args) for fn, *args in jobs]
        return [f.result() for f in futures]


__all__ = ["encode_fast"]
