"""ctrcal.metrics against sklearn, torchmetrics and hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from ctrcal import metrics as M


def _ctr_like(n: int, seed: int, decimals: int | None = 3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    p = rng.beta(1.0, 15.0, n)
    if decimals is not None:
        p = np.round(p, decimals)  # many ties
    y = (rng.random(n) < np.clip(1.2 * p, 0, 1)).astype(np.float64)
    return p.astype(dtype), y


# --------------------------------------------------------------------------- AUC


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("decimals", [None, 3, 1])
def test_auc_matches_sklearn_with_ties(seed, decimals):
    p, y = _ctr_like(5000, seed, decimals)
    assert M.auc(p, y) == pytest.approx(roc_auc_score(y, p), abs=1e-12)


def test_auc_hand_computed():
    # pairs (pos, neg): (0.8>0.3), (0.8>0.5), (0.5=0.5 -> ½), (0.5>0.3) -> 3.5 / 4
    assert M.auc([0.8, 0.5, 0.5, 0.3], [1, 1, 0, 0]) == pytest.approx(0.875)
    assert M.auc([0.1, 0.9], [0, 1]) == 1.0
    assert M.auc([0.1, 0.9], [1, 0]) == 0.0
    assert M.auc([0.4, 0.4, 0.4], [1, 0, 1]) == 0.5


def test_auc_accepts_any_score():
    z = np.array([-3.0, 2.0, 0.5, 0.5])
    y = np.array([0, 1, 1, 0])
    assert M.auc(z, y) == pytest.approx(roc_auc_score(y, z))
    with pytest.raises(ValueError, match="infinite"):
        M.auc([0.0, np.inf], [0, 1])


def test_auc_single_class_is_nan():
    assert math.isnan(M.auc([0.1, 0.2], [1, 1]))


def test_auc_float32_tensor_and_speed():
    p, y = _ctr_like(200_000, 3, 4, np.float32)
    got = M.auc(torch.from_numpy(p), torch.from_numpy(y).float())
    assert got == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert isinstance(got, float)


# --------------------------------------------------------------------------- logloss etc.


def test_logloss_brier_match_sklearn():
    p, y = _ctr_like(4000, 5, None)
    p = np.clip(p, 1e-4, 1 - 1e-4)
    assert M.logloss(p, y) == pytest.approx(log_loss(y, p), rel=1e-12)
    assert M.brier(p, y) == pytest.approx(brier_score_loss(y, p), rel=1e-12)


def test_logloss_clips_extremes():
    got = M.logloss([0.0, 1.0], [1, 0])
    assert got == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert math.isfinite(M.logloss([0.0, 1.0], [1, 0], eps=1e-15))


def test_hand_computed_small_case():
    p = np.array([0.1, 0.4, 0.2, 0.8])
    y = np.array([0, 1, 0, 1])
    expected_ll = -np.mean([math.log(0.9), math.log(0.4), math.log(0.8), math.log(0.8)])
    assert M.logloss(p, y) == pytest.approx(expected_ll)
    assert M.brier(p, y) == pytest.approx((0.01 + 0.36 + 0.04 + 0.04) / 4)
    assert M.pcoc(p, y) == pytest.approx(1.5 / 2)
    h = math.log(2.0)  # base rate 0.5
    assert M.normalized_entropy(p, y) == pytest.approx(expected_ll / h)


def test_pcoc_and_ne_degenerate():
    assert math.isnan(M.pcoc([0.1, 0.2], [0, 0]))
    assert math.isnan(M.normalized_entropy([0.1, 0.2], [0, 0]))
    p, y = _ctr_like(3000, 9, None)
    base = np.full_like(p, y.mean())
    assert M.normalized_entropy(base, y) == pytest.approx(1.0, rel=1e-9)


# --------------------------------------------------------------------------- ECE


def _torchmetrics_ece(p, y, n_bins=15):
    tm = pytest.importorskip("torchmetrics.classification")
    metric = tm.BinaryCalibrationError(n_bins=n_bins, norm="l1")
    return float(metric(torch.as_tensor(p), torch.as_tensor(y).long()))


@pytest.mark.parametrize("seed", [0, 1])
def test_ece_matches_torchmetrics_float64(seed):
    p, y = _ctr_like(20_000, seed, 3)
    # edge cases: exact bin boundaries, 0 and 1 (torchmetrics puts 1.0 in its own bin)
    p = np.concatenate([p, [0.0, 1.0, 1.0, 1 / 15, 2 / 15, 14 / 15, 0.5]])
    y = np.concatenate([y, [1, 0, 1, 0, 1, 1, 0]])
    assert M.ece(p, y) == pytest.approx(_torchmetrics_ece(p, y), abs=1e-12)
    assert M.ece(p, y, n_bins=7) == pytest.approx(_torchmetrics_ece(p, y, 7), abs=1e-12)


def test_ece_matches_torchmetrics_float32():
    p, y = _ctr_like(20_000, 4, 3, np.float32)
    p = np.concatenate([p, np.float32([1 / 15, 2 / 15, 1.0])])
    y = np.concatenate([y, [0, 1, 1]])
    # torchmetrics accumulates in float32; binning is identical
    assert M.ece(torch.from_numpy(p), y) == pytest.approx(_torchmetrics_ece(p, y), abs=1e-5)


def test_ece_bins_the_click_probability_not_top_label():
    # all predictions 0.1 with 10 % clicks: perfectly calibrated as a click probability
    p = np.full(100, 0.1)
    y = np.zeros(100)
    y[:10] = 1
    assert M.ece(p, y) == pytest.approx(0.0, abs=1e-12)
    # hand case: bins [0,.5) and [.5,1]: (0.1,0.2 | y 0,1) and (0.9 | y 0)
    got = M.ece([0.1, 0.2, 0.9], [0, 1, 0], n_bins=2)
    assert got == pytest.approx(2 / 3 * abs(0.5 - 0.15) + 1 / 3 * 0.9)


def test_ece_quantile_equal_mass():
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    y = np.array([0, 0, 1, 0, 1, 1])
    curve = M.reliability_curve(p, y, n_bins=3, strategy="quantile")
    np.testing.assert_array_equal(curve.counts, [2, 2, 2])
    np.testing.assert_allclose(curve.mean_prob, [0.15, 0.35, 0.55])
    np.testing.assert_allclose(curve.frac_pos, [0.0, 0.5, 1.0])
    expected = (0.15 + 0.15 + 0.45) / 3
    assert M.ece(p, y, n_bins=3, strategy="quantile") == pytest.approx(expected)


def test_ece_quantile_bins_nearly_equal_and_cover_all_rows():
    p, y = _ctr_like(1003, 2, 2)
    curve = M.reliability_curve(p, y, n_bins=15, strategy="quantile")
    assert curve.counts.sum() == 1003
    assert curve.counts.max() - curve.counts.min() <= 1
    assert np.all(np.diff(curve.edges) >= 0)


def test_reliability_curve_uniform():
    p = np.array([0.05, 0.05, 0.95, 1.0])
    y = np.array([0, 1, 1, 1])
    curve = M.reliability_curve(p, y, n_bins=10)
    assert curve.counts.shape == (11,) and curve.edges.shape == (11,)
    assert curve.counts[0] == 2 and curve.frac_pos[0] == 0.5
    assert curve.counts[9] == 1 and curve.counts[10] == 1
    assert np.isnan(curve.mean_prob[5])


# --------------------------------------------------------------------------- API


def test_compute_all_keys_and_definitions():
    p, y = _ctr_like(2000, 7, None)
    out = M.compute_all(torch.from_numpy(p), torch.from_numpy(y))
    assert set(out) == {"auc", "logloss", "brier", "ece", "ece_mass", "pcoc", "ne"}
    assert all(M.metric_of(k) is not None for k in out)  # each one declared
    assert all(isinstance(v, float) for v in out.values())
    assert out["auc"] == pytest.approx(roc_auc_score(y, p))


@pytest.mark.parametrize(
    "probs,labels,match",
    [
        ([0.1, 1.2], [0, 1], r"\[0, 1\]"),
        ([0.1, float("nan")], [0, 1], "NaN"),
        ([0.1, float("inf")], [0, 1], "infinite"),
        ([0.1, 0.2], [0, 2], "0 or 1"),
        ([0.1, 0.2], [0], "length"),
        ([], [], "empty"),
    ],
)
def test_bad_inputs(probs, labels, match):
    with pytest.raises(ValueError, match=match):
        M.compute_all(np.asarray(probs, dtype=float), np.asarray(labels, dtype=float))


def test_top_level_export():
    import ctrcal

    assert ctrcal.metrics.auc([0.1, 0.9], [0, 1]) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_bin_edges_are_torch_linspace_bit_for_bit(dtype):
    # computed without torch, so that reports on a predictions file never import it
    from ctrcal.metrics._metrics import _uniform_edges

    np_dtype = np.dtype(np.float32 if dtype == torch.float32 else np.float64)
    for n in [*range(1, 400), 1_000, 4_097]:
        want = torch.linspace(0.0, 1.0, n + 1, dtype=dtype).double().numpy()
        np.testing.assert_array_equal(_uniform_edges(n, np_dtype), want, err_msg=str(n))
