"""Exact, mergeable fit statistics: what :class:`~ctrcal.data.features.FeaturePipeline` learns
from, as integer counts that add up the same whatever the chunking, and the moments and
quantiles of such a histogram (exactly rounded, so they depend only on the counts)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl


class _CountTable:
    """``value -> count`` summed over chunks.

    Chunk tables are kept pending and merged (one ``group_by``) only once they outweigh the
    merged table, so each row is re-aggregated O(log chunks) times and memory stays within a
    small multiple of the number of distinct values, whatever the number of rows.
    """

    MIN_MERGE_ROWS = 1 << 16

    def __init__(self, dtype: pl.DataType) -> None:
        self.dtype = dtype
        self._merged: pl.DataFrame | None = None
        self._pending: list[pl.DataFrame] = []
        self._pending_rows = 0

    def add(self, counts: pl.DataFrame) -> None:
        if counts.schema["count"] != pl.UInt64:
            counts = counts.with_columns(pl.col("count").cast(pl.UInt64))
        self._pending.append(counts)
        self._pending_rows += counts.height
        merged = self._merged.height if self._merged is not None else 0
        if self._pending_rows > max(self.MIN_MERGE_ROWS, merged):
            self._merge()

    def _merge(self) -> None:
        frames = ([self._merged] if self._merged is not None else []) + self._pending
        if len(frames) == 1:
            self._merged = frames[0]
        elif frames:
            self._merged = pl.concat(frames).group_by("value").agg(pl.col("count").sum())
        self._pending, self._pending_rows = [], 0

    def result(self) -> pl.DataFrame:
        """The merged table (columns ``value``, ``count`` u64; row order unspecified)."""
        self._merge()
        if self._merged is None:
            # a field without a single value in train (all missing)
            return pl.DataFrame(schema={"value": self.dtype, "count": pl.UInt64})
        return self._merged


class FitStats:
    """Everything :class:`FeaturePipeline` learns from, as exact integer counts.

    Per categorical field the count of every distinct value, per numeric field the count of
    every distinct raw value (Criteo numerics are integer counts, so this histogram is about
    as small as a vocabulary), the null counts and the number of rows. Counts add up exactly,
    so statistics accumulated chunk by chunk (:meth:`add_counts` per chunk) equal those of the
    whole split at once, and so does everything fitted from them: the vocabularies, the
    numeric mean and std (computed from the histogram with compensated sums, two passes) and
    exact quantile boundaries. Memory grows with the number of distinct values, not rows.

    Args:
        categorical_fields / numeric_fields: the columns to count.
    """

    def __init__(self, categorical_fields: list[str], numeric_fields: list[str]) -> None:
        self.categorical_fields = list(categorical_fields)
        self.numeric_fields = list(numeric_fields)
        self.rows = 0
        self.nulls: dict[str, int] = {n: 0 for n in self.categorical_fields + self.numeric_fields}
        self._tables = {n: _CountTable(pl.UInt32) for n in self.categorical_fields}
        self._tables.update({n: _CountTable(pl.Float64) for n in self.numeric_fields})

    def add_counts(self, name: str, counts: pl.DataFrame, nulls: int) -> None:
        """Add one field's counts computed elsewhere (``value``, ``count`` over non-null
        values, the field's dtype: uint32 or uint64 categorical, float64 numeric) and its null
        count; the rows they came from are added once with :meth:`add_rows`."""
        self.nulls[name] += int(nulls)
        if counts.height:
            self._tables[name].add(counts)

    def add_rows(self, rows: int) -> None:
        """Count ``rows`` more rows (see :meth:`add_counts`)."""
        self.rows += int(rows)

    def counts(self, name: str) -> pl.DataFrame:
        """``value``, ``count`` of one field (non-null values only)."""
        return self._tables[name].result()


__all__ = ["FitStats", "weighted_moments", "weighted_quantiles"]


def weighted_moments(t: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """Mean and population std of values ``t`` with counts ``c``: two passes, each an exactly
    rounded sum (``math.fsum``), so the result depends only on the histogram."""
    n = float(c.sum())
    if n == 0 or not np.isfinite(t).all():
        return 0.0, 0.0  # nothing usable to standardise by: leave the values as they are
    mean = math.fsum((c * t).tolist()) / n
    var = math.fsum((c * (t - mean) ** 2).tolist()) / n
    return mean, math.sqrt(var)


def weighted_quantiles(z: np.ndarray, c: np.ndarray, qs: list[float]) -> list[float]:
    """Linear-interpolation quantiles of the multiset {z_i repeated c_i times}, deduplicated and
    sorted (as the bucket boundaries); [] when there are no values."""
    n = int(c.sum())
    if n == 0:
        return []
    order = np.argsort(z, kind="stable")
    z, cum = z[order], np.cumsum(c[order])
    out = set()
    for q in qs:
        h = q * (n - 1)
        lo = math.floor(h)
        x_lo = z[np.searchsorted(cum, lo, side="right")]
        x_hi = z[np.searchsorted(cum, min(lo + 1, n - 1), side="right")]
        out.add(float(x_lo + (h - lo) * (x_hi - x_lo)))
    return sorted(out)
