"""Label-free estimates: CBPE's AUC by hand and by its construction, and honest only when
the probabilities are calibrated.

NannyML (the CBPE reference) cannot be installed beside this project's pins (it requires
lightgbm < 4.6, which MCGrad's newer lightgbm rules out), so the estimate is checked against
the construction CBPE uses: every row counted as a positive of weight p and a negative of
weight 1 − p at its score, the ROC AUC of those weighted rows (scikit-learn's, with ties).
"""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal import metrics as M
from ctrcal.metrics import expected_auc, label_free_errors, label_free_estimates


def test_hand_computed_auc_estimate():
    # expected clicks A = (.2, .5, .8), non-clicks B = (.8, .5, .2) in score order:
    # (0·0 + .5·.8 + .8·1.3 + ½(.16 + .25 + .16)) / (1.5 · 1.5)
    assert expected_auc([0.8, 0.2, 0.5]) == pytest.approx(1.725 / 2.25)
    assert np.isnan(expected_auc([0.0, 0.0]))  # no expected click


def test_auc_estimate_equals_cbpe_construction_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    p = np.round(rng.beta(1, 8, 3000), 3)  # rounded: many ties
    scores = np.concatenate([p, p])
    labels = np.concatenate([np.ones_like(p), np.zeros_like(p)])
    weights = np.concatenate([p, 1.0 - p])
    assert expected_auc(p) == pytest.approx(
        roc_auc_score(labels, scores, sample_weight=weights), abs=1e-12
    )


def test_estimates_match_the_measured_metrics_of_calibrated_predictions():
    rng = np.random.default_rng(1)
    p = rng.beta(1, 5, 5000)
    est = label_free_estimates(p)
    draws = [(rng.random(p.size) < p).astype(float) for _ in range(200)]
    aucs = np.array([M.auc(p, y) for y in draws])
    lls = np.array([M.logloss(p, y) for y in draws])
    # within 4 standard errors of the mean over label draws
    assert abs(est["auc"] - aucs.mean()) < 4 * aucs.std() / np.sqrt(len(aucs)) + 1e-4
    assert abs(est["logloss"] - lls.mean()) < 4 * lls.std() / np.sqrt(len(lls))
    assert est["click_rate"] == pytest.approx(p.mean())
    # over-confident predictions (logits doubled): the estimate drifts from the truth
    z = np.log(p) - np.log1p(-p)
    sharp = 1.0 / (1.0 + np.exp(-2.0 * z))
    err = label_free_errors(sharp, draws[0], M.compute_all(sharp, draws[0]))
    assert err["auc_est_err"] > 0.05 and err["logloss_est_err"] < -0.02
    assert err["auc_est"] - err["auc_measured"] == err["auc_est_err"]


def test_probabilities_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match=r"probs: row 1: 1.5 is not a probability"):
        label_free_estimates([0.2, 1.5])
