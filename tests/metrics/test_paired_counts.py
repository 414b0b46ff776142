"""The paired bootstrap evaluates its replicates from row counts: the same intervals as
evaluating each replicate's rows (hand-fixed below from that evaluation, seed 3), and every
metric of a replicate equal to the metric of its rows repeated by their counts."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.metrics import _paired_counts, multicalibration_error, paired_bootstrap
from ctrcal.metrics._paired_counts import ReplicateCounts, replicate_counts
from ctrcal.reports.calibration.report import model_metrics

# metric: [a.low, a.high, b.low, b.high, diff.low, diff.high, p-value] of 12 replicates of
# _data(), computed by evaluating every replicate's rows (the paired bootstrap before counts)
EXPECTED = {
    "auc": [
        0.721358930637,
        0.759703577589,
        0.718526402546,
        0.754877525571,
        -0.00959781977308,
        -0.00179012745561,
        0.0833333333333,
    ],
    "logloss": [
        0.365529697631,
        0.398034004243,
        0.367939185808,
        0.402316136066,
        0.00156674593369,
        0.00589598492957,
        0.0833333333333,
    ],
    "ece": [
        0.009814475,
        0.024916,
        0.0163370536556,
        0.0263338779875,
        -0.00599245933142,
        0.014529855574,
        0.333333333333,
    ],
    "ece_mass": [
        0.0196807916667,
        0.0307872166667,
        0.017405843991,
        0.0288126693721,
        -0.00817279783057,
        0.00431729395495,
        0.666666666667,
    ],
    "brier_reliability": [
        0.000606879195029,
        0.00210322687308,
        0.000580028364339,
        0.00249189013082,
        -0.00101395315877,
        0.00132819559395,
        0.333333333333,
    ],
    "ne_calfree": [
        0.864834464062,
        0.904894706459,
        0.871872179068,
        0.912555085192,
        0.00381405747064,
        0.0136046587775,
        0.0833333333333,
    ],
    "cal_slope": [
        0.857708502746,
        1.04412716088,
        0.811891404271,
        0.988782341847,
        -0.0768384360435,
        -0.0335342777552,
        0.0833333333333,
    ],
    "cal_intercept_large": [
        -0.00570074701708,
        0.14237693174,
        -0.0236297308063,
        0.126255181582,
        -0.0218719774406,
        -0.00480588339274,
        0.0833333333333,
    ],
    "smooth_ece": [
        0.0148252564268,
        0.0229664115165,
        0.0159278931069,
        0.0224716384099,
        -0.0020742722693,
        0.00335270598875,
        0.5,
    ],
    "ecce_sigmas": [
        1.61056755948,
        3.37318702957,
        1.43931113039,
        3.12859994367,
        -0.26009690714,
        0.602138730913,
        0.833333333333,
    ],
    "field_rce_max": [
        0.0694822152705,
        0.128510407488,
        0.0684455793366,
        0.137959619273,
        -0.0102576353379,
        0.0121380547227,
        1.0,
    ],
    "field_ece:site": [
        0.01158565,
        0.0226559,
        0.0112764354288,
        0.0227109005109,
        -0.00177354442279,
        0.00158249287117,
        0.833333333333,
    ],
    "mce": [
        0.0166545675522,
        0.0305247297008,
        0.0163725876762,
        0.0297210605046,
        -0.00201886019913,
        0.00316612423347,
        0.833333333333,
    ],
    "mce_sigmas": [
        2.71067376703,
        4.94350734292,
        2.6643296244,
        4.81264256766,
        -0.335584286127,
        0.510511677045,
        0.833333333333,
    ],
}


def _data():
    rng = np.random.default_rng(7)
    n = 3000
    z = rng.normal(-2.0, 1.0, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z + 0.3 * rng.normal(size=n))))).astype(np.float64)
    pa = np.round(1 / (1 + np.exp(-z)), 3)  # ties
    pb = 1 / (1 + np.exp(-(z + rng.normal(0, 0.2, n))))
    segs = {"site": rng.integers(0, 7, n), "dev": rng.integers(0, 3, n)}
    return pa, pb, y, segs


@pytest.mark.parametrize("block", [None, 1000])  # 1000: blocks of 256 rows, running sums carried
def test_intervals_are_those_of_the_replicates_rows(block, monkeypatch):
    if block is not None:
        monkeypatch.setattr(_paired_counts, "_BLOCK_ELEMENTS", block)
    pa, pb, y, segs = _data()

    def fn(p, labels, rows):
        return model_metrics(p, labels, segs, rows, n_bins=15, min_count=50)

    also = ["cal_slope", "mce", "smooth_ece"]
    weighted = {"segments": segs, "n_bins": 15, "min_count": 50, "also": also}
    got = paired_bootstrap(fn, pa, pb, y, n_boot=12, seed=3, weighted=weighted)
    for key, want in EXPECTED.items():
        c = got[key]
        have = [c.a.low, c.a.high, c.b.low, c.b.high, c.diff.low, c.diff.high, c.pvalue]
        np.testing.assert_allclose(have, want, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize(
    ("dtype", "decimals", "segments"), [(np.float32, None, 3), (np.float64, 3, 2)]
)
def test_a_replicates_metrics_are_those_of_its_rows(dtype, decimals, segments):
    rng = np.random.default_rng(11)
    n = 4000
    z = rng.normal(-2.5, 1.2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z + 0.3 * rng.normal(size=n))))).astype(np.float64)
    p = (1 / (1 + np.exp(-z))).astype(dtype)
    if decimals is not None:
        p = np.round(p, decimals).astype(dtype)
    p[:3] = [0.0, 1.0, 1e-9]  # the logit's clip, both ends
    segs = {f"s{j}": rng.integers(0, 3 + 5 * j, n) for j in range(segments)}
    segs["constant"] = np.full(n, 4)  # left out, by the report as here
    order = np.argsort(p, kind="stable")
    p, y, segs = p[order], y[order], {k: v[order] for k, v in segs.items()}
    counts = replicate_counts(rng, n, 4)  # [n, 4]
    ev = ReplicateCounts(p, y, segs, n_bins=15, min_count=100, smooth=True, slope=True, mce=True)
    values, exact = ev.evaluate(counts)
    for r in np.flatnonzero(exact):
        rows = np.repeat(np.arange(n), counts[:, r])
        want = model_metrics(p[rows], y[rows], segs, rows, n_bins=15, min_count=100)
        for key, value in want.items():
            if key in values:  # the rest: declared weighted metrics, by their own function
                assert values[key][r] == pytest.approx(value, rel=1e-8, abs=1e-12), key
        assert not set(values) - set(want), set(values) - set(want)
    assert exact.sum() >= 2


def test_the_costly_metrics_are_paired_when_asked():
    pa, pb, y, segs = _data()

    def fn(p, labels, rows):
        return model_metrics(p, labels, segs, rows, n_bins=15, min_count=50)

    weighted = {"segments": segs, "n_bins": 15, "min_count": 50}
    plain = paired_bootstrap(fn, pa, pb, y, n_boot=4, seed=3, weighted=weighted)
    costly = {"cal_slope", "cal_intercept", "mce", "mce_sigmas", "mce_pvalue", "smooth_ece"}
    assert not costly & set(plain)
    assert {"auc", "prauc", "ece_mass", "ne_calfree", "ecce_sigmas", "field_rce_max"} <= set(plain)
    asked = paired_bootstrap(
        fn, pa, pb, y, n_boot=4, seed=3, weighted={**weighted, "also": ["mce"]}
    )
    assert "mce" in asked and "cal_slope" not in asked
    # the same replicates: the other metrics' intervals do not move
    assert asked["auc"].diff.low == plain["auc"].diff.low


def test_counts_are_the_draws_of_each_replicate_in_order():
    n = 1000
    counts = replicate_counts(np.random.default_rng(4), n, 70, ones=True)
    rng = np.random.default_rng(4)
    assert (counts[:, 0] == 1).all() and counts.shape == (n, 71)
    for r in range(70):
        assert (counts[:, 1 + r] == np.bincount(rng.integers(0, n, n), minlength=n)).all()


def test_weighted_rows_equal_the_rows_repeated():
    rng = np.random.default_rng(5)
    n = 3000
    p = np.round(rng.uniform(0.01, 0.4, n), 3)
    y = (rng.uniform(size=n) < p * 1.2).astype(np.float64)
    fields = {"a": rng.integers(0, 5, n), "b": rng.integers(0, 40, n)}
    counts = rng.poisson(1.0, n)
    rows = np.repeat(np.arange(n), counts)
    want = multicalibration_error(p[rows], y[rows], {k: v[rows] for k, v in fields.items()})
    got = multicalibration_error(p, y, fields, sample_weight=counts, max_rows=None)
    assert got.mce == pytest.approx(want.mce, rel=1e-10)
    assert got.sigmas == pytest.approx(want.sigmas, rel=1e-10)
    assert got.n_segments == want.n_segments and got.rows == want.rows
    assert got.worst_segment == want.worst_segment
    with pytest.raises(ValueError, match="sample_weight: weighted rows are not subsampled"):
        multicalibration_error(p, y, fields, sample_weight=counts)


def test_prepared_segments_equal_multicalibration_error_of_the_weights():
    from ctrcal.metrics._ecce import WeightedMCE

    rng = np.random.default_rng(8)
    n = 4000
    p = np.round(rng.uniform(0.01, 0.4, n), 3)  # ties
    y = (rng.uniform(size=n) < p * 1.2).astype(np.float64)
    skewed = np.minimum(40 * rng.uniform(size=n) ** 4, 39).astype(np.int64)  # few values hold most
    fields = {"a": rng.integers(0, 3, n), "b": skewed, "c": rng.integers(0, 2, n)}
    prepared = WeightedMCE(p, y, fields)
    seen = 0
    for _ in range(6):
        counts = np.bincount(rng.integers(0, n, n), minlength=n)
        got = prepared(counts)
        if got is None:
            continue
        seen += 1
        mc = multicalibration_error(p, y, fields, sample_weight=counts, max_rows=None)
        want = (mc.mce, mc.sigmas, mc.relative, mc.pvalue_adjusted, mc.pvalue, mc.n_segments)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-15)
    assert seen >= 3
    # another value among a field's most frequent: left to multicalibration_error
    counts = np.ones(n, dtype=np.int64)
    counts[fields["b"] == 0] = 0
    assert prepared(counts) is None
