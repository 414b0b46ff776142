"""GaussianShift: noise statistics, determinism, NaN handling, no mutation, Mix rows."""

from __future__ import annotations

import math

import pytest
import torch

from ctrcal import metrics as M
from ctrcal.shifts.builtin import PAPER_INTENSITIES, GaussianShift

STD = [1.0, 0.5, 2.0, 0.0, 3.0]


def _numeric(rows: int = 20_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, len(STD), generator=g) * torch.tensor(STD) + 1.0
    x[::7, 1] = float("nan")  # missing values
    return x


@pytest.mark.parametrize("intensity", PAPER_INTENSITIES)
def test_realised_noise_std_matches(intensity):
    x = _numeric()
    delta = GaussianShift(STD, intensity, seed=1)(x) - x
    for j, s in enumerate(STD):
        col = delta[:, j]
        col = col[~col.isnan()].double()
        target = intensity * s
        if target == 0:
            assert torch.all(col == 0)
            continue
        # the sample std of m normal draws has standard error ≈ σ / sqrt(2m)
        tol = 5 * target / math.sqrt(2 * col.numel())
        assert abs(col.std().item() - target) < tol, (j, col.std().item(), target)
        assert abs(col.mean().item()) < 5 * target / math.sqrt(col.numel())


def test_noise_is_independent_standard_gaussian_and_additive():
    rows, s = 20_000, 0.5
    x = _numeric(rows)
    delta = (GaussianShift(STD, s, seed=2)(x) - x).double()
    # additive: the noise does not depend on the values it is added to
    noise = GaussianShift(STD, s, seed=2)(torch.zeros_like(x)).double()
    ok = ~x.isnan()
    torch.testing.assert_close(delta[ok], noise[ok], rtol=0, atol=1e-5)
    cols = [j for j, sd in enumerate(STD) if sd > 0]
    z = noise[:, cols] / (s * torch.tensor(STD, dtype=torch.float64)[cols])
    bound = 5 / math.sqrt(rows)  # 5 standard errors of a correlation near 0
    # independent across features and across neighbouring rows
    off_diagonal = torch.corrcoef(z.T) - torch.eye(len(cols), dtype=torch.float64)
    assert off_diagonal.abs().max() < bound
    assert (z[1:] * z[:-1]).mean(0).abs().max() < bound
    # Gaussian, not just the right std: the shares within 1 and 2 sigma, and the kurtosis
    for q, p in ((1.0, 0.682689), (2.0, 0.954500)):
        share = (z.abs() < q).double().mean(0)
        assert ((share - p).abs() < 5 * math.sqrt(p * (1 - p) / rows)).all(), (q, share)
    kurtosis = z.pow(4).mean(0)  # 3 for a standard normal; its standard error is sqrt(96/n)
    assert ((kurtosis - 3).abs() < 5 * math.sqrt(96 / rows)).all(), kurtosis


def test_zero_intensity_is_identity():
    x = _numeric(100)
    out = GaussianShift(STD, 0.0, seed=0)(x)
    assert torch.equal(out.nan_to_num(-9), x.nan_to_num(-9))


def test_nan_stays_nan_and_nothing_else_becomes_nan():
    x = _numeric(1000)
    out = GaussianShift(STD, 0.5, seed=0)(x)
    assert torch.equal(out.isnan(), x.isnan())


def test_input_not_mutated():
    x = _numeric(1000)
    before = x.clone()
    shift = GaussianShift(STD, 0.5, seed=0)
    out, _ = shift.apply(x)
    assert torch.equal(x.nan_to_num(-9), before.nan_to_num(-9))
    assert out.data_ptr() != x.data_ptr()


def test_deterministic_by_seed_and_stream_advances():
    x = _numeric(500)
    a1, a2 = GaussianShift(STD, 0.25, seed=7), GaussianShift(STD, 0.25, seed=7)
    first = a1(x)
    assert torch.equal(first.nan_to_num(), a2(x).nan_to_num())
    second = a1(x)  # next batch: new noise from the same stream
    assert not torch.equal(first.nan_to_num(), second.nan_to_num())
    a1.reset()
    assert torch.equal(a1(x).nan_to_num(), first.nan_to_num())
    other = GaussianShift(STD, 0.25, seed=8)(x)
    assert not torch.equal(other.nan_to_num(), first.nan_to_num())


def test_intensities_share_the_noise():
    x = _numeric(500)
    d1 = GaussianShift(STD, 0.125, seed=3)(x) - x
    d2 = GaussianShift(STD, 0.5, seed=3)(x) - x
    torch.testing.assert_close(d2.nan_to_num(), 4 * d1.nan_to_num(), rtol=1e-5, atol=1e-5)


def test_mix_fraction_shifts_exactly_that_many_rows():
    x = _numeric(1000)
    out, rows = GaussianShift(STD, 0.5, seed=0, mix_fraction=0.3).apply(x)
    assert rows.dtype == torch.bool and int(rows.sum()) == 300
    changed = (out - x).nan_to_num().abs().sum(1) > 0
    assert torch.equal(changed, rows)
    full, rows_all = GaussianShift(STD, 0.5, seed=0).apply(x)
    assert bool(rows_all.all())
    none, rows_none = GaussianShift(STD, 0.5, seed=0, mix_fraction=0.0).apply(x)
    assert not bool(rows_none.any())
    assert torch.equal(none.nan_to_num(), x.nan_to_num())


def test_dtype_and_device_preserved():
    x = _numeric(64).double()
    out = GaussianShift(STD, 0.5, seed=0)(x)
    assert out.dtype == torch.float64 and out.device == x.device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor():
    x = _numeric(1000).cuda()
    out, rows = GaussianShift(STD, 0.5, seed=0, mix_fraction=0.5).apply(x)
    assert out.is_cuda and rows.is_cuda and int(rows.sum()) == 500


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"std": [1.0, -1.0], "intensity": 0.1}, "std"),
        ({"std": [1.0, float("nan")], "intensity": 0.1}, "std"),
        ({"std": [1.0], "intensity": -0.1}, "intensity"),
        ({"std": [1.0], "intensity": 0.1, "mix_fraction": 1.5}, "mix_fraction"),
        ({"std": [1.0], "intensity": 0.1, "seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GaussianShift(**kwargs)


def test_wrong_width_raises():
    with pytest.raises(ValueError, match="shape"):
        GaussianShift(STD, 0.1, seed=0)(torch.zeros(3, 2))


def test_from_feature_map_and_top_level_export():
    import ctrcal

    class FM:
        numeric_std = STD

    shift = ctrcal.GaussianShift.from_feature_map(FM(), 0.25, seed=0)
    assert shift.std.tolist() == STD


def test_shift_moves_predictions_of_a_trained_model():
    # a small model trained to use the numerics must react to shifted numerics
    torch.manual_seed(0)
    x = _numeric(4000).nan_to_num(0.0)
    g = torch.Generator().manual_seed(1)
    y = torch.bernoulli(torch.sigmoid(x[:, 0] + 0.5 * x[:, 2] - 1.5), generator=g)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(len(STD), 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        clean = model(x).sigmoid().squeeze(1)
        shifted = model(GaussianShift(STD, 0.5, seed=0)(x)).sigmoid().squeeze(1)
    assert (clean - shifted).abs().mean() > 0.01
    assert M.auc(shifted, y) < M.auc(clean, y)
