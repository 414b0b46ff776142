"""The feature pipeline through the one route that uses it (``prepare`` of files): vocabulary
ids, numeric transforms and buckets, checked against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.core.ids import MISSING_ID, NUM_RESERVED, OOV_ID, PAD_ID
from ctrcal.data.feature_map import FeatureMap
from ctrcal.preparation.features import FeaturePipeline, resolve_numeric_transform
from ctrcal.preparation.fit_stats import FitStats

# a team's CSV with one numeric and one categorical column (label, x, c)
SCHEMA = {"name": "tiny", "label": "y", "numeric": ["x"], "categorical": ["c"]}
SCHEMA |= {"delimiter": ",", "header": False, "columns": ["y", "x", "c"]}


def _write(path, xs, cs):
    """One row per value; None is an empty (missing) field; labels alternate 0/1."""
    text = "".join(
        f"{i % 2},{'' if x is None else repr(float(x))},{'' if c is None else c}\n"
        for i, (x, c) in enumerate(zip(xs, cs, strict=True))
    )
    path.write_text(text)
    return path


def _prepare(tmp_path, train, test, **features):
    """Prepare explicit train / valid / test files: ``train`` and ``test`` are (xs, cs); valid
    is train's first row. Returns the feature map and the encoded test split."""
    xs, cs = train
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = {
        "train": [_write(tmp_path / "train.csv", xs, cs)],
        "valid": [_write(tmp_path / "valid.csv", xs[:1], cs[:1])],
        "test": [_write(tmp_path / "test.csv", *test)],
    }
    cfg = Config()
    cfg.data.schema = dict(SCHEMA)
    cfg.features.min_count = features.pop("min_count", 1)
    for key, value in features.items():
        setattr(cfg.features, key, value)
    out = prepare(paths, tmp_path / "p", cfg).out_dir
    fmap = FeatureMap.load(out)
    # what serving reloads from the prepared directory is the state prepare saved
    assert FeaturePipeline.load(out).to_dict()["features"] == fmap.extra["features"]
    return fmap, pl.read_parquet(out / "test")


def test_id_layout_by_frequency_and_min_count(tmp_path):
    # e 4x -> 3, a 3x -> 4, b 2x -> 5; d 1x is under min_count: out of vocabulary
    train = ([1.0] * 11, ["e", "e", "e", "e", "a", "a", "a", "b", "b", "d", None])
    test = ([1.0] * 6, ["a", "b", "e", "d", None, "zz"])
    fmap, out = _prepare(tmp_path, train, test, min_count=2)
    r = NUM_RESERVED
    assert out["c"].to_list() == [r + 1, r + 2, r, OOV_ID, MISSING_ID, OOV_ID]
    assert fmap.vocab_sizes == [r + 3]
    assert PAD_ID not in out["c"].to_list()
    assert out.schema["c"] == pl.Int32


def test_log_standardize_stats_in_model_space(tmp_path):
    rng = np.random.default_rng(0)
    x = np.floor(np.expm1(rng.normal(2, 1.5, 2000)))
    x[:10] = -2
    vals = [None if i % 5 == 0 else float(v) for i, v in enumerate(x)]
    rows = (vals, ["a"] * len(vals))
    fmap, out = _prepare(tmp_path, rows, rows, numeric_transform="log_standardize")
    z = out["x"]
    assert z.null_count() == sum(v is None for v in vals)  # missing stays missing
    t = np.array([v for v in vals if v is not None])
    t = np.sign(t) * np.log1p(np.abs(t))
    expected = (t - t.mean()) / t.std()
    np.testing.assert_allclose(z.drop_nulls().to_numpy(), expected, rtol=1e-5, atol=1e-5)
    assert math.isclose(fmap.numeric_std[0], 1.0, abs_tol=1e-4)
    assert math.isclose(fmap.numeric_missing_rate[0], 0.2, abs_tol=1e-9)


def test_identity_and_standardize(tmp_path):
    train = ([0.1, 0.2, 0.3, None], ["a", "b", "c", "d"])
    fmap, out = _prepare(tmp_path / "i", train, train, numeric_transform="identity")
    assert out["x"].to_list()[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert fmap.numeric_std[0] == pytest.approx(np.std([0.1, 0.2, 0.3]), rel=1e-5)
    fmap, out = _prepare(tmp_path / "s", train, train, numeric_transform="standardize")
    assert fmap.numeric_std[0] == pytest.approx(1.0, rel=1e-5)
    v = np.array([0.1, 0.2, 0.3])
    assert out["x"].to_list()[:3] == pytest.approx((v - v.mean()) / v.std(), rel=1e-5)
    assert resolve_numeric_transform("auto", "x1") == "identity"
    assert resolve_numeric_transform("auto", "dac") == "log_standardize"
    with pytest.raises(DataError):
        resolve_numeric_transform("boxcox", "dac")


def test_constant_column_does_not_divide_by_zero(tmp_path):
    rows = ([3.0, 3.0], ["a", "a"])
    fmap, out = _prepare(tmp_path, rows, rows, numeric_transform="log_standardize")
    assert out["x"].to_list() == [0.0, 0.0]
    assert fmap.numeric_std == [0.0]


def test_buckets_are_quantiles(tmp_path):
    train = ([float(i) for i in range(1000)], ["a"] * 1000)
    fmap, _ = _prepare(tmp_path, train, train, numeric_buckets=4, numeric_transform="identity")
    (bounds,) = fmap.bucket_boundaries
    assert bounds == pytest.approx([249.75, 499.5, 749.25], rel=1e-3)


def test_errors():
    with pytest.raises(DataError, match="empty"):
        FeaturePipeline(categorical_fields=["c"], numeric_fields=["x"]).fit_stats(
            FitStats(["c"], ["x"])
        )
    with pytest.raises(DataError, match="max_vocab"):
        FeaturePipeline(max_vocab=-1).fit_stats(FitStats([], []))
    with pytest.raises(DataError, match="no feature map"):
        FeatureMap.load("/nonexistent/dir")
