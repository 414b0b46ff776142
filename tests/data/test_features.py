"""FeaturePipeline: vocabulary ids, numeric transforms, buckets, save/load."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FeatureMap
from ctrcal.data.features import (
    MISSING_ID,
    NUM_RESERVED,
    OOV_ID,
    PAD_ID,
    FeaturePipeline,
    resolve_numeric_transform,
)


def _frame(cats, nums, labels=None):
    n = len(cats)
    return pl.DataFrame(
        {
            "label": pl.Series(labels or [0.0] * n, dtype=pl.Float32),
            "I1": pl.Series(nums, dtype=pl.Float64),
            "C1": pl.Series(cats, dtype=pl.UInt32),
        }
    )


def _pipe(**kw):
    return FeaturePipeline(categorical_fields=["C1"], numeric_fields=["I1"], **kw)


def test_id_layout_by_frequency_and_min_count():
    train = _frame([7, 7, 7, 5, 5, 9, None, 3, 3], [1.0] * 9)
    pipe = _pipe(min_count=2).fit(train)
    out = pipe.transform(_frame([7, 5, 3, 9, None, 42], [1.0] * 6)).collect()
    # 7 (3x) -> 3; 3 and 5 (2x) tie, ordered by value -> 4, 5; 9 (1x) -> OOV
    assert out["C1"].to_list() == [NUM_RESERVED, NUM_RESERVED + 2, NUM_RESERVED + 1,
                                   OOV_ID, MISSING_ID, OOV_ID]  # fmt: skip
    assert pipe.vocab_sizes_ == [NUM_RESERVED + 3]
    assert PAD_ID not in out["C1"].to_list()
    assert out.schema["C1"] == pl.Int32


def test_log_standardize_stats_in_model_space():
    rng = np.random.default_rng(0)
    x = np.floor(np.expm1(rng.normal(2, 1.5, 5000)))
    x[:10] = -2
    vals = [None if i % 5 == 0 else float(v) for i, v in enumerate(x)]
    train = _frame([1] * len(vals), vals)
    pipe = _pipe().fit(train)
    z = pipe.transform(train).collect()["I1"]
    assert z.null_count() == sum(v is None for v in vals)  # missing stays missing
    t = np.array([v for v in vals if v is not None])
    t = np.sign(t) * np.log1p(np.abs(t))
    expected = (t - t.mean()) / t.std()
    np.testing.assert_allclose(z.drop_nulls().to_numpy(), expected, rtol=1e-5, atol=1e-5)
    fm = pipe.feature_map()
    assert math.isclose(fm.numeric_std[0], 1.0, abs_tol=1e-4)
    assert math.isclose(fm.numeric_missing_rate[0], 0.2, abs_tol=1e-9)


def test_identity_and_standardize():
    train = _frame([1, 2, 3, 4], [0.1, 0.2, 0.3, None])
    ident = _pipe(numeric_transform="identity").fit(train)
    assert ident.transform(train).collect()["I1"].to_list()[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert ident.feature_map().numeric_std[0] == pytest.approx(np.std([0.1, 0.2, 0.3]), rel=1e-5)
    std = _pipe(numeric_transform="standardize").fit(train)
    assert std.feature_map().numeric_std[0] == pytest.approx(1.0, rel=1e-5)
    assert resolve_numeric_transform("auto", "x1") == "identity"
    assert resolve_numeric_transform("auto", "dac") == "log_standardize"
    with pytest.raises(DataError):
        resolve_numeric_transform("boxcox", "dac")


def test_constant_column_does_not_divide_by_zero():
    train = _frame([1, 1], [3.0, 3.0])
    pipe = _pipe().fit(train)
    assert pipe.transform(train).collect()["I1"].to_list() == [0.0, 0.0]
    assert pipe.feature_map().numeric_std == [0.0]


def test_buckets_are_quantiles():
    train = _frame([1] * 1000, [float(i) for i in range(1000)])
    pipe = _pipe(numeric_buckets=4, numeric_transform="identity").fit(train)
    (bounds,) = pipe.feature_map().bucket_boundaries
    assert bounds == pytest.approx([249.75, 499.5, 749.25], rel=1e-3)


def test_save_load_roundtrip(tmp_path):
    train = _frame([7, 7, 5, 5, 9], [1.0, 2.0, None, 4.0, 5.0])
    pipe = _pipe(min_count=2, numeric_buckets=3).fit(train)
    pipe.save(tmp_path)
    back = FeaturePipeline.load(tmp_path)
    a = pipe.transform(train).collect()
    b = back.transform(train).collect()
    assert a.equals(b)
    fm = FeatureMap.load(tmp_path)
    assert fm.vocab_sizes == pipe.vocab_sizes_ and fm.bucket_boundaries is not None


def test_errors():
    with pytest.raises(DataError, match="not fitted"):
        _pipe().transform(_frame([1], [1.0]))
    with pytest.raises(DataError, match="empty"):
        _pipe().fit(_frame([], []))
    with pytest.raises(DataError, match="no feature map"):
        FeatureMap.load("/nonexistent/dir")
