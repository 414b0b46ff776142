"""Input drift and the label-free estimators on data whose truth is known.

Every analysis is drawn like its reference except for what a test changes, so the features
that must alarm, the unseen fraction and the measured AUC are known in advance.
"""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal import metrics as M
from ctrcal.metrics import DriftMonitor, doc_estimates, importance_weighted_estimates, js_distance

BETA = np.array([0.8, -0.6, 0.5, 0.3])  # the click model's weights on the numeric features


def _features(rng: np.random.Generator, n: int, noise: dict[str, float] | None = None) -> dict:
    """Four numeric features (two heavy-tailed counts, two normal) and two categorical ones;
    ``noise``: feature -> Gaussian noise in units of its std, added after the draw."""
    x = {
        "n0": np.floor(rng.lognormal(1.0, 1.0, n)),
        "n1": np.floor(rng.lognormal(0.5, 1.2, n)),
        "n2": rng.normal(0.0, 1.0, n),
        "n3": rng.normal(2.0, 0.5, n),
        "c0": rng.zipf(1.8, n) % 300,
        "c1": rng.integers(0, 8, n),
    }
    for name, scale in (noise or {}).items():
        x[name] = x[name] + rng.normal(0.0, scale * x[name].std(), n)
    return x


def _logits(x: dict) -> np.ndarray:
    z = np.stack([np.log1p(np.maximum(x["n0"], 0)), np.log1p(np.maximum(x["n1"], 0))], 1)
    z = np.concatenate([z, np.stack([x["n2"], x["n3"] - 2.0], 1)], 1)
    return z @ BETA - 1.5


@pytest.fixture(scope="module")
def monitor() -> DriftMonitor:
    rng = np.random.default_rng(0)
    return DriftMonitor(1000, alarm_rate=0.05, classifier_rows=1000).fit(_features(rng, 20_000))


def test_js_distance_by_hand():
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    assert js_distance([3, 1], [6, 2]) == pytest.approx(0.0)
    # p = (½, ½), q = (1, 0), m = (¾, ¼): ½[½ log2(⅔) + ½ log2 2] + ½ log2(4/3)
    div = 0.5 * (0.5 * np.log2(2 / 3) + 0.5) + 0.5 * np.log2(4 / 3)
    assert js_distance([1, 1], [1, 0]) == pytest.approx(np.sqrt(div))


def test_a_clean_analysis_raises_no_more_alarms_than_the_stated_rate(monitor):
    chunks = monitor.transform(_features(np.random.default_rng(1), 20_000))
    assert len(chunks) == 20
    alarmed = sum(c.alarm for c in chunks)
    assert alarmed <= 1  # 5 % of 20 chunks: at most one false alarm expected
    assert all(c.trusted == (not c.alarm) for c in chunks)


def test_a_noisy_analysis_alarms_on_exactly_the_noisy_features(monitor):
    noisy = {"n0": 1.0, "n2": 1.0}
    chunks = monitor.transform(_features(np.random.default_rng(2), 5000, noisy))
    for c in chunks:
        flagged = {s.feature for s in c.scores if s.alarm and s.feature is not None}
        assert flagged == set(noisy)
        mv = next(s for s in c.scores if s.method == "domain_classifier")
        assert mv.alarm and mv.value > 0.6
        assert not c.trusted


def test_a_new_categorical_value_is_counted(monitor):
    x = _features(np.random.default_rng(3), 4000)
    x["c1"][::4] = 99  # never in the reference: a quarter of every chunk
    chunks = monitor.transform(x)
    for c in chunks:
        s = next(s for s in c.scores if s.feature == "c1")
        assert s.unseen == pytest.approx(0.25, abs=0.002)
        assert s.alarm
        other = next(s for s in c.scores if s.feature == "c0")
        assert other.unseen < 0.05 and not other.alarm  # rare values, as in the reference


def test_bad_inputs_are_refused_with_one_line(monitor):
    x = _features(np.random.default_rng(4), 2000)
    with pytest.raises(ValueError, match=r"different feature columns; only in the analysis: z"):
        monitor.transform({**x, "z": x["n0"]})
    with pytest.raises(ValueError, match=r"feature 'n2' has no value in the analysis"):
        monitor.transform({**x, "n2": np.full(2000, np.nan)})
    with pytest.raises(ValueError, match=r"fewer than one chunk of 1,000"):
        monitor.transform({k: v[:500] for k, v in x.items()})
    with pytest.raises(ValueError, match=r"too large for their threshold.*make 2 chunk"):
        DriftMonitor(1000).fit(x)
    with pytest.raises(ValueError, match=r"too small for a drift threshold"):
        DriftMonitor(50).fit(x)


