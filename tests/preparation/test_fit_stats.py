"""Fit statistics a cluster can merge: any partition of the same rows into files and chunks,
counted piece by piece, serialized and merged in any order, fits the same state bit for bit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrcal.preparation.features import FeaturePipeline
from ctrcal.preparation.fit_stats import FitStats

CATS = ["c_small", "c_zipf", "c_wide"]
NUMS = ["n_int", "n_real"]


def _rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Columns of ``n`` rows (NaN / a mask for missing): Zipf-like categoricals, one of them
    with 64-bit keys in some rows, an integer-count numeric and a real one with negatives."""
    wide = rng.integers(0, 40, n).astype(np.uint64)
    wide[rng.random(n) < 0.3] += np.uint64(1 << 40)  # keys beyond 32 bits in some rows only
    return {
        "c_small": rng.integers(0, 6, n).astype(np.uint64),
        "c_zipf": np.minimum(rng.zipf(1.6, n), 5000).astype(np.uint64),
        "c_wide": wide,
        "n_int": np.floor(rng.exponential(20.0, n)),
        "n_real": np.round(rng.normal(0.0, 3.0, n), 2),
        "missing": rng.random((5, n)) < 0.1,
    }


def _count(rows: dict[str, np.ndarray], lo: int, hi: int) -> FitStats:
    """The statistics of rows ``[lo, hi)``, as the coders of one chunk give them: a wide
    field's keys are uint64 only where a key needs it, uint32 elsewhere."""
    stats = FitStats(CATS, NUMS)
    stats.add_rows(hi - lo)
    for j, name in enumerate(CATS + NUMS):
        values, missing = rows[name][lo:hi], rows["missing"][j, lo:hi]
        kept = values[~missing]
        if name in CATS and (kept.size == 0 or int(kept.max()) <= 0xFFFFFFFF):
            kept = kept.astype(np.uint32)
        frame = pl.DataFrame({"value": kept}).group_by("value").len("count")
        stats.add_counts(name, frame, int(missing.sum()))
    return stats


def _cuts(rng: np.random.Generator, lo: int, hi: int, most: int) -> list[int]:
    """Sorted random cut points of ``[lo, hi)`` into at most ``most`` pieces (some empty)."""
    inner = rng.integers(lo, hi + 1, rng.integers(0, most))
    return [lo, *sorted(inner.tolist()), hi]


def _merge_tree(rng: np.random.Generator, parts: list[FitStats]) -> FitStats:
    """Merge ``parts`` by repeatedly merging two random ones (a random tree and order)."""
    parts = list(parts)
    while len(parts) > 1:
        i, j = rng.choice(len(parts), 2, replace=False)
        merged = parts[i].merge(parts[j])
        parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [merged]
    return parts[0]


def _fitted(stats: FitStats, **params) -> FeaturePipeline:
    pipe = FeaturePipeline(categorical_fields=CATS, numeric_fields=NUMS, **params)
    return pipe.fit_stats(stats)


def _assert_same_state(a: FeaturePipeline, b: FeaturePipeline) -> None:
    assert a.to_dict() == b.to_dict()  # numeric statistics, bucket edges, vocabulary sizes
    for name in CATS:
        assert a.vocab_[name].dtypes == b.vocab_[name].dtypes
        assert a.vocab_[name].equals(b.vocab_[name])  # each kept value, its count and its id


@pytest.mark.parametrize("seed", range(6))
def test_any_partition_into_files_and_chunks_fits_the_single_process_state(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(500, 4000))
    rows = _rows(rng, n)
    whole = _count(rows, 0, n)
    files = _cuts(rng, 0, n, 8)
    partials = []
    for lo, hi in zip(files[:-1], files[1:], strict=True):
        chunks = _cuts(rng, lo, hi, 6)
        per_file = FitStats(CATS, NUMS)
        for c_lo, c_hi in zip(chunks[:-1], chunks[1:], strict=True):
            per_file.merge(_count(rows, c_lo, c_hi))
        partials.append(FitStats.from_bytes(per_file.to_bytes()))  # as a task sends it
    merged = _merge_tree(rng, partials)
    assert merged.rows == whole.rows and merged.nulls == whole.nulls
    params = {
        "min_count": int(rng.integers(1, 4)),
        "max_vocab": int(rng.choice([0, 5, 30])),
        "hash_buckets": 7,
        "numeric_buckets": int(rng.choice([0, 4, 10])),
    }
    _assert_same_state(_fitted(merged, **params), _fitted(whole, **params))


def test_merge_is_commutative_and_associative():
    rng = np.random.default_rng(7)
    rows = _rows(rng, 3000)
    a, b, c = (_count(rows, lo, hi) for lo, hi in [(0, 900), (900, 2100), (2100, 3000)])

    def copy(s: FitStats) -> FitStats:
        return FitStats.from_bytes(s.to_bytes())

    left = copy(a).merge(copy(b)).merge(copy(c))
    right = copy(c).merge(copy(b).merge(copy(a)))
    for name in CATS + NUMS:
        assert left.counts(name).sort("value").equals(right.counts(name).sort("value"))
    assert (left.rows, left.nulls) == (right.rows, right.nulls)


def test_thresholds_apply_after_the_merge():
    # a value below min_count in every file but above it in total is kept
    stats = FitStats(["c"], [])
    for _ in range(3):
        part = FitStats(["c"], [])
        part.add_rows(2)
        counts = pl.DataFrame(
            {"value": [7, 8], "count": [1, 1]}, schema={"value": pl.UInt32, "count": pl.UInt64}
        )
        part.add_counts("c", counts, 0)
        stats.merge(FitStats.from_bytes(part.to_bytes()))
    pipe = FeaturePipeline(min_count=3, categorical_fields=["c"], numeric_fields=[])
    assert pipe.fit_stats(stats).vocab_["c"]["value"].to_list() == [7, 8]


def test_bytes_round_trip_and_bad_bytes():
    rows = _rows(np.random.default_rng(3), 200)
    stats = _count(rows, 0, 200)
    back = FitStats.from_bytes(stats.to_bytes())
    assert back.to_bytes() == stats.to_bytes()
    with pytest.raises(ValueError, match="not fit statistics"):
        FitStats.from_bytes(stats.to_bytes()[:50])
    with pytest.raises(ValueError, match="other fields"):
        stats.merge(FitStats(["x"], []))
