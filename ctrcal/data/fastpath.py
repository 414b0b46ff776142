"""The in-memory path's fast way: integer parsing, integer keys, a column per thread.

:func:`encode_fast` writes exactly what the strict way of
:func:`ctrcal.data.encode.encode_in_memory` writes (the same fitted state and rows, bit for
bit), for the input nearly every Criteo file is: well formed, integer numerics, hex hashes.
It is optimistic: the CSV reader parses the label and the ``I`` fields as Int64 itself (a
value like ``1.0``, ``inf`` or ``x`` fails the read), categoricals stay polars strings, and
each hash is used as the ``uint64`` key of its 8 bytes (:mod:`ctrcal.data.hexkeys`), read as
a number only for the distinct values of the train split. Whenever the input is not what it
assumes -- the read fails, a row has too many fields, a label is not 0/1, a categorical is
not a hex value -- it returns None *before writing anything*, and the strict way (which flags
such rows, names file / line / column, or skips them) prepares the data instead. A
categorical column whose values are not all 8 lowercase hex digits (other datasets, upper
case, short hashes) is read base 16 by polars as the strict way does, and encoded through
the pipeline's own lookup; the other columns keep the fast way.

Work per column is independent: the fit's counts of each column (train rows only), then,
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

from ctrcal.data import criteo
from ctrcal.data.criteo import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.data.features import MISSING_ID, OOV_ID, FeaturePipeline
from ctrcal.data.hexkeys import hex8_to_u32, key_expr, u32_to_hex8
from ctrcal.data.lookup import ValueIndex
from ctrcal.data.splits import SPLITS, SplitPlan

_DENSE_WIDTH = 1
"""A numeric column whose values span at most this many integers per row is counted with a
bincount and encoded through a table of its model values (cheaper than per-row logs)."""


class _NotFast(Exception):
    """The input needs the strict way (see the module docstring)."""


class _Categorical:
    """One categorical column as integer keys.

    ``raw``: ``keys`` are the 8 bytes of each value (``uint64``, see
    :mod:`ctrcal.data.hexkeys`); else ``values`` is the column read base 16 (``uint32``,
    polars' ``str.to_integer``, as the strict way reads it). ``valid`` is None when nothing is
    missing.
    """

    def __init__(self, strings: pl.Series, keys: pl.Series) -> None:
        self.raw = keys.null_count() == strings.null_count()  # every value has 8 bytes
        if not self.raw:
            keys = strings.str.to_integer(base=16, dtype=pl.UInt32, strict=False)
            if keys.null_count() != strings.null_count():
                raise _NotFast  # a value that is not hex: the strict way names its row
            self.values = keys
        self.valid = keys.is_not_null().to_numpy() if keys.null_count() else None
        self.keys = keys.fill_null(0).to_numpy() if self.valid is not None else keys.to_numpy()


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
        part = enc.filter(pl.Series(masks[k]))
        write(part, tmp / name / "part-00000.parquet")
        del part
    clock.add("write")
    tally.fast = True
    return True


def _parse(sources: list[Any]) -> tuple[pl.DataFrame, list[int]]:
    queries = []
    for s in sources:
        lf = criteo.scan_raw(s.read_path, s.fmt, integers=True, row_index=False)
        label = pl.col(LABEL) if s.fmt.labelled else pl.lit(None, pl.Int64).alias(LABEL)
        queries.append(lf.select(label, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS, criteo.EXTRA_COL))
    try:
        frames = pl.collect_all(queries)
    except pl.exceptions.PolarsError:
        raise _NotFast from None  # e.g. a numeric that is not an integer
    heights = [f.height for f in frames]
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=False)
    if frame[criteo.EXTRA_COL].null_count() != frame.height:
        raise _NotFast  # a row with more fields than the layout
    label = frame[LABEL]
    if label.null_count() != frame.height and (label.min() < 0 or label.max() > 1):
        raise _NotFast  # a label other than 0 / 1
    return frame.drop(criteo.EXTRA_COL), heights


def _parse_fit_encode(
    sources: list[Any], plan: SplitPlan, pipe: FeaturePipeline, clock: Any, tally: Any
) -> tuple[pl.DataFrame, list[np.ndarray]]:
    """Parse, fit on the train rows and encode every row; (encoded frame, row mask per
    split)."""
    from ctrcal.data.encode import PROB_COL, check_rows

    frame, heights = _parse(sources)
    clock("parse")
    n = frame.height
    file = np.repeat(np.arange(len(heights), dtype=np.int64), heights)
    row = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum([0, *heights[:-1]]), heights)
    codes = plan.codes(file, row)
    masks = [codes == k for k in range(len(SPLITS))]
    train = masks[0]
    label = frame[LABEL]
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

    # -- fit: each column's counts over the train rows --------------------------------------
    stats = pipe.new_stats()
    stats.add_rows(tally.rows[0])
    keys = frame.select(key_expr(name) for name in pipe.categorical_fields)
    cats: dict[str, _Categorical] = {}
    nums: dict[str, _Numeric] = {}

    def count_categorical(name: str, strings: pl.Series, key: pl.Series) -> None:
        col = cats[name] = _Categorical(strings, key)
        take = train if col.valid is None else train & col.valid
        counted = col.keys[take]
        counts = pl.Series("value", counted).value_counts(name="count")
        if col.raw:
            values, valid, canonical = hex8_to_u32(counts["value"].to_numpy())
            if not valid.all():
                raise _NotFast  # not hex: the strict way names the row
            counts = counts.with_columns(pl.Series("value", values))
            if not canonical.all():
                # upper case spells the same value as lower case: count them together
                counts = counts.group_by("value").agg(pl.col("count").sum())
        stats.add_counts(name, counts, tally.rows[0] - counted.size)

    def count_numeric(name: str, series: pl.Series) -> None:
        col = nums[name] = _Numeric(series)
        take = train if col.valid is None else train & col.valid
        if col.index is not None:
            per_value = np.bincount(col.index[take], minlength=col.width)
            present = np.flatnonzero(per_value)
            counts = pl.DataFrame({"value": (present + col.low).astype(np.float64),
                                   "count": per_value[present].astype(np.uint64)})  # fmt: skip
        else:
            values = series.filter(pl.Series(take))
            counts = values.value_counts(name="count").rename({name: "value"})
            counts = counts.with_columns(pl.col("value").cast(pl.Float64))
        stats.add_counts(name, counts, tally.rows[0] - int(take.sum()))

    jobs: list[tuple[Any, ...]] = [(count_numeric, m, frame[m]) for m in pipe.numeric_fields]
    jobs += [(count_categorical, m, frame[m], keys[m]) for m in pipe.categorical_fields]
    del frame, keys  # the strings are not needed once the keys are taken
    _run(jobs)
    del jobs
    pipe.fit_stats(stats)
    clock("fit")

    # -- encode every row ------------------------------------------------------------------
    def encode_categorical(name: str) -> pl.Series:
        col = cats.pop(name)
        if not col.raw:
            return pipe._encode_categorical(col.values)
        vocab = pipe.vocab_[name]
        index = ValueIndex(u32_to_hex8(vocab["value"].to_numpy()), vocab["id"].to_numpy())
        skip = None if col.valid is None else ~col.valid
        ids = index.lookup(col.keys, OOV_ID, skip=skip)
        if skip is not None:
            ids[skip] = MISSING_ID
        # A key outside the vocabulary is a rare value, a held-out row's value the fit never
        # saw (still it must be hex), or one spelled in upper case (whose value may be kept)
        rows = np.flatnonzero(ids == OOV_ID)
        values, valid, canonical = hex8_to_u32(col.keys[rows])
        if not valid.all():
            raise _NotFast
        if not canonical.all():
            other = ~canonical
            ids[rows[other]] = pipe._index(name).lookup(values[other], OOV_ID)
        return pl.Series(name, ids)

    def encode_numeric(name: str, j: int) -> pl.Series:
        col = nums.pop(name)
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
    return pl.DataFrame(encoded), masks


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
