"""Exact, mergeable fit statistics: what :class:`~ctrcal.preparation.features.FeaturePipeline`
learns from, as integer counts that add up the same whatever the chunking, and the moments
and quantiles of such a histogram (exactly rounded, so they depend only on the counts).

The statistics of part of the train rows (a chunk, a file, a day, a byte range) are a
:class:`FitStats` of their own: :meth:`FitStats.to_bytes` serializes one (to send it from the
machine that counted it), :meth:`FitStats.merge` adds another into it. Merging is integer
addition per value, so it is associative and commutative: any partition of the rows, counted
piece by piece and merged in any order or tree, gives the counts of the whole. No threshold
(``min_count``, ``max_vocab``, hashed ids, bucket boundaries) is applied to a partial: the
pipeline applies them to the merged counts only, in :meth:`FeaturePipeline.fit_stats
<ctrcal.preparation.features.FeaturePipeline.fit_stats>`.
"""

from __future__ import annotations

import io
import json
import math
import struct

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
        if counts.schema["value"] != self.dtype:
            # 64-bit keys (hashed strings) in one partial widen the field's 32-bit ones
            self.dtype = pl.UInt64 if self.dtype in (pl.UInt32, pl.UInt64) else self.dtype
            counts = counts.with_columns(pl.col("value").cast(self.dtype))
            if self._merged is not None:
                self._merged = self._merged.with_columns(pl.col("value").cast(self.dtype))
            self._pending = [
                f.with_columns(pl.col("value").cast(self.dtype)) for f in self._pending
            ]
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

    def merge(self, other: FitStats) -> FitStats:
        """Add ``other``'s counts (the statistics of other rows of the same fields) into these;
        returns ``self``. Associative and commutative: the merged counts are those of all the
        rows, whatever the order and grouping of the merges.

        Raises:
            ValueError: statistics of other fields.
        """
        if (other.categorical_fields, other.numeric_fields) != (
            self.categorical_fields,
            self.numeric_fields,
        ):
            raise ValueError("FitStats.merge: statistics of other fields")
        self.add_rows(other.rows)
        for name in (*self.categorical_fields, *self.numeric_fields):
            self.add_counts(name, other.counts(name), other.nulls[name])
        return self

    def to_bytes(self) -> bytes:
        """The statistics as bytes (:meth:`from_bytes` reads them back): a JSON header (fields,
        rows, null counts), then each field's ``value``, ``count`` table as Arrow IPC."""
        header = {
            "version": _FORMAT_VERSION,
            "categorical_fields": self.categorical_fields,
            "numeric_fields": self.numeric_fields,
            "rows": self.rows,
            "nulls": self.nulls,
        }
        out = io.BytesIO()
        _put(out, json.dumps(header).encode())
        for name in (*self.categorical_fields, *self.numeric_fields):
            table = io.BytesIO()
            self.counts(name).write_ipc(table)
            _put(out, table.getvalue())
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> FitStats:
        """Statistics written by :meth:`to_bytes`.

        Raises:
            ValueError: bytes that are not such statistics.
        """
        view = memoryview(data)
        try:
            at, body = _take(view, 0)
            header = json.loads(bytes(body))
            if header.get("version") != _FORMAT_VERSION:
                raise ValueError(f"format version {header.get('version')!r}")
            stats = cls(header["categorical_fields"], header["numeric_fields"])
            stats.rows = int(header["rows"])
            for name in (*stats.categorical_fields, *stats.numeric_fields):
                at, body = _take(view, at)
                stats.add_counts(name, pl.read_ipc(io.BytesIO(bytes(body))), 0)
                stats.nulls[name] = int(header["nulls"][name])
        except (KeyError, TypeError, struct.error, json.JSONDecodeError) as exc:
            raise ValueError(f"FitStats.from_bytes: not fit statistics ({exc})") from None
        return stats


_FORMAT_VERSION = 1


def _put(out: io.BytesIO, body: bytes) -> None:
    out.write(struct.pack("<Q", len(body)))
    out.write(body)


def _take(view: memoryview, at: int) -> tuple[int, memoryview]:
    (n,) = struct.unpack_from("<Q", view, at)
    at += 8
    if at + n > len(view):
        raise struct.error("truncated")
    return at + n, view[at : at + n]


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
