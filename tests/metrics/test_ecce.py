"""ECCE, its significance, the multicalibration error and NE against MCGrad and by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from ctrcal import metrics as M

mcgrad = pytest.importorskip("mcgrad.metrics")


def _data(n=20_000, seed=0, lift=0.3):
    """Three fields; rows with field b == 2 click ``1 + lift`` times as often as predicted."""
    rng = np.random.default_rng(seed)
    fields = np.stack([rng.zipf(1.5, n) % 50, rng.integers(0, 4, n), rng.integers(0, 7, n)], axis=1)
    p = rng.beta(1, 10, n)
    true = np.clip(p * (1 + lift * (fields[:, 1] == 2)), 0, 1)
    y = (rng.random(n) < true).astype(np.float64)
    return p, y, fields


# --------------------------------------------------------------------------- ECCE


def test_ecce_hand_computed():
    # sorted p .2 .4 .6, y 0 1 1: C = (-.2, .4, .8)/3 with C0 = 0 -> range (.8 + .2)/3
    t = M.ecce_test([0.6, 0.2, 0.4], [1, 0, 1])
    assert t.ecce == pytest.approx(1.0 / 3.0)
    assert t.std == pytest.approx(math.sqrt(0.16 + 0.24 + 0.24) / 3)
    assert t.sigmas == pytest.approx(t.ecce / t.std)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ecce_matches_mcgrad(seed):
    p, y, _ = _data(seed=seed)
    t = M.ecce_test(p, y)
    assert t.ecce == pytest.approx(mcgrad.ecce(y, p), rel=1e-10)
    assert t.sigmas == pytest.approx(mcgrad.ecce_sigma(y, p), rel=1e-10)
    assert t.pvalue == pytest.approx(mcgrad.ecce_pvalue(y, p), rel=1e-9, abs=1e-15)
    assert M.ecce(torch.from_numpy(p), torch.from_numpy(y)) == pytest.approx(t.ecce, rel=1e-12)
    assert M.ecce_std(p) == pytest.approx(t.std)


def test_pvalue_series_matches_mcgrad_and_simulation():
    xs = np.array([0.2, 0.8, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0])
    ours = M.ecce_pvalue_from_sigmas(xs)
    ref = np.array([mcgrad.ecce_pvalue_from_sigma(float(x)) for x in xs])
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-15)
    assert M.ecce_pvalue_from_sigmas(0.01) == 1.0 and M.ecce_pvalue_from_sigmas(50.0) == 0.0
    # the range of simulated Brownian motion (random walks of 2000 steps)
    rng = np.random.default_rng(0)
    walks = np.cumsum(rng.standard_normal((4000, 2000)), axis=1) / math.sqrt(2000)
    ranges = np.maximum(walks.max(1), 0) - np.minimum(walks.min(1), 0)
    # a walk seen at 2000 steps misses the excursions between them: Siegmund's correction
    # adds 0.5826/sqrt(steps) to each end
    ranges += 2 * 0.5826 / math.sqrt(2000)
    for x in (1.5, 2.0, 2.5):
        assert (ranges >= x).mean() == pytest.approx(M.ecce_pvalue_from_sigmas(x), abs=0.02)


def test_ecce_with_a_given_order():
    p, y, _ = _data(n=1000)
    order = np.argsort(p, kind="stable")
    assert M.ecce_test(p, y, order=order) == M.ecce_test(p, y)
    with pytest.raises(ValueError, match="order: does not sort"):
        M.ecce_test(p, y, order=order[::-1].copy())
    with pytest.raises(ValueError, match="order: expected 1000"):
        M.ecce_test(p, y, order=order[:5])


def test_ecce_is_calibrated_under_the_null():
    # perfectly calibrated predictions: p-values roughly uniform, about 5 % below 0.05
    rng = np.random.default_rng(1)
    pv = []
    for _ in range(300):
        p = rng.beta(1, 8, 2000)
        y = (rng.random(2000) < p).astype(float)
        pv.append(M.ecce_test(p, y).pvalue)
    assert 0.01 <= np.mean(np.array(pv) < 0.05) <= 0.10
    # and a miscalibrated model is detected
    p = rng.beta(1, 8, 20_000)
    y = (rng.random(20_000) < np.clip(1.3 * p, 0, 1)).astype(float)
    assert M.ecce_test(p, y).pvalue < 1e-6


def test_ecce_does_not_depend_on_the_order_of_ties():
    rng = np.random.default_rng(3)
    p = np.round(rng.beta(1, 8, 3000), 2)  # many ties
    y = (rng.random(3000) < p).astype(float)
    a = M.ecce(p, y)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(3000)
        assert M.ecce(p[perm], y[perm]) == pytest.approx(a, rel=1e-12)
    # the path is read after each run of equal p: aggregate by value and compare
    vals, inv = np.unique(p, return_inverse=True)
    d = np.bincount(inv, weights=y - p) / len(p)
    c = np.concatenate([[0.0], np.cumsum(d)])
    assert a == pytest.approx(c.max() - c.min(), rel=1e-12)


# --------------------------------------------------------------------------- multicalibration


def _mcgrad_mce(p, y, fields, **kw):
    df = pd.DataFrame({"y": y, "p": p, **{f"f{j}": fields[:, j] for j in range(fields.shape[1])}})
    return mcgrad.MulticalibrationError(
        df,
        "y",
        "p",
        categorical_segment_columns=[f"f{j}" for j in range(fields.shape[1])],
        precision_dtype="float64",
        **kw,
    )


@pytest.mark.parametrize("seed, min_count", [(0, 10), (1, 10), (2, 200)])
def test_multicalibration_matches_mcgrad(seed, min_count):
    p, y, fields = _data(seed=seed)
    ref = _mcgrad_mce(p, y, fields, min_samples_per_segment=min_count)
    got = M.multicalibration_error(p, y, fields, names=["f0", "f1", "f2"], min_count=min_count)
    ref_sigmas = ref.segments_ecce_sigma  # evaluates the segments (and counts them)
    assert got.n_segments == ref.total_number_segments
    assert got.sigmas == pytest.approx(ref.mce_sigma, rel=1e-9)
    assert got.mce == pytest.approx(ref.mce, rel=1e-9)
    assert 100 * got.relative == pytest.approx(ref.mce_relative, rel=1e-9)
    assert got.pvalue == pytest.approx(ref.mce_pvalue, rel=1e-6, abs=1e-15)
    assert got.global_ecce == pytest.approx(ref.global_ecce, rel=1e-10)
    # the same segment values: compare the sorted per-segment statistics
    np.testing.assert_allclose(np.sort(got.segment_sigmas), np.sort(ref_sigmas), rtol=1e-9)
    assert got.pvalue_adjusted == pytest.approx(min(1.0, got.pvalue * got.n_segments))


def test_multicalibration_finds_the_planted_segment():
    p, y, fields = _data(n=40_000, seed=5, lift=0.5)
    fields[:, 1] = np.where(fields[:, 1] == 3, 1, fields[:, 1])  # b: values 0, 1, 2
    got = M.multicalibration_error(p, y, {"a": fields[:, 0], "b": fields[:, 1]}, max_depth=1)
    assert got.worst_segment == (("b", 2),)
    assert got.pvalue_adjusted < 1e-3
    # calibrated predictions: nothing significant after the adjustment
    yc = (np.random.default_rng(9).random(len(p)) < p).astype(float)
    calm = M.multicalibration_error(p, yc, fields)
    assert calm.pvalue_adjusted > 0.05


def test_multicalibration_depth_segments_and_subsample():
    p, y, fields = _data(n=5000, seed=4)
    only_global = M.multicalibration_error(p, y, fields, max_depth=0)
    assert only_global.n_segments == 1 and only_global.worst_segment == ()
    assert only_global.sigmas == pytest.approx(M.ecce_test(p, y).sigmas, rel=1e-10)
    capped = M.multicalibration_error(p, y, fields, max_segments=20)
    assert capped.n_segments == 20 == len(capped.segments) == capped.segment_sigmas.size
    # depth-2 segments hold the values of two fields, the last value of a field is "other"
    full = M.multicalibration_error(p, y, fields, max_depth=2, names=["a", "b", "c"])
    assert {len(s) for s in full.segments} == {0, 1, 2}
    assert ("a", "other") in {s[0] for s in full.segments if len(s) == 1}
    assert (full.segment_rows >= 10).all()
    sub = M.multicalibration_error(p, y, fields, max_rows=2000, seed=1)
    assert sub.rows == 2000
    t = M.multicalibration_error(torch.from_numpy(p), torch.from_numpy(y), torch.from_numpy(fields))
    assert t.sigmas == pytest.approx(M.multicalibration_error(p, y, fields).sigmas, rel=1e-12)


def test_multicalibration_with_tied_predictions_is_order_free():
    p, y, fields = _data(n=6000, seed=6)
    p = np.round(p, 2)
    a = M.multicalibration_error(p, y, fields)
    perm = np.random.default_rng(0).permutation(len(p))
    b = M.multicalibration_error(p[perm], y[perm], fields[perm])
    assert b.sigmas == pytest.approx(a.sigmas, rel=1e-10)
    np.testing.assert_allclose(b.segment_ecce, a.segment_ecce, rtol=1e-10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_depth": -1}, "max_depth"),
        ({"max_values": 1}, "max_values"),
        ({"max_segments": 0}, "max_segments"),
        ({"max_rows": 1}, "max_rows"),
    ],
)
def test_multicalibration_bad_arguments(kwargs, match):
    p, y, fields = _data(n=100)
    with pytest.raises(ValueError, match=match):
        M.multicalibration_error(p, y, fields, **kwargs)


# --------------------------------------------------------------------------- NE


@pytest.mark.parametrize("seed", [0, 1])
def test_ne_and_calibration_free_ne_match_mcgrad(seed):
    p, y, _ = _data(seed=seed, lift=0.8)
    assert M.normalized_entropy(p, y) == pytest.approx(mcgrad.normalized_entropy(y, p), rel=1e-6)
    # MCGrad iterates until Σp/Σy is within 1e-5 of 1; ours solves it to 1e-10
    assert M.calibration_free_ne(p, y) == pytest.approx(
        mcgrad.calibration_free_normalized_entropy(y, p), rel=1e-5
    )


def test_calibration_free_ne_on_many_rows_matches_mcgrad():
    # above 400k rows the logit shift starts from a subsample's solution
    p, y, _ = _data(n=500_000, seed=4, lift=0.8)
    assert M.calibration_free_ne(p, y) == pytest.approx(
        mcgrad.calibration_free_normalized_entropy(y, p), rel=1e-5
    )


def test_calibration_free_ne_ignores_a_global_logit_shift():
    p, y, _ = _data(seed=3)
    z = np.log(p / (1 - p))
    shifted = 1 / (1 + np.exp(-(z + 0.7)))
    assert M.normalized_entropy(shifted, y) > M.normalized_entropy(p, y) + 0.01
    assert M.calibration_free_ne(shifted, y) == pytest.approx(M.calibration_free_ne(p, y), rel=1e-8)


def test_ne_with_the_train_base_rate():
    p, y = np.array([0.2, 0.2, 0.6, 0.6]), np.array([0.0, 1.0, 1.0, 0.0])
    ll = M.logloss(p, y)
    q = 0.1
    h = -(q * math.log(q) + (1 - q) * math.log(1 - q))
    assert M.normalized_entropy(p, y, base_rate=q) == pytest.approx(ll / h)
    assert M.normalized_entropy(p, y) == pytest.approx(ll / math.log(2))
    with pytest.raises(ValueError, match="base_rate"):
        M.normalized_entropy(p, y, base_rate=1.0)
    assert math.isnan(M.calibration_free_ne([0.2, 0.3], [1, 1]))


# --------------------------------------------------------------------------- summary


def test_calibration_summary_holds_every_metric_consistently():
    p, y, fields = _data(n=8000, seed=7)
    out = M.calibration_summary(p, y, fields, names=["a", "b", "c"], base_rate=0.1, min_count=20)
    # every value is declared, and every declared value of the summary is there
    assert all(M.metric_of(k) is not None for k in out), [k for k in out if not M.metric_of(k)]
    summary = [m.name for m in M.metrics_in() if m.computed_by == "calibration_summary"]
    for key in [*summary, "auc", "ece", "ne_calfree", "ne_train"]:
        assert key in out or "<" in key, key
    assert out["ecce"] == pytest.approx(M.ecce(p, y))
    for key, value in M.compute_all(p, y).items():  # the shared sort changes nothing
        assert out[key] == pytest.approx(value, rel=1e-12), key
    assert out["ne"] == pytest.approx(M.normalized_entropy(p, y), rel=1e-12)
    assert out["field_rce:b"] == pytest.approx(M.field_rce(p, y, fields[:, 1], min_count=20))
    assert out["field_rce_max"] == max(out[f"field_rce:{k}"] for k in "abc")
    assert out["mce_pvalue"] >= out["mce_pvalue_unadjusted"]
    assert all(isinstance(v, float) for v in out.values())
    bare = M.calibration_summary(p, y, with_auc=False)
    assert "auc" not in bare and "field_rce_mean" not in bare and "ecce" in bare


@pytest.mark.parametrize(
    "probs, labels, match",
    [
        ([0.1, np.nan], [0, 1], "probs contains NaN"),
        ([0.1, -np.inf], [0, 1], "probs contains NaN or infinite"),
        ([0.1, 1.5], [0, 1], r"probs must lie in \[0, 1\]"),
        ([0.1, 0.5], [0, 0.5], "labels must be 0 or 1"),
        ([0.1, 0.5], [0, 1, 1], "probs and labels differ in length"),
        ([], [], "probs is empty"),
    ],
)
@pytest.mark.parametrize(
    "fn", [M.ecce_test, M.calibration_free_ne, M.normalized_entropy, M.calibration_summary]
)
def test_bad_input_names_the_argument(fn, probs, labels, match):
    with pytest.raises(ValueError, match=match):
        fn(np.asarray(probs, dtype=float), np.asarray(labels, dtype=float))


def test_calibration_summary_names_a_bad_field():
    p, y, fields = _data(n=200)
    with pytest.raises(ValueError, match=r"fields\['b'\]: expected 200 values"):
        M.calibration_summary(p, y, {"a": fields[:, 0], "b": fields[:-1, 1]})
    with pytest.raises(ValueError, match=r"fields\['c'\]: a single value"):
        M.calibration_summary(p, y, {"a": fields[:, 0], "c": np.zeros(200, dtype=int)})
