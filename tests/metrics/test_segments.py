"""Worst segments: planted over-prediction found and ranked, no false alarms beyond α, Holm by
hand, the minimum count and pairs."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.metrics import holm, worst_segments


def planted(seed: int, bad: int = 4, n_segments: int = 40, rows: int = 2000):
    """``n_segments`` values of one column; on the first ``bad`` ones the model predicts 1.5
    times the true click probability (over-predicted by 50 %)."""
    rng = np.random.default_rng(seed)
    seg = np.repeat(np.arange(n_segments), rows)
    p = rng.uniform(0.05, 0.3, seg.size)
    true = np.where(seg < bad, p / 1.5, p)
    y = (rng.random(seg.size) < true).astype(np.float64)
    return p, y, seg


def test_four_planted_segments_are_the_top_four_and_the_others_not_significant():
    p, y, seg = planted(0)
    names = [f"v{k}" for k in range(40)]
    scan = worst_segments(p, y, {"site": seg}, value_names={"site": names})
    assert scan.tested == 40 and scan.skipped == 0 and scan.adjustment == "holm"
    top = scan.segments[:4]
    assert {s.name for s in top} == {"site=v0", "site=v1", "site=v2", "site=v3"}
    for s in top:
        assert s.sigma < -4 and s.pvalue_adjusted < 0.05
        assert s.high < 1.0  # the ratio's interval excludes calibration
        assert s.observed == pytest.approx(float(y[seg == int(s.name[6:])].sum()))
    pooled = sum(s.observed for s in top) / sum(s.predicted for s in top)
    assert pooled == pytest.approx(1 / 1.5, abs=0.07)  # the planted ratio, within 3 SE
    assert all(s.pvalue_adjusted >= 0.05 for s in scan.segments[4:])
    assert [s.name for s in scan.flagged] == [s.name for s in top]


def test_no_bad_segment_flags_nothing_beyond_the_family_wise_rate():
    # Holm keeps P(any flag) <= 5 % per file: among 20 calibrated files, 5 or more with a flag
    # has probability < 0.3 % (binomial(20, 0.05))
    files_with_flags = 0
    for seed in range(20):
        p, y, seg = planted(100 + seed, bad=0, rows=1000)
        files_with_flags += bool(worst_segments(p, y, {"site": seg}).flagged)
    assert files_with_flags <= 4


def test_holm_by_hand():
    got = holm(np.array([0.01, 0.04, 0.03, 0.005]))
    # sorted 0.005·4, 0.01·3, 0.03·2, 0.04·1 -> 0.02, 0.03, 0.06, 0.06 (running maximum)
    np.testing.assert_allclose(got, [0.03, 0.06, 0.06, 0.02])


def test_holm_leaves_a_test_not_made_out_of_the_family():
    # a NaN p-value is not a rejection and takes no rank: m = 3, not 4
    got = holm(np.array([0.01, 0.04, 0.03, np.nan]))
    np.testing.assert_allclose(got[:3], [0.03, 0.06, 0.06])
    assert np.isnan(got[3])
    got = holm(np.array([np.nan, 0.02, np.nan]))
    assert np.isnan(got[0]) and got[1] == 0.02 and np.isnan(got[2])
    assert np.isnan(holm(np.array([np.nan]))).all() and holm(np.array([])).size == 0


def test_one_holm_for_segments_and_the_shift_report():
    import ctrcal.reports.shift.stats as S

    assert not hasattr(S, "holm") or S.holm is holm


def test_minimum_count_pairs_and_the_value_cap():
    p, y, seg = planted(1, rows=300)
    dev = np.tile([0, 1, 1], seg.size // 3)
    small = np.where(np.arange(seg.size) < 50, 1, 0)  # a value with 50 rows
    scan = worst_segments(
        p, y, {"site": seg, "dev": dev, "small": small}, pairs=[("site", "dev")], min_count=100
    )
    # 40 sites, 2 devices, 1 of 2 'small' values, 40 (site, dev=1) pairs of 200 rows; the
    # 40 (site, dev=0) pairs of 100 rows are tested too, the 'small' value of 50 rows is not
    assert scan.tested == 40 + 2 + 1 + 80 and scan.skipped == 1
    pair = next(s for s in scan.segments if s.name == "site=3 & dev=1")
    rows = (seg == 3) & (dev == 1)
    assert pair.rows == 200 and pair.observed == pytest.approx(float(y[rows].sum()))
    assert pair.predicted == pytest.approx(float(p[rows].sum()))
    with pytest.raises(ValueError, match="more than the 10 a segment column may have"):
        worst_segments(p, y, {"site": seg}, max_values=10)
    with pytest.raises(ValueError, match="pairs: 'x' is not a segment column"):
        worst_segments(p, y, {"site": seg}, pairs=[("site", "x")])
