"""The invertible numeric transform and the original-space statistics in the feature map."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE, FeatureMap
from ctrcal.data.numeric import NumericTransform
from ctrcal.shifts.builtin import original_space_codec


def _train(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    a = np.floor(np.expm1(rng.normal(2.0, 1.5, n)))
    b = np.floor(np.expm1(rng.normal(5.0, 2.0, n))) - 1.0  # can be -1, like I2
    a[::7] = np.nan
    return pl.DataFrame(
        {
            "label": pl.Series(np.zeros(n), dtype=pl.Float32),
            "I1": pl.Series(a).fill_nan(None),
            "I2": pl.Series(b),
            "C1": pl.Series(np.ones(n, dtype=np.uint32)),
        }
    )


def _prepared(tmp_path, transform, train):
    """Prepare ``train``'s rows as a CSV (the train and test splits; valid: its first row)
    with ``transform``: the feature map and the encoded test split."""
    schema = {"name": "nums", "label": "label", "numeric": ["I1", "I2"], "categorical": ["C1"]}
    schema |= {"delimiter": ",", "header": True, "columns": ["label", "I1", "I2", "C1"]}
    tmp_path.mkdir(parents=True, exist_ok=True)
    train.write_csv(tmp_path / "train.csv")
    train.head(1).write_csv(tmp_path / "valid.csv")
    train.write_csv(tmp_path / "test.csv")  # the train rows again, in a file of their own
    paths = {s: [tmp_path / f"{s}.csv"] for s in ("train", "valid", "test")}
    cfg = Config()
    cfg.data.schema = schema
    cfg.features.min_count = 1
    cfg.features.numeric_transform = transform
    out = prepare(paths, tmp_path / "p", cfg).out_dir
    return out, FeatureMap.load(out), pl.read_parquet(out / "test")


@pytest.mark.parametrize("transform", ["log_standardize", "standardize", "identity"])
def test_round_trip_and_original_stats(transform, tmp_path):
    train = _train()
    _, fmap, encoded = _prepared(tmp_path, transform, train)
    codec = fmap.numeric_codec()
    z = torch.from_numpy(encoded.select("I1", "I2").to_numpy()).float()
    before = z.clone()
    x = codec.to_original(z)
    assert torch.equal(z.nan_to_num(), before.nan_to_num())  # input untouched
    # the inverse recovers the raw values of the file (up to float32)
    raw = torch.from_numpy(train.select("I1", "I2").to_numpy()).float()
    assert torch.equal(x.isnan(), raw.isnan())
    # z is stored in float32: its rounding, carried back through the transform, is the bound
    scale = torch.tensor(codec.scale, dtype=torch.float64)
    zd, xd, rd = z.double(), x.double(), raw.double()
    dz = 2.4e-7 * (zd.abs() + 1.0)
    slope = scale * (rd.abs() + 1.0 if transform == "log_standardize" else 1.0)
    bound = slope * dz + 2.4e-7 * rd.abs()
    assert bool(((xd - rd).abs() <= bound).logical_or(rd.isnan()).all())
    back = codec.to_model(x)
    torch.testing.assert_close(back, z, rtol=0, atol=4e-7, equal_nan=True)
    assert back.dtype == z.dtype
    # original-space statistics are those of the raw train values (missing excluded)
    mean, std = codec.original_mean, codec.original_std
    for j, name in enumerate(["I1", "I2"]):
        v = train[name].drop_nulls().to_numpy()
        assert mean[j] == pytest.approx(v.mean(), rel=1e-12)
        assert std[j] == pytest.approx(v.std(), rel=1e-12)
    # ... and model-space ones still those of z
    assert codec.model_std[0] == pytest.approx(float(np.nanstd(z[:, 0].numpy())), rel=1e-4)


def test_noise_added_in_original_space_survives_the_round_trip(tmp_path):
    codec = _prepared(tmp_path, "log_standardize", _train())[1].numeric_codec()
    std = codec.original_std
    x = codec.to_original(torch.linspace(-2, 2, 2000).reshape(1000, 2)).double()
    gen = torch.Generator().manual_seed(0)
    noise = (
        0.25
        * torch.tensor(std, dtype=torch.float64)
        * torch.randn(1000, 2, generator=gen, dtype=torch.float64)
    )
    shifted = codec.to_original(codec.to_model(x + noise))
    # what comes back is x + noise, up to float32 rounding of the model-space value
    torch.testing.assert_close(shifted.double(), x + noise, rtol=3e-6, atol=1e-6)


def test_never_mutates_and_keeps_device_and_dtype():
    codec = NumericTransform("log_standardize", (1.0, -2.0), (2.0, 0.5))
    z = torch.tensor([[0.5, float("nan")], [-3.0, 1.0]], dtype=torch.float64)
    copy = z.clone()
    out = codec.to_model(codec.to_original(z))
    assert torch.equal(z.nan_to_num(7.0), copy.nan_to_num(7.0))
    assert out.dtype == torch.float64 and out.device == z.device
    assert out[0, 1].isnan()
    torch.testing.assert_close(out, z, equal_nan=True)
    with pytest.raises(ValueError, match=r"\[\.\.\., 2\]"):
        codec.to_model(torch.zeros(3, 5))


def test_old_feature_map_says_it_lacks_original_stats(tmp_path):
    out = _prepared(tmp_path, "log_standardize", _train(500))[0]
    data = json.loads((out / FEATURE_MAP_FILE).read_text())
    for f in data["features"]:
        f.pop("original_mean", None)
        f.pop("original_std", None)
    (out / FEATURE_MAP_FILE).write_text(json.dumps(data))
    codec = FeatureMap.load(out).numeric_codec()
    assert not codec.has_original_stats
    # the transform itself is still invertible
    z = torch.tensor([[0.3, -0.2]])
    torch.testing.assert_close(codec.to_model(codec.to_original(z)), z)
    with pytest.raises(DataError, match="prepare the data again"):
        original_space_codec(FeatureMap.load(out))
