"""End-to-end: synthetic data -> prepared directory -> batches."""

from __future__ import annotations

import json

import numpy as np

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, NUMERIC_COLUMNS
from ctrcal.data.feature_map import FeatureMap, load_feature_map
from ctrcal.data.loader import ParquetCTRData


def test_prepared_dir_contract(prepared_dir):
    fm = FeatureMap.load(prepared_dir)
    assert fm.categorical_fields == list(CATEGORICAL_COLUMNS)
    assert fm.numeric_fields == list(NUMERIC_COLUMNS)
    assert len(fm.vocab_sizes) == len(CATEGORICAL_COLUMNS)
    assert all(v >= 3 for v in fm.vocab_sizes)
    np.testing.assert_allclose(fm.numeric_std, 1.0, atol=1e-3)
    np.testing.assert_allclose(fm.numeric_mean, 0.0, atol=1e-3)
    assert fm.bucket_boundaries is None
    assert load_feature_map(prepared_dir).vocab_sizes == fm.vocab_sizes
    raw = json.loads((prepared_dir / "feature_map.json").read_text())
    assert raw["complete"] and raw["oracle"]["test"]["auc"] > 0.7
    for split in ("train", "valid", "test"):
        assert list((prepared_dir / split).glob("*.parquet"))


def test_batches_cover_split(prepared_dir):
    data = ParquetCTRData(prepared_dir, "valid")
    fm = data.feature_map
    seen = 0
    for batch in data.batches(512, shuffle=True, seed=0):
        assert batch.categorical.dtype.is_floating_point is False
        assert batch.categorical.shape[1] == len(fm.categorical_fields)
        assert batch.numeric.shape[1] == len(fm.numeric_fields)
        seen += len(batch)
    assert seen == len(data)
    whole = data.all()
    assert len(whole) == len(data)
    assert whole.numeric.isnan().any()  # missing numerics are NaN
    sizes = np.array(fm.vocab_sizes)
    assert (whole.categorical.numpy() < sizes).all()
    assert (whole.categorical.numpy() >= 1).all()  # 0 is padding, never data
