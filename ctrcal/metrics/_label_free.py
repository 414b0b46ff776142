"""Label-free estimates: the metrics a model expects of itself if its probabilities are right.

Clicks arrive late or are never joined; the predicted probabilities are there at once. If they
are calibrated, each row's click is a coin with probability p_i, and the metrics' expectations
follow from the probabilities alone (the idea of confidence-based performance estimation,
NannyML's CBPE):

* ``click_rate`` = mean p.
* ``logloss`` = −mean[p·log p + (1−p)·log(1−p)] (p clipped as in
  :func:`~ctrcal.metrics.logloss`): the expected logloss, the mean entropy of the rows.
* ``ne`` = that logloss over the binary entropy of the expected click rate.
* ``brier`` = mean p·(1−p).
* ``auc``: the ROC curve with each row counted as p_i of a positive and 1−p_i of a negative
  at its score. With rows grouped by equal p (ascending), A_g = Σ p and B_g = Σ (1−p) of group
  g, the area under it is

      AUC_est = [Σ_g A_g·Σ_{h<g} B_h + ½·Σ_g A_g·B_g] / (Σ A · Σ B),

  the trapezoidal area of CBPE's expected TPR against expected FPR over the thresholds. It
  differs from E[U]/E[P·N] only by the pairs of a row with itself (the ½·A_g·B_g term
  includes them), an O(1/n) difference.

The estimates are only as good as the calibration: the gap ``estimate − measured`` is the
error a label-free monitor would make, and a shift that breaks calibration shows up there.

**Estimators** (:data:`LABEL_FREE_ESTIMATORS`, each with its assumption). Garg et al. (ICLR
2022) prove that none works under every shift, so each is paired with a drift verdict
(:mod:`ctrcal.metrics._drift`):

* ``cbpe``: the estimates above, from the analysis' probabilities alone.
* ``iw_cbpe`` (:func:`importance_weighted_estimates`): CBPE on probabilities recalibrated on
  the labelled reference, each reference row weighted by the density ratio
  p_analysis(x) / p_reference(x) (from the domain classifier). Under a covariate shift
  (P(y | x) unchanged) the weighted reference has the analysis' joint law of (p, y), so the
  recalibrated probabilities are calibrated on the analysis and CBPE is right again, even
  where the model ignores a feature that moved. Weights are normalised to mean 1 and clipped
  at :data:`MAX_WEIGHT`: a few reference rows with a huge ratio would otherwise carry the
  whole estimate; the clip pulls the estimate towards the reference's where the analysis
  leaves the reference's support, which the drift alarm reports.
* ``doc`` (:func:`doc_estimates`): difference of confidences (Guillory et al., ICCV 2021):
  the reference's measured value plus the change of the model's self-expectation,
  measured_ref + CBPE(analysis) − CBPE(reference). DoC is stated for accuracy, with the mean
  confidence as the self-expectation; CBPE's estimate is that self-expectation for any metric,
  AUC included. ATC (Garg et al.) is not offered: it counts rows above a confidence threshold,
  which estimates a per-row accuracy, and AUC is a property of pairs with no per-row
  correctness whose mean it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_probs_labels
from ctrcal.metrics._metrics import DEFAULT_EPS
from ctrcal.metrics._registry import declare_metric

__all__ = [
    "ESTIMATED_METRICS",
    "LABEL_FREE_ESTIMATORS",
    "LABEL_FREE_METRICS",
    "MAX_WEIGHT",
    "check_probs",
    "doc_estimates",
    "doc_gap",
    "estimate_key",
    "expected_auc",
    "importance_weighted_estimates",
    "label_free_errors",
    "label_free_estimates",
]

LABEL_FREE_METRICS = ("auc", "logloss", "ne", "click_rate", "brier")

# estimator -> its assumption (what must hold for the estimate to be right)
LABEL_FREE_ESTIMATORS: dict[str, str] = {
    "cbpe": "the probabilities are calibrated on the analysis rows (no concept shift, no "
    "rows outside the training support).",
    "iw_cbpe": "P(y | x) is the reference's (a covariate shift), the analysis lies inside the "
    "reference's support, and the domain classifier's density ratios are right.",
    "doc": "the gap between the model's self-expected and measured value is the reference's "
    "(the miscalibration does not change with the shift).",
}
# metrics every estimator estimates
ESTIMATED_METRICS = ("auc", "logloss")
MAX_WEIGHT = 20.0  # importance weights clipped at 20 × their mean
CALIBRATION_BINS = 50  # equal-mass bins of the importance-weighted recalibration


def check_probs(probs: Any) -> np.ndarray:
    """[n] probabilities as float64; ValueError naming ``probs`` for NaN or values outside [0,
    1]."""
    p = as_numpy(probs, "probs")
    if p.size == 0:
        raise ValueError("probs is empty (no rows to evaluate)")
    p = p.astype(np.float64, copy=False)
    bad = ~np.isfinite(p) | (p < 0.0) | (p > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"probs: row {i}: {float(p[i])!r} is not a probability in [0, 1]")
    return p


def expected_auc(probs: Any) -> float:
    """CBPE's AUC estimate from probabilities alone (module docstring); O(n log n).

    Args:
        probs: [n] predicted click probabilities (also the scores that rank the rows).

    Returns:
        The estimate, or NaN when Σp or Σ(1−p) is 0 (all rows certain).
    """
    ps = np.sort(check_probs(probs))
    return _expected_auc(ps, ps)


def _expected_auc(ps: np.ndarray, qs: np.ndarray) -> float:
    """The expected AUC of rows ranked by their scores ``ps`` (ascending) whose clicks are
    coins of probability ``qs`` (module docstring, with A_g = Σ q and B_g = Σ (1 − q) over
    equal scores).

    Only the groups of equal scores matter, not the order inside one: callers whose ``q`` is
    a function of the score (CBPE's q = p, a recalibration's q = f(p)) sort the scores alone,
    several times cheaper than an argsort and its gathers, and every group sums equal
    values, so the result does not depend on the order of ties.

    Args:
        ps: [n] scores, sorted ascending.
        qs: [n] click probability of each of those rows.
    """
    start = np.empty(ps.shape[0], dtype=bool)
    start[0] = True
    np.not_equal(ps[1:], ps[:-1], out=start[1:])
    first = np.flatnonzero(start)
    a = np.add.reduceat(qs, first)  # expected clicks per group of equal score
    b = np.add.reduceat(1.0 - qs, first)  # expected non-clicks
    total_a, total_b = float(a.sum()), float(b.sum())
    if total_a <= 0.0 or total_b <= 0.0:
        return float("nan")
    below = np.cumsum(b) - b
    return float((np.dot(a, below) + 0.5 * np.dot(a, b)) / (total_a * total_b))


def _entropy(q: np.ndarray) -> np.ndarray:
    qc = np.clip(q, DEFAULT_EPS, 1.0 - DEFAULT_EPS)
    return -(q * np.log(qc) + (1.0 - q) * np.log1p(-qc))


def label_free_estimates(probs: Any) -> dict[str, float]:
    """Every label-free estimate (module docstring) of one set of predictions.

    Args:
        probs: [n] predicted click probabilities.

    Returns:
        ``{"auc", "logloss", "ne", "click_rate", "brier"}`` -> float.
    """
    p = check_probs(probs)
    rate = float(p.mean())
    ll = float(_entropy(p).mean())
    h = float(_entropy(np.array([rate]))[0]) if 0.0 < rate < 1.0 else float("nan")
    ps = np.sort(p)
    return {
        "auc": _expected_auc(ps, ps),
        "logloss": ll,
        "ne": ll / h if h > 0 else float("nan"),
        "click_rate": rate,
        "brier": float(np.mean(p * (1.0 - p))),
    }


def label_free_errors(probs: Any, labels: Any, measured: dict[str, float]) -> dict[str, float]:
    """Estimate, measured value and error (estimate − measured) of every label-free metric.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1 (for the click rate).
        measured: the measured metrics of these rows (``auc``, ``logloss``, ``ne``,
            ``brier``), e.g. :func:`~ctrcal.metrics.compute_all`.

    Returns:
        ``{"<m>_est", "<m>_measured", "<m>_est_err"}`` for every ``m`` in
        :data:`LABEL_FREE_METRICS`.
    """
    p, y = check_probs_labels(probs, labels)
    est = label_free_estimates(p)
    truth = {**measured, "click_rate": float(y.mean())}
    out = {}
    for m in LABEL_FREE_METRICS:
        t = float(truth.get(m, float("nan")))
        out.update({f"{m}_est": est[m], f"{m}_measured": t, f"{m}_est_err": est[m] - t})
    return out


def _expected_logloss(probs: np.ndarray, q: np.ndarray) -> float:
    """Expected logloss of ``probs`` when the clicks are coins of probability ``q``."""
    pc = np.clip(probs, DEFAULT_EPS, 1.0 - DEFAULT_EPS)
    return float(-np.mean(q * np.log(pc) + (1.0 - q) * np.log1p(-pc)))


def importance_weighted_estimates(
    reference_probs: Any, reference_labels: Any, weights: Any, probs: Any
) -> dict[str, float]:
    """``iw_cbpe``: CBPE after a recalibration fitted on the importance-weighted reference
    (module docstring).

    Args:
        reference_probs: [r] the model's probabilities on labelled reference rows.
        reference_labels: [r] their clicks, 0/1.
        weights: [r] density ratios p_analysis(x) / p_reference(x) of those rows (any
            scale: normalised to mean 1, then clipped at :data:`MAX_WEIGHT`).
        probs: [n] the model's probabilities on the analysis rows.

    Returns:
        ``{"auc", "logloss"}``: the analysis rows ranked by ``probs``, their clicks coins of
        the recalibrated probabilities (weighted isotonic regression of the reference's click
        rate on its probabilities over :data:`CALIBRATION_BINS` equal-mass bins, linearly
        interpolated).
    """
    from sklearn.isotonic import IsotonicRegression

    rp, ry = check_probs_labels(reference_probs, reference_labels)
    w = as_numpy(weights, "weights").astype(np.float64)
    if w.shape != rp.shape:
        raise ValueError(f"weights: expected {rp.shape[0]} values, got {w.shape[0]}")
    if not np.all(np.isfinite(w) & (w >= 0)) or w.sum() <= 0:
        raise ValueError("weights: expected finite values >= 0, not all 0")
    w = np.minimum(w / w.mean(), MAX_WEIGHT)
    p = check_probs(probs)
    # isotonic regression over CALIBRATION_BINS equal-mass bins of the reference's p (each
    # bin's weighted mean p and click rate), interpolated: a fit on every row steps with the
    # noise of the clicks, and those steps read as resolution the model does not have
    order = np.argsort(rp, kind="stable")
    bins = np.array_split(order, min(CALIBRATION_BINS, rp.size))
    weight = np.array([w[b].sum() for b in bins])
    keep = weight > 0
    centre = np.array([np.average(rp[b], weights=w[b]) if w[b].sum() > 0 else 0.0 for b in bins])
    rate = np.array([np.average(ry[b], weights=w[b]) if w[b].sum() > 0 else 0.0 for b in bins])
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(centre[keep], rate[keep], sample_weight=weight[keep])
    q = np.clip(iso.predict(p), 0.0, 1.0)
    ps = np.sort(p)  # the recalibration is a function of p: q of the sorted rows is f(ps)
    auc = _expected_auc(ps, np.clip(iso.predict(ps), 0.0, 1.0))
    return {"auc": auc, "logloss": _expected_logloss(p, q)}


def doc_gap(reference_probs: Any, reference_labels: Any) -> dict[str, float]:
    """DoC's correction: measured − CBPE's estimate on the labelled reference, per metric of
    :data:`ESTIMATED_METRICS` (computed once, for every chunk :func:`doc_estimates` reads)."""
    from ctrcal.metrics._metrics import auc, logloss

    rp, ry = check_probs_labels(reference_probs, reference_labels)
    est = label_free_estimates(rp)
    measured = {"auc": auc(rp, ry), "logloss": logloss(rp, ry)}
    return {m: measured[m] - est[m] for m in ESTIMATED_METRICS}


def doc_estimates(
    reference_probs: Any,
    reference_labels: Any,
    probs: Any,
    gap: dict[str, float] | None = None,
    estimates: dict[str, float] | None = None,
) -> dict[str, float]:
    """``doc``: measured on the reference plus the change of CBPE's estimate (module
    docstring), i.e. CBPE(analysis) + (measured − CBPE) on the reference.

    Args:
        reference_probs: [r] the model's probabilities on labelled reference rows.
        reference_labels: [r] their clicks, 0/1.
        probs: [n] the model's probabilities on the analysis rows.
        gap: :func:`doc_gap` of the reference, when already computed (the reference
            arguments are then not read).
        estimates: :func:`label_free_estimates` of ``probs``, when already computed.

    Returns:
        ``{"auc", "logloss"}``.
    """
    if gap is None:
        gap = doc_gap(reference_probs, reference_labels)
    est = label_free_estimates(probs) if estimates is None else estimates
    return {m: est[m] + gap[m] for m in ESTIMATED_METRICS}


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

_NAMES = {
    "auc": "AUC",
    "logloss": "logloss",
    "ne": "NE",
    "click_rate": "click rate",
    "brier": "Brier",
}
_ESTIMATES = {
    "auc": (
        "higher",
        "label-free AUC estimate (CBPE): the AUC the predictions expect if calibrated, from "
        "probabilities alone.",
    ),
    "logloss": (
        "lower",
        "label-free logloss estimate: mean entropy of the predicted probabilities.",
    ),
    "ne": ("lower", "label-free NE estimate: the logloss estimate over the entropy of the mean p."),
    "click_rate": (None, "label-free click rate estimate: the mean predicted probability."),
    "brier": ("lower", "label-free Brier estimate: mean p·(1 − p)."),
}
for _m, (_better, _definition) in _ESTIMATES.items():
    declare_metric(
        f"{_m}_est",
        label=f"{_NAMES[_m]} estimate (no labels)",
        definition=_definition,
        better=_better,
        compute=lambda probs, _m=_m: label_free_estimates(probs)[_m],
        kind="label_free",
        section="label-free",
    )
    declare_metric(
        f"{_m}_est_err",
        label=f"{_NAMES[_m]} estimate − measured",
        definition=f"{_NAMES[_m]} estimate − measured {_NAMES[_m]}: the error a label-free "
        "monitor makes.",
        better=None,
        computed_by="label_free_errors",
        kind="derived",
        section="label-free",
    )


def estimate_key(metric: str, estimator: str) -> str:
    """The result key of ``estimator``'s estimate of ``metric``: CBPE's is ``auc_est``,
    another's ``auc_est_<estimator>`` (``auc_est_iw_cbpe``)."""
    if estimator not in LABEL_FREE_ESTIMATORS:
        raise ValueError(
            f"unknown estimator {estimator!r} (valid: {', '.join(LABEL_FREE_ESTIMATORS)})"
        )
    return f"{metric}_est" if estimator == "cbpe" else f"{metric}_est_{estimator}"


