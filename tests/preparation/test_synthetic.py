"""Synthetic generator: deterministic, Criteo-like marginals, numerics carry signal."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from parsed_rows import read_rows
from sklearn.metrics import roc_auc_score

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, NUMERIC_COLUMNS
from ctrcal.preparation import synthetic as syn


@pytest.mark.slow
def test_deterministic_by_seed(tmp_path):
    a = syn.generate(tmp_path / "a.txt", 3000, seed=5)
    syn.calibrated_click_model.cache_clear()  # the click model drawn again, not reused
    b = syn.generate(tmp_path / "b.txt", 3000, seed=5)
    c = syn.generate(tmp_path / "c.txt", 3000, seed=6)
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.path.read_bytes() != c.path.read_bytes()
    pa = pl.read_parquet(syn.prob_path(a.path))
    assert pa.equals(pl.read_parquet(syn.prob_path(b.path)))
    assert pa.height == 3000 and pa["prob"].is_between(0, 1).all()
    assert a.oracle_auc == b.oracle_auc


def test_marginals(criteo_files):
    df = read_rows(criteo_files["dac"])
    assert 0.18 < df["label"].mean() < 0.32
    missing = df.select(pl.col(NUMERIC_COLUMNS).is_null().mean()).row(0)
    np.testing.assert_allclose(missing, syn.NUMERIC_MISSING, atol=0.06)
    cmissing = df.select(pl.col(CATEGORICAL_COLUMNS).is_null().mean()).row(0)
    np.testing.assert_allclose(cmissing, syn.CATEGORICAL_MISSING, atol=0.06)
    assert df["I2"].min() < 0  # negative I2 as in dac
    assert df["I5"].max() > 100 * df["I5"].median()  # heavy tail
    # Zipf: the top value of a big field is much more common than the median one
    counts = df["C3"].value_counts(sort=True)["count"]
    assert counts[0] > 5 * counts[len(counts) // 2]


def test_numeric_noise_hurts_the_oracle():
    model = syn.make_click_model(0)
    syn._calibrate(model, 0, 0.25)
    rng = np.random.default_rng(1)
    chunk = syn._draw_chunk(model, 40_000, rng)
    p = syn._sigmoid(chunk.logit_wo_intercept + model.intercept)
    y = rng.random(len(p)) < p
    auc = roc_auc_score(y, p)
    # Gaussian noise of half a std in the sign-aware-log space the model reads
    t = np.sign(chunk.numeric) * np.log1p(np.abs(chunk.numeric))
    noisy_t = t + 0.5 * np.nanstd(t, axis=0) * rng.standard_normal(t.shape)
    noisy = np.sign(noisy_t) * np.expm1(np.abs(noisy_t))
    auc_noisy = roc_auc_score(y, syn._logit(model, noisy, chunk.categorical))
    assert auc > 0.75
    assert auc - auc_noisy > 0.01
    # numerics alone carry a good share of the signal
    no_cats = chunk.categorical.copy()
    no_cats[:] = 0
    auc_num = roc_auc_score(y, syn._logit(model, chunk.numeric, no_cats))
    assert auc_num > 0.65


@pytest.mark.slow
def test_drift_zero_writes_the_stationary_rows():
    a, pa = syn.generate_frame(2000, seed=3)
    syn.calibrated_click_model.cache_clear()
    b, pb = syn.generate_frame(2000, seed=3, drift=0.0)
    assert a.equals(b) and np.array_equal(pa, pb)
    assert not syn.generate_frame(2000, seed=3, drift=1.0)[0].equals(a)


@pytest.mark.slow
def test_drift_shifts_first_rows_from_last_and_probabilities_stay_exact(tmp_path):
    rows = 40_000
    res = syn.generate(tmp_path / "d.txt", rows, seed=2, drift=1.5)
    df = read_rows(res.path)
    prob = pl.read_parquet(res.prob_path)["prob"].to_numpy()
    # the stored probabilities are the click model at each row's own position
    exact = syn.true_probability(df, syn.positions(rows), seed=2, drift=1.5)
    np.testing.assert_allclose(exact, prob, rtol=1e-12, atol=0)
    # ... and do not equal the stationary model's, which a temporal split has to learn
    still = syn.true_probability(df, np.zeros(rows), seed=2, drift=1.5)
    assert np.abs(still - prob)[-5000:].mean() > 0.02
    first, last = df.head(10_000), df.tail(10_000)

    def logs(frame):
        x = frame.select(pl.col(NUMERIC_COLUMNS).cast(pl.Float64)).to_numpy()
        return np.sign(x) * np.log1p(np.abs(x))

    # numeric medians move by about half a log-scale std per unit of drift
    gap = np.abs(np.nanmean(logs(last), axis=0) - np.nanmean(logs(first), axis=0))
    se = np.sqrt(np.nanvar(logs(first), axis=0) / 10_000 * 2)
    assert (gap > 6 * se).sum() >= 10
    # popular values of the drifting fields change
    top_first = first["C1"].drop_nulls().mode()[0]
    top_last = last["C1"].drop_nulls().mode()[0]
    assert top_first != top_last
    # the labels follow the true probabilities in both halves (an honest oracle)
    for part in (slice(0, rows // 2), slice(rows // 2, rows)):
        y = df["label"].to_numpy()[part]
        p = prob[part]
        assert abs(y.mean() - p.mean()) < 4 * np.sqrt(p.mean() * (1 - p.mean()) / len(p))


def test_true_probability_without_drift_matches_the_generator(criteo_frame):
    frame, prob = criteo_frame
    np.testing.assert_allclose(
        syn.true_probability(frame, syn.positions(frame.height), seed=0), prob, rtol=1e-12
    )
