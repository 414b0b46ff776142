"""The fast path's fit and encoding of C-parsed clean files, through dense column codes.

When every source is a clean file read by :mod:`ctrcal.data.tsv_reader` and the
:mod:`ctrcal.data.column_codes` kernel builds, :mod:`ctrcal.data.fastpath` hands the parsed
arrays here instead of building polars columns. One C pass per column codes its rows and
counts each distinct value's train rows; the fit reads only the distinct values and their
counts (:class:`~ctrcal.data.features.FitStats`, exactly what counting the rows gives), and
the encoding answers once per distinct value (its vocabulary id, its model value) and gathers
those answers for the rows. The answers are the per-row ones of the other ways, computed by
the same functions (:meth:`~ctrcal.data.features.FeaturePipeline._model_values`, the
vocabulary's :class:`~ctrcal.data.lookup.ValueIndex`), so the output is the same bit for bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from ctrcal.data import column_codes
from ctrcal.data.column_codes import ColumnCodes
from ctrcal.data.criteo import LABEL
from ctrcal.data.features import MISSING_ID, OOV_ID, FeaturePipeline, FitStats
from ctrcal.data.hexkeys import hex8_to_u32
from ctrcal.data.tsv_reader import CleanColumns, nullable_series

_EXACT = 2**53
"""Integers up to this magnitude are exact in float64."""


@dataclass
class CodedInput:
    """Every source's C-parsed rows, joined: ``label`` [N] int64 with ``label_valid`` [N]
    uint8 (0 also for all rows of an unlabelled file), ``ints`` / ``ivalid`` [13, N] the
    ``I`` fields, ``keys`` / ``kvalid`` [26, N] the ``C`` fields' keys."""

    label: np.ndarray
    label_valid: np.ndarray
    ints: np.ndarray
    ivalid: np.ndarray
    keys: np.ndarray
    kvalid: np.ndarray

    @classmethod
    def join(cls, parts: list[CleanColumns]) -> CodedInput:
        """The sources' rows in order (a single source's arrays are used as they are)."""
        labels, valids = [], []
        for p in parts:
            if p.labelled:
                labels.append(p.ints[0])
                valids.append(p.ivalid[0])
            else:
                labels.append(np.zeros(p.rows, dtype=np.int64))
                valids.append(np.zeros(p.rows, dtype=np.uint8))
        skip = [int(p.labelled) for p in parts]
        if len(parts) == 1:
            p = parts[0]
            return cls(labels[0], valids[0], p.ints[skip[0]:], p.ivalid[skip[0]:], p.keys,
                       p.kvalid)  # fmt: skip
        return cls(
            np.concatenate(labels), np.concatenate(valids),
            np.concatenate([p.ints[k:] for p, k in zip(parts, skip, strict=True)], axis=1),
            np.concatenate([p.ivalid[k:] for p, k in zip(parts, skip, strict=True)], axis=1),
            np.concatenate([p.keys for p in parts], axis=1),
            np.concatenate([p.kvalid for p in parts], axis=1),
        )  # fmt: skip

    def label_series(self, order: np.ndarray | None = None) -> pl.Series:
        """``label`` Int64, null where missing (as polars reads it); its rows taken in
        ``order`` ([N] row indices) if given."""
        label, valid = self.label, self.label_valid
        if order is not None:
            label, valid = label.take(order), valid.take(order)
        return nullable_series(LABEL, label, valid, pa.int64())


@dataclass
class CodedColumns:
    """The coded numeric and categorical columns, and each categorical's distinct values read
    base 16 (uint32, as the feature map stores them)."""

    numeric: list[ColumnCodes]
    categorical: list[ColumnCodes]
    categorical_values: list[np.ndarray]


def fit(
    data: CodedInput,
    train: np.ndarray,
    pipe: FeaturePipeline,
    rows: int,
    threads: int,
    dest: np.ndarray | None = None,
) -> CodedColumns | None:
    """Code every column and fit ``pipe`` on the ``train`` rows ([N] bool, ``rows`` of them);
    None (``pipe`` left unfitted) when a key is not hex, which the strict way must name.
    ``dest`` ([N] int32 permutation, optional) reorders the rows of the coded columns (see
    :func:`~ctrcal.data.column_codes.code_column`), and so of the encoding."""
    nums, cats = pipe.numeric_fields, pipe.categorical_fields
    columns = [(data.ints[j], data.ivalid[j]) for j in range(len(nums))]
    columns += [(data.keys[j], data.kvalid[j]) for j in range(len(cats))]
    coded = column_codes.code_columns(columns, train.view(np.uint8), threads, dest)
    num_codes, cat_codes = coded[: len(nums)], coded[len(nums):]
    stats = FitStats(cats, nums)
    stats.add_rows(rows)
    for name, c in zip(nums, num_codes, strict=True):
        seen = c.train_counts > 0
        counts = _counts(c.distinct[seen].astype(np.float64), c.train_counts[seen])
        if seen.any() and max(-int(c.distinct.min()), int(c.distinct.max())) > _EXACT:
            # integers beyond 2^53 can share a float64: count them together, as counting the
            # float64 values of the rows does
            counts = counts.group_by("value").agg(pl.col("count").sum())
        stats.add_counts(name, counts, c.train_missing)
    cat_values = []
    for name, c in zip(cats, cat_codes, strict=True):
        values, hexadecimal, canonical = hex8_to_u32(c.distinct)
        if not hexadecimal.all():
            return None
        cat_values.append(values)
        seen = c.train_counts > 0
        counts = _counts(values[seen], c.train_counts[seen])
        if not canonical[seen].all():
            # upper case spells the same value as lower case: count them together
            counts = counts.group_by("value").agg(pl.col("count").sum())
        stats.add_counts(name, counts, c.train_missing)
    pipe.fit_stats(stats)
    return CodedColumns(num_codes, cat_codes, cat_values)


def encode(coded: CodedColumns, pipe: FeaturePipeline, threads: int) -> list[pl.Series]:
    """Every row of the fitted columns encoded: the numeric, then the categorical columns in
    the pipeline's order (float32 with nulls, int32 ids). The encoding is written over the
    codes, which ``coded`` no longer holds afterwards."""
    nums, cats = pipe.numeric_fields, pipe.categorical_fields

    def numeric(j: int, c: ColumnCodes) -> pl.Series:
        z = c.gather(pipe._model_values(c.distinct.astype(np.float64), j), np.float32(np.nan),
                     reuse=True)  # fmt: skip
        return nullable_series(nums[j], z, ~np.isnan(z))

    def categorical(name: str, c: ColumnCodes, values: np.ndarray) -> pl.Series:
        # by value, so that an upper-case spelling of a kept value gets its id
        ids = c.gather(pipe._index(name).lookup(values, OOV_ID), MISSING_ID, reuse=True)
        return nullable_series(name, ids)

    jobs = [(numeric, j, c) for j, c in enumerate(coded.numeric)]
    jobs += [(categorical, n, c, v) for n, c, v in zip(cats, coded.categorical,
                                                         coded.categorical_values, strict=True)]
    return _run(jobs, threads)


def _counts(values: np.ndarray, counts: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame([nullable_series("value", values),
                         nullable_series("count", counts.astype(np.uint64))])  # fmt: skip


def _run(jobs: list[tuple], threads: int) -> list[pl.Series]:
    if threads <= 1:
        return [fn(*args) for fn, *args in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, os.cpu_count() or 1)) as pool:
        return [f.result() for f in [pool.submit(fn, *args) for fn, *args in jobs]]


__all__ = ["CodedColumns", "CodedInput", "encode", "fit"]
