"""ValueIndex: the vectorised value -> id table of the categorical encoding."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrcal.preparation.lookup import ValueIndex


def _reference(values, ids, queries, default):
    table = dict(zip(np.asarray(values).tolist(), np.asarray(ids).tolist(), strict=True))
    return np.array([table.get(q, default) for q in np.asarray(queries).tolist()], dtype=np.int32)


@pytest.mark.parametrize("size", [0, 1, 7, 1_000, 70_000])
def test_matches_a_dict_on_hashes(size):
    rng = np.random.default_rng(size)
    values = np.unique(rng.integers(0, 2**32, 2 * size + 8, dtype=np.uint64))[:size]
    values = rng.permutation(values).astype(np.uint32)
    ids = rng.integers(3, 2**31 - 1, size).astype(np.int32)
    absent = rng.integers(0, 2**32, 500, dtype=np.uint64).astype(np.uint32)
    pool = np.concatenate([values, absent])
    queries = pool[rng.zipf(1.3, 20_000) % len(pool)]
    got = ValueIndex(values, ids).lookup(queries, default=2)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _reference(values, ids, queries, 2))


def test_agrees_with_polars_replace_strict():
    rng = np.random.default_rng(0)
    values = np.unique(rng.integers(0, 2**32, 5_000, dtype=np.uint64)).astype(np.uint32)
    ids = np.arange(3, 3 + len(values), dtype=np.int32)
    queries = rng.choice(np.concatenate([values, np.arange(100, dtype=np.uint32)]), 50_000)
    want = pl.Series(queries).replace_strict(
        pl.Series(values), pl.Series(ids), default=2, return_dtype=pl.Int32
    )
    np.testing.assert_array_equal(ValueIndex(values, ids).lookup(queries, 2), want.to_numpy())


@pytest.mark.parametrize(
    "values",
    [
        np.arange(50_000),
        np.arange(1, 4_000, dtype=np.uint64) << np.uint64(40),
        np.array([-5, 0, 2**62, -(2**63)]),
    ],
    ids=["consecutive", "shared-low-bits", "signed"],
)
def test_clustered_and_signed_values(values):
    ids = np.arange(len(values), dtype=np.int32) + 3
    index = ValueIndex(values, ids)
    assert len(index) == len(values)
    np.testing.assert_array_equal(index.lookup(values, -1), ids)
    absent = np.array([7_000_000, -1, 2**40 + 1], dtype=np.int64)
    assert index.lookup(absent, -1).tolist() == [-1, -1, -1]


def test_narrow_keys_against_wide_queries_and_skipped_rows():
    index = ValueIndex(np.array([0, 5, 9], dtype=np.uint32), np.array([3, 4, 5]))
    queries = np.array([-1, 5, 2**32 + 5, 9, 0], dtype=np.int64)
    assert index.lookup(queries, 2).tolist() == [2, 4, 2, 5, 3]
    skip = np.array([False, False, False, True, False])
    got = index.lookup(queries.astype(np.uint64) % 2**32, 2, skip=skip)
    assert got[[0, 1, 2, 4]].tolist() == [2, 4, 4, 3]  # a skipped row's result is unspecified


def test_bad_arguments():
    with pytest.raises(TypeError, match="integers"):
        ValueIndex(np.array([1.5]), np.array([3]))
    with pytest.raises(ValueError, match="1-d"):
        ValueIndex(np.array([1, 2]), np.array([3]))
    with pytest.raises(ValueError, match="non-negative"):
        ValueIndex(np.array([1]), np.array([-3]))


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.int64])
def test_dense_small_values_and_the_empty_slot_key(dtype):
    # 0..K-1 stored: empty slots hold K, the smallest free key; K and 0 must still resolve
    size = 600
    values = np.arange(size, dtype=dtype)
    ids = np.arange(size, dtype=np.int32)[::-1].copy() + 3
    index = ValueIndex(values[::-1].copy(), ids[::-1].copy())
    queries = np.array([size, 0, size + 1, size - 1, *range(0, 3 * size, 7)], dtype=dtype)
    np.testing.assert_array_equal(index.lookup(queries, 2), _reference(values, ids, queries, 2))
    skip = np.zeros(queries.size, dtype=bool)
    skip[::3] = True
    got = index.lookup(queries, 2, skip=skip)
    np.testing.assert_array_equal(got[~skip], _reference(values, ids, queries, 2)[~skip])