declare_metric(
    "auc_est_chunk_err",
    label="AUC estimate (CBPE) − measured, per chunk",
    definition="CBPE's AUC estimate − measured AUC, per chunk of the evaluated split, averaged "
    "(as the other estimators' errors are measured).",
    better=None,
    computed_by="ShiftMonitor",
    kind="derived",
    section="label-free",
)
_ESTIMATOR_NAMES = {"iw_cbpe": "importance-weighted CBPE", "doc": "DoC"}
for _e, _title in _ESTIMATOR_NAMES.items():
    for _m in ESTIMATED_METRICS:
        declare_metric(
            estimate_key(_m, _e),
            label=f"{_NAMES[_m]} estimate ({_title})",
            definition=f"label-free {_NAMES[_m]} estimate by {_title}; assumes "
            + LABEL_FREE_ESTIMATORS[_e],
            better=_ESTIMATES[_m][0],
            computed_by="importance_weighted_estimates" if _e == "iw_cbpe" else "doc_estimates",
            kind="label_free",
            section="label-free",
        )
    declare_metric(
        f"{estimate_key('auc', _e)}_err",
        label=f"AUC estimate ({_title}) − measured",
        definition=f"AUC estimate by {_title} − measured AUC, per chunk of the evaluated "
        "split, averaged: the error that monitor makes.",
        better=None,
        computed_by="ShiftMonitor",
        kind="derived",
        section="label-free",
    )
