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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_probs_labels
from ctrcal.metrics._metrics import DEFAULT_EPS
from ctrcal.metrics._registry import declare_metric

__all__ = [
    "LABEL_FREE_METRICS",
    "check_probs",
    "expected_auc",
    "label_free_errors",
    "label_free_estimates",
]

LABEL_FREE_METRICS = ("auc", "logloss", "ne", "click_rate", "brier")


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
    p = check_probs(probs)
    ps = np.sort(p)
    start = np.empty(ps.shape[0], dtype=bool)
    start[0] = True
    np.not_equal(ps[1:], ps[:-1], out=start[1:])
    first = np.flatnonzero(start)
    a = np.add.reduceat(ps, first)  # expected clicks per group of equal p
    b = np.add.reduceat(1.0 - ps, first)  # expected non-clicks
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
    return {
        "auc": expected_auc(p),
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