def test_importance_weighting_recovers_the_auc_under_a_covariate_shift():
    # clicks depend on x0, more steeply the larger x1; the model sees x0 only, so when x1
    # moves, P(y | p) moves with it although P(y | x) does not: CBPE and an unweighted
    # recalibration miss it, the reference reweighted by the true density ratio does not
    rng = np.random.default_rng(5)
    n = 40_000

    def draw(mean1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x0, x1 = rng.normal(0, 1, n), rng.normal(mean1, 1, n)
        y = (rng.random(n) < 1 / (1 + np.exp(-(x0 * np.exp(0.7 * x1) - 1.0)))).astype(float)
        return x1, 1 / (1 + np.exp(-(x0 - 1.2))), y

    x1_ref, p_ref, y_ref = draw(0.0)
    _, p, y = draw(1.0)
    measured = M.auc(p, y)
    true_ratio = np.exp(x1_ref - 0.5)  # N(1, 1) / N(0, 1) at the reference's x1
    iw = importance_weighted_estimates(p_ref, y_ref, true_ratio, p)
    flat = importance_weighted_estimates(p_ref, y_ref, np.ones(n), p)
    assert abs(iw["auc"] - measured) < 0.005  # the measured AUC is 0.85
    assert abs(iw["logloss"] - M.logloss(p, y)) < 0.01
    assert measured - flat["auc"] > 0.05 and measured - M.expected_auc(p) > 0.05


def test_doc_is_the_reference_measurement_when_nothing_moved():
    rng = np.random.default_rng(6)
    p = rng.beta(1, 4, 5000)
    y = (rng.random(5000) < np.clip(1.3 * p, 0, 1)).astype(float)  # under-predicting
    est = doc_estimates(p, y, p)
    assert est["auc"] == pytest.approx(M.auc(p, y))
    assert est["logloss"] == pytest.approx(M.logloss(p, y))


def test_the_trust_flag_turns_off_under_noise_on_the_inputs(monitor):
    # the model is the click model of the clean inputs; noise on the inputs it reads makes
    # CBPE's estimate rise while the measured AUC falls, and the drift withdraws the trust
    rng = np.random.default_rng(7)
    noisy = {"n0": 0.5, "n1": 0.5, "n2": 0.5, "n3": 0.5}
    clean = _features(rng, 4000)
    shifted = {k: v.copy() for k, v in clean.items()}
    for name, scale in noisy.items():
        shifted[name] = clean[name] + rng.normal(0, scale * clean[name].std(), 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-_logits(clean)))).astype(float)
    p = 1 / (1 + np.exp(-_logits(shifted)))
    assert M.expected_auc(p) - M.auc(p, y) > 0.02  # the estimate is wrong ...
    assert not any(c.trusted for c in monitor.transform(shifted))  # ... and says so


def test_the_unseen_rate_pools_every_categorical_feature(monitor):
    # 3 % of the rows get a c0 value the reference never had: the pooled rate counts them
    # over both categorical features' values, and its threshold (from the reference's
    # chunks, whose values unseen by the rest are rare ones) is crossed in every chunk
    rng = np.random.default_rng(8)
    x = _features(rng, 4000)
    ref = _features(np.random.default_rng(0), 20_000)
    hit = rng.random(4000) < 0.03
    x["c0"] = np.where(hit, 1000 + np.arange(4000), x["c0"])
    for c in monitor.transform(x):
        s = next(s for s in c.scores if s.method == "unseen_rate")
        rows = slice(c.start, c.stop)
        new = sum(int(np.isin(x[f][rows], ref[f], invert=True).sum()) for f in ("c0", "c1"))
        assert s.value == pytest.approx(new / (2 * (c.stop - c.start)))
        assert s.alarm and not c.trusted
    clean = monitor.transform(_features(np.random.default_rng(1), 20_000))
    assert sum(next(s for s in c.scores if s.method == "unseen_rate").alarm for c in clean) <= 1


def test_reference_bins_missing_values_and_values_of_one_chunk_by_hand():
    # x: 0..9 in turn, 197 of each, and 30 non-finite rows in chunk 0 (NaN, +inf, -inf):
    # its deciles are 0.9, 1.8, ..., 8.1, so each value has a bin and the 30 the missing one.
    # s (text, None missing) and i (ids) hold a value found in one reference chunk only:
    # against the rest of the reference it is unseen, 10 rows in chunk 3 and 20 in chunk 8
    n = 2000
    x = np.tile(np.arange(10.0), n // 10)
    x[:30] = np.repeat([np.nan, np.inf, -np.inf], 10)
    s = np.array(["a", "b"] * (n // 2), dtype=object)
    s[600:610] = "z"
    s[1000:1020] = None
    i = np.tile(np.arange(5), n // 5)
    i[1600:1620] = 7
    mon = DriftMonitor(200, classifier_rows=200).fit({"x": x, "s": s, "i": i})
    np.testing.assert_allclose(mon.edges_["x"], 0.9 * np.arange(1, 10))
    assert mon.reference_counts_["x"].tolist() == [197] * 10 + [30]
    # s: a, b, z (other), missing, unseen
    assert mon.reference_counts_["s"].tolist() == [985, 985, 10, 0, 20, 0]
    unseen = np.zeros(10)
    unseen[3], unseen[8] = 10 / 400, 20 / 400
    np.testing.assert_allclose(mon.reference_scores_["unseen_rate"], unseen)
