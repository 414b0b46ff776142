"""The shift registry and its shifts: statistics, determinism, pairing, no mutation, domains."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError, DataError
from ctrcal.core.ids import NUM_RESERVED
from ctrcal.shifts.builtin import CategoricalCorruption, GaussianNumericShift, TemporalShift
from ctrcal.shifts.registry import (
    available_shifts,
    check_shift_spec,
    create_shift,
    get_shift,
    register_shift,
)

VOCAB = [NUM_RESERVED + 50, NUM_RESERVED + 7, NUM_RESERVED + 1, NUM_RESERVED]  # last: none kept
RAW_STD = [3.0, 40.0, 0.5]


class _SignLogCodec:
    """An invertible sign-log + standardise transform, as a prepared feature map stores it."""

    has_original_stats = True

    def __init__(self, center, scale, original_std):
        self.center = torch.tensor(center, dtype=torch.float64)
        self.scale = torch.tensor(scale, dtype=torch.float64)
        self.original_std = tuple(original_std)

    def to_original(self, z):
        t = z.double() * self.scale + self.center
        return (torch.sign(t) * torch.expm1(t.abs())).to(z.dtype)

    def to_model(self, x):
        t = torch.sign(x.double()) * torch.log1p(x.double().abs())
        return ((t - self.center) / self.scale).to(x.dtype)


@dataclass
class _FeatureMap:
    vocab_sizes: list
    numeric_std: list
    numeric_fields: list
    codec: object = None

    def numeric_codec(self):
        return self.codec


def _fm(with_original=True):
    codec = _SignLogCodec([1.0, 3.0, 0.2], [0.8, 1.5, 0.3], RAW_STD) if with_original else None
    return _FeatureMap(VOCAB, [1.0, 1.0, 1.0], ["I1", "I2", "I3"], codec)


def _batch(rows=20_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, v, (rows,), generator=g) for v in VOCAB], dim=1).to(
        torch.int64
    )
    num = torch.randn(rows, 3, generator=g)
    num[::17, 1] = float("nan")
    return Batch(cat, num, torch.randint(0, 2, (rows,), generator=g).float())


# ---------------------------------------------------------------------------------------------
# registry


def test_registry_names_defaults_and_domains():
    assert {"gaussian_numeric", "categorical_corruption", "temporal"} <= set(available_shifts())
    assert get_shift("Categorical-Corruption").name == "categorical_corruption"
    assert get_shift("categorical_corruption").default_intensities == (0.05, 0.1, 0.2, 0.4, 0.6)
    with pytest.raises(ConfigError, match="did you mean 'gaussian_numeric'"):
        get_shift("gausian_numeric")
    kind, grid, options, label = check_shift_spec({"name": "gaussian_numeric"}, "f: s")
    assert options == {"space": "original"} and label == "gaussian_numeric"
    assert grid == [0.0625, 0.125, 0.25, 0.5]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "categorical_corruption", "intensities": [0.2, 1.5]}, r"intensities\[1\].*<= 1"),
        ({"name": "gaussian_numeric", "intensities": [-0.1]}, r"intensities\[0\].*>= 0"),
        ({"name": "gaussian_numeric", "intensities": [float("nan")]}, "finite"),
        ({"name": "gaussian_numeric", "space": "raw"}, r"\.space.*'original', 'model'"),
        ({"name": "categorical_corruption", "space": "model"}, r"\.space.*no option"),
        ({"name": "temporal", "intensities": [0.5]}, "single level"),
        ({"name": "nope"}, r"f: s\.name: unknown shift 'nope'"),
        ({"name": "gaussian_numeric", "intensities": []}, "at least one"),
    ],
)
def test_bad_specs_name_the_key(spec, message):
    with pytest.raises(ConfigError, match=message):
        check_shift_spec(spec, "f: s")


def test_register_a_user_shift():
    class Flip:
        def __init__(self, fm, intensity, seed=0, mix_fraction=1.0):
            self.intensity = intensity

        def apply(self, batch):
            return batch, torch.ones(len(batch), dtype=torch.bool)

    register_shift("test_flip", Flip, default_intensities=[0.5], high=1.0, overwrite=True)
    shift = create_shift("test-flip", _fm(), intensity=0.25)
    assert isinstance(shift, Flip) and shift.intensity == 0.25
    with pytest.raises(ValueError, match="already registered"):
        register_shift("test_flip", Flip, default_intensities=[0.5])
    with pytest.raises(ConfigError, match="<= 1"):
        create_shift("test_flip", _fm(), intensity=2.0)


# ---------------------------------------------------------------------------------------------
# gaussian_numeric


@pytest.mark.parametrize("s", [0.0625, 0.25, 0.5])
def test_original_space_noise_has_std_s_sigma(s):
    fm, batch = _fm(), _batch()
    shift = create_shift("gaussian_numeric", fm, intensity=s, seed=3)
    assert isinstance(shift, GaussianNumericShift) and shift.space == "original"
    out = shift(batch)
    codec = fm.codec
    noise = codec.to_original(out.numeric).double() - codec.to_original(batch.numeric).double()
    for j, sigma in enumerate(RAW_STD):
        col = noise[:, j][torch.isfinite(noise[:, j])]
        realised = float(col.std())
        # 20k draws: the sample std is within ~1 % of the truth (5 standard errors here)
        assert realised == pytest.approx(s * sigma, rel=0.035), (j, realised)
        assert abs(float(col.mean())) < 5 * s * sigma / math.sqrt(col.numel())
    assert torch.isnan(out.numeric[::17, 1]).all()  # missing stays missing
    assert shift.describe() == {
        "space": "original",
        "model_std": [1.0, 1.0, 1.0],
        "original_std": RAW_STD,
    }


def test_original_space_round_trip_at_zero_reproduces_the_batch():
    batch = _batch(rows=5000)
    before = batch.numeric.clone()
    out = create_shift("gaussian_numeric", _fm(), intensity=0.0, seed=0)(batch)
    finite = torch.isfinite(before)
    assert torch.equal(torch.isfinite(out.numeric), finite)
    torch.testing.assert_close(out.numeric[finite], before[finite], rtol=2e-6, atol=2e-6)
    assert torch.equal(batch.numeric.nan_to_num(7.0), before.nan_to_num(7.0))  # untouched


def test_model_space_noise_and_missing_original_statistics():
    batch = _batch()
    shift = create_shift({"name": "gaussian_numeric", "space": "model"}, _fm(), intensity=0.25)
    delta = (shift(batch).numeric - batch.numeric)[:, 0]
    assert float(delta.std()) == pytest.approx(0.25, rel=0.035)
    assert shift.describe()["original_std"] is None
    with pytest.raises(DataError, match="no original-space numeric statistics.*space: model"):
        create_shift("gaussian_numeric", _fm(with_original=False), intensity=0.25)


def test_gaussian_is_deterministic_paired_and_proportional():
    batch = _batch(rows=3000)
    a = create_shift("gaussian_numeric", _fm(), intensity=0.25, seed=5)
    b = create_shift("gaussian_numeric", _fm(), intensity=0.25, seed=5)
    first = a(batch).numeric
    torch.testing.assert_close(first, b(batch).numeric, equal_nan=True)
    assert not torch.equal(first.nan_to_num(), a(batch).numeric.nan_to_num())  # stream moves on
    torch.testing.assert_close(a.reset()(batch).numeric, first, equal_nan=True)
    other = create_shift("gaussian_numeric", _fm(), intensity=0.25, seed=6)(batch).numeric
    assert not torch.equal(first.nan_to_num(), other.nan_to_num())
    # same seed, other intensity: the same draws scaled (model space: exactly proportional)
    m1 = create_shift({"name": "gaussian_numeric", "space": "model"}, _fm(), intensity=0.1, seed=2)
    m4 = create_shift({"name": "gaussian_numeric", "space": "model"}, _fm(), intensity=0.4, seed=2)
    d1 = (m1(batch).numeric - batch.numeric)[:, 0]
    d4 = (m4(batch).numeric - batch.numeric)[:, 0]
    torch.testing.assert_close(d4, 4 * d1, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# categorical_corruption


@pytest.mark.parametrize("p", [0.05, 0.2, 0.6])
def test_categorical_replacement_rate_per_field(p):
    batch = _batch(rows=40_000)
    before = batch.categorical.clone()
    shift = create_shift("categorical_corruption", _fm(), intensity=p, seed=1)
    assert isinstance(shift, CategoricalCorruption)
    out = shift(batch)
    assert torch.equal(batch.categorical, before)  # input untouched
    assert out.numeric is batch.numeric and out.label is batch.label  # numerics untouched
    changed = (out.categorical != before).double().mean(dim=0)
    for f, v in enumerate(VOCAB):
        kept = v - NUM_RESERVED
        if kept == 0:
            assert changed[f] == 0  # nothing to draw from: the field stays as it is
            continue
        # a replacement draws the original id again with probability P(orig kept) / kept
        p_same = float(((before[:, f] >= NUM_RESERVED).double().mean()) / kept)
        expected = p * (1.0 - p_same)
        se = math.sqrt(expected * (1 - expected) / before.shape[0])
        assert abs(float(changed[f]) - expected) < 5 * se + 1e-12, (f, float(changed[f]))
        new = out.categorical[:, f][out.categorical[:, f] != before[:, f]]
        assert bool(((new >= NUM_RESERVED) & (new < v)).all())  # kept ids of that field


def test_categorical_is_deterministic_and_mixes_rows():
    batch = _batch(rows=2000)
    a = create_shift("categorical_corruption", _fm(), intensity=0.4, seed=9)(batch)
    b = create_shift("categorical_corruption", _fm(), intensity=0.4, seed=9)(batch)
    assert torch.equal(a.categorical, b.categorical)
    half = CategoricalCorruption(VOCAB, 0.6, seed=9, mix_fraction=0.25)
    out, rows = half.apply(batch)
    assert int(rows.sum()) == 500
    assert torch.equal(out.categorical[~rows], batch.categorical[~rows])
    assert not torch.equal(out.categorical[rows], batch.categorical[rows])
    with pytest.raises(ValueError, match="probability"):
        CategoricalCorruption(VOCAB, 1.5)


def test_temporal_leaves_the_batch_alone():
    batch = _batch(rows=10)
    shift = create_shift("temporal", _fm(), intensity=1.0)
    assert isinstance(shift, TemporalShift)
    out, rows = shift.apply(batch)
    assert out is batch and bool(rows.all())
