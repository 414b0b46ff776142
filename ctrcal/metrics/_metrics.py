"""Ranking and calibration metrics for click probabilities.

Every function takes ``probs`` (predicted click probabilities ``p_i`` in [0, 1]) and
``labels`` (clicks ``y_i`` in {0, 1}), each a 1-D numpy array or torch tensor of the same
length n (any device; moved to the host), and returns a Python float. Everything is
vectorised and at most O(n log n).

"Confidence" for a click model: every calibration metric here bins the predicted click
probability ``p`` itself and compares it with the observed click rate, i.e. it asks "of the
impressions we gave a 3 % click probability, did 3 % click?". This is the binary semantics of
``torchmetrics.classification.BinaryCalibrationError`` (which bins ``preds`` against
``target``), not the top-label confidence ``max(p, 1 - p)`` of multi-class ECE; the latter
would fold a 3 % prediction into the 97 % bin and measure the calibration of "no click".

Definitions (n rows, P positives, N negatives, ȳ = P / n):

* ``auc``: P(p_pos > p_neg) + ½ P(p_pos = p_neg), from average ranks (Mann-Whitney U);
  equals ``sklearn.metrics.roc_auc_score``. NaN when only one class is present.
* ``logloss``: -(1/n) Σ [y log p + (1-y) log(1-p)], p clipped to [eps, 1-eps].
* ``brier``: (1/n) Σ (p - y)².
* ``ece``: Σ_b (n_b / n) |ȳ_b - p̄_b| over bins b of p (15 equal-width bins on [0, 1] by
  default, ``strategy="uniform"``; or equal-mass bins, ``strategy="quantile"``).
* ``pcoc``: Σ p / Σ y, predicted over observed clicks (1 = calibrated on average; NaN when
  there is no click).
* ``normalized_entropy``: logloss / H(q) with H(q) = -q log q - (1-q) log(1-q). By default
  q = ȳ, the click rate *of the evaluated rows*: the logloss relative to always predicting
  that rate (< 1 beats it; NaN if ȳ is 0 or 1). Under a shift that moves the base rate this
  normaliser moves with it; ``base_rate=`` the training click rate gives He et al.'s NE
  ("Practical Lessons from Predicting Clicks on Ads at Facebook", ADKDD 2014), normalised
  by the entropy of the background (training) CTR.
* ``calibration_free_ne``: NE after shifting every logit by one constant b so that
  Σ sigmoid(logit p + b) = Σ y (predicted clicks equal observed clicks): the part of NE that
  no global recalibration can fix. MCGrad's ``calibration_free_normalized_entropy`` reaches
  the same fixed point by repeated odds rescaling; here b is solved by Newton's method.

Field-level metrics (Field-RCE, Field-ECE, PCOC per value) live in
:mod:`ctrcal.metrics._field`, the bin-free ones (ECCE, multicalibration error) in
:mod:`ctrcal.metrics._ecce`; both are re-exported here, and :func:`calibration_summary` computes
all of them at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from ctrcal.metrics._ecce import (
    ecce_test,
    multicalibration_error,
)
from ctrcal.metrics._field import (
    field_calibration,
)
from ctrcal.metrics._inputs import as_numpy as _as_numpy
from ctrcal.metrics._inputs import check_fields
from ctrcal.metrics._inputs import check_probs_labels as _check
from ctrcal.metrics._registry import declare_metric

__all__ = [
    "ReliabilityCurve",
    "auc",
    "average_precision",
    "brier",
    "calibration_free_ne",
    "calibration_summary",
    "compute_all",
    "ece",
    "logloss",
    "normalized_entropy",
    "pcoc",
    "reliability_curve",
]

DEFAULT_EPS = 1e-7


def auc(probs: Any, labels: Any) -> float:
    """ROC AUC with ties counted ½ (equals ``sklearn.metrics.roc_auc_score``).

    Computed from average ranks: (Σ rank(positives) − P(P+1)/2) / (P·N), one sort, O(n log n).

    Args:
        probs: [n] scores: probabilities, logits or any finite score (only the order counts).
        labels: [n] 0/1.

    Returns:
        The AUC, or NaN when ``labels`` holds a single class.
    """
    p, y = _check(probs, labels, unit=False)
    n = p.shape[0]
    n_pos = float(y.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="stable")
    sp = p[order]
    starts_mask = np.empty(n, dtype=bool)
    starts_mask[0] = True
    np.not_equal(sp[1:], sp[:-1], out=starts_mask[1:])
    starts = np.flatnonzero(starts_mask)
    ends = np.append(starts[1:], n)
    # 1-based ranks starts+1 .. ends share their mean
    avg_rank = (starts + 1 + ends) / 2.0
    group = np.cumsum(starts_mask) - 1
    rank_sum_pos = float(np.dot(avg_rank[group], y[order]))
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def average_precision(probs: Any, labels: Any, sample_weight: Any = None) -> float:
    """Average precision, the area under the precision-recall curve as a step function:
    Σ_k (R_k − R_{k−1})·P_k over the distinct scores k from the highest down, with P_k and R_k
    the precision and recall of the rows scored at least k (tied rows enter together).

    Equals ``sklearn.metrics.average_precision_score``. Unlike AUC it depends on the click
    rate: a random ranking scores the click rate, a perfect one 1. One sort, O(n log n).

    Args:
        probs: [n] scores: probabilities, logits or any finite score (only the order counts).
        labels: [n] 0/1.
        sample_weight: optional [n] weights >= 0 (a row counted w times, as a bootstrap
            replicate counts its rows).

    Returns:
        The average precision, or NaN when there is no (weighted) click.
    """
    p, y = _check(probs, labels, unit=False)
    w = np.ones_like(y) if sample_weight is None else _as_numpy(sample_weight, "sample_weight")
    if w.shape != y.shape or not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError(f"sample_weight: expected {y.shape[0]} finite weights >= 0")
    w = w.astype(np.float64, copy=False)
    clicks = float(np.dot(w, y))
    if clicks == 0:
        return float("nan")
    order = np.argsort(-p, kind="stable")
    sp = p[order]
    last = np.append(sp[1:] != sp[:-1], True)  # the last row of each run of equal scores
    tp = np.cumsum(w[order] * y[order])[last]
    rows = np.cumsum(w[order])[last]
    recall_step = np.diff(tp, prepend=0.0) / clicks
    precision = np.divide(tp, rows, out=np.zeros_like(tp), where=rows > 0)
    return float(np.dot(recall_step, precision))


def logloss(probs: Any, labels: Any, eps: float = DEFAULT_EPS) -> float:
    """Mean binary cross-entropy, −mean[y log p + (1−y) log(1−p)], p clipped to [eps, 1−eps]."""
    p, y = _check(probs, labels)
    p = np.clip(p.astype(np.float64), eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def brier(probs: Any, labels: Any) -> float:
    """Brier score, mean[(p − y)²]."""
    p, y = _check(probs, labels)
    return float(np.mean((p.astype(np.float64) - y) ** 2))


def pcoc(probs: Any, labels: Any) -> float:
    """Predicted over observed clicks, Σp / Σy (NaN when there is no click)."""
    p, y = _check(probs, labels)
    clicks = float(y.sum())
    return float(p.astype(np.float64).sum() / clicks) if clicks > 0 else float("nan")


def _binary_entropy(q: float) -> float:
    if q <= 0.0 or q >= 1.0:
        return float("nan")
    return float(-(q * np.log(q) + (1.0 - q) * np.log1p(-q)))


def normalized_entropy(
    probs: Any, labels: Any, eps: float = DEFAULT_EPS, base_rate: float | None = None
) -> float:
    """Normalized entropy: logloss / H(q), H the binary entropy.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] 0/1.
        eps: logloss clipping.
        base_rate: q; ``None`` (default) is the click rate of these rows, so NE compares
            with the best constant predictor for them. Pass the *training* click rate for
            He et al. (2014)'s NE, whose normaliser does not move when a shift moves the
            evaluated base rate.

    Returns:
        NE (< 1 beats the constant), or NaN when q is 0 or 1 (a single class).
    """
    p, y = _check(probs, labels)
    q = float(y.mean()) if base_rate is None else _check_base_rate(base_rate)
    h = _binary_entropy(q)
    if np.isnan(h):
        return float("nan")
    return logloss(p, y, eps=eps) / h


def _check_base_rate(base_rate: Any) -> float:
    q = float(base_rate)
    if not 0.0 < q < 1.0:
        raise ValueError(f"base_rate: expected a click rate in (0, 1), got {base_rate!r}")
    return q


def calibration_free_ne(
    probs: Any,
    labels: Any,
    eps: float = DEFAULT_EPS,
    base_rate: float | None = None,
    max_iter: int = 50,
) -> float:
    """NE after the one logit shift b that makes Σp = Σy (see the module docstring).

    Solves Σ sigmoid(logit(p_i) + b) = Σ y by Newton's method on b (the left side is
    increasing in b), so the result does not depend on the global calibration of ``probs``;
    O(n) per iteration, a handful of iterations.

    Args:
        probs: [n] predicted click probabilities (clipped to [eps, 1 − eps] for the logit).
        labels: [n] 0/1.
        eps: logit and logloss clipping.
        base_rate: NE's normaliser, as in :func:`normalized_entropy`.
        max_iter: Newton iterations at most.

    Returns:
        The calibration-free NE, or NaN when the rows hold a single class.
    """
    p, y = _check(probs, labels)
    clicks = float(y.sum())
    if clicks == 0.0 or clicks == y.shape[0]:
        return float("nan")
    pc = np.clip(p.astype(np.float64), eps, 1.0 - eps)
    z = np.log(pc) - np.log1p(-pc)
    b = 0.0
    if z.shape[0] > 400_000:  # a warm start from every k-th row saves full Newton passes
        step = z.shape[0] // 200_000
        sub_clicks = float(y[::step].sum())
        if 0.0 < sub_clicks < z[::step].shape[0]:
            b = _logit_shift(z[::step], sub_clicks, 0.0, max_iter, tol=1e-6)
    b = _logit_shift(z, clicks, b, max_iter, tol=1e-10)
    shifted = 0.5 * (1.0 + np.tanh(0.5 * (z + b)))
    return normalized_entropy(shifted, y, eps=eps, base_rate=base_rate)


def _logit_shift(z: np.ndarray, clicks: float, b: float, max_iter: int, tol: float) -> float:
    """b with Σ sigmoid(z + b) = clicks (to tol·clicks), by Newton's method from ``b``."""
    for _ in range(max_iter):
        s = 0.5 * (1.0 + np.tanh(0.5 * (z + b)))
        gap = float(s.sum()) - clicks
        if abs(gap) <= tol * max(clicks, 1.0):
            break
        slope = float(np.dot(s, 1.0 - s))
        step = gap / max(slope, 1e-300)
        b -= float(np.clip(step, -5.0, 5.0))  # a bounded step keeps extreme starts stable
    return b


@dataclass(frozen=True)
class ReliabilityCurve:
    """Binned calibration data (one entry per bin; empty bins hold NaN means).

    Attributes:
        edges: [nb+1] bin edges in probability space.
        mean_prob: [nb] mean predicted probability p̄_b in each bin.
        frac_pos: [nb] observed click rate ȳ_b in each bin.
        counts: [nb] rows in each bin.
    """

    edges: np.ndarray
    mean_prob: np.ndarray
    frac_pos: np.ndarray
    counts: np.ndarray

    @property
    def weights(self) -> np.ndarray:
        """n_b / n."""
        return self.counts / max(self.counts.sum(), 1)

    def ece(self) -> float:
        """Σ_b (n_b / n) |ȳ_b − p̄_b| over non-empty bins."""
        keep = self.counts > 0
        gap = np.abs(self.frac_pos[keep] - self.mean_prob[keep])
        return float(np.sum(self.weights[keep] * gap))


def reliability_curve(
    probs: Any,
    labels: Any,
    n_bins: int = 15,
    strategy: Literal["uniform", "quantile"] = "uniform",
) -> ReliabilityCurve:
    """Bin rows by predicted probability and compare mean p with the click rate per bin.

    ``uniform``: ``n_bins`` equal-width bins ``[k/n_bins, (k+1)/n_bins)`` whose edges are
    ``torch.linspace(0, 1, n_bins + 1)`` in the dtype of ``probs`` (so float32 boundary cases
    land where torchmetrics puts them); as in torchmetrics, a probability of exactly 1.0 falls
    in one extra, last bin ``[1, 1]``, so ``counts`` has ``n_bins + 1`` entries.

    ``quantile``: equal-mass bins: rows sorted by p (stable) and cut into ``n_bins`` groups
    whose sizes differ by at most one; tied probabilities may straddle a cut. ``edges`` are the
    lowest p of each group plus the maximum.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] 0/1.
        n_bins: number of bins (≥ 1).
        strategy: ``"uniform"`` or ``"quantile"``.
    """
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    p, y = _check(probs, labels)
    return _curve(p, y, int(n_bins), strategy)


def _curve(
    p: np.ndarray, y: np.ndarray, n_bins: int, strategy: str, order: np.ndarray | None = None
) -> ReliabilityCurve:
    """:func:`reliability_curve` of validated arrays; ``order``: a stable argsort of p."""
    if strategy == "uniform":
        edges = _uniform_edges(int(n_bins), p.dtype)
        idx = np.searchsorted(edges, p, side="right") - 1
        nb = int(n_bins) + 1
    elif strategy == "quantile":
        n = p.shape[0]
        if order is None:
            order = np.argsort(p, kind="stable")
        nb = min(int(n_bins), n)
        # group g gets sorted positions [g*n//nb, (g+1)*n//nb)
        idx = np.empty(n, dtype=np.int64)
        idx[order] = (np.arange(n) * nb) // n
        starts = (np.arange(nb) * n) // nb
        edges = np.append(p[order][starts], p[order][-1]).astype(np.float64)
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    sum_p = np.bincount(idx, weights=p.astype(np.float64), minlength=nb)
    sum_y = np.bincount(idx, weights=y, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.where(counts > 0, sum_p / counts, np.nan)
        frac_pos = np.where(counts > 0, sum_y / counts, np.nan)
    return ReliabilityCurve(edges, mean_prob, frac_pos, counts)


def _uniform_edges(n_bins: int, dtype: np.dtype) -> np.ndarray:
    """[n_bins + 1] float64: ``torch.linspace(0, 1, n_bins + 1)`` in ``dtype`` (float64, else
    float32), the edges torchmetrics bins by, computed without importing torch.

    torch's CPU kernel takes ``step = 1 / n_bins`` rounded to the dtype, then edge ``k`` is
    ``step * k`` for the lower half and ``1 - step * (n_bins - k)`` for the upper half, each
    rounded once from its exact value (a fused multiply-add): the same here, from exact
    arithmetic (float64 holds the float32 case exactly; fractions the float64 case).
    """
    half = (n_bins + 1) // 2
    if dtype == np.float64:
        step = Fraction(1.0 / n_bins)  # IEEE division: 1 / n_bins correctly rounded
        edges = [step * k if k < half else 1 - step * (n_bins - k) for k in range(n_bins + 1)]
        return np.array([float(e) for e in edges])  # float(Fraction) rounds correctly
    step = float(np.float32(1.0) / np.float32(n_bins))
    k = np.arange(n_bins + 1, dtype=np.float64)
    exact = np.where(k < half, step * k, 1.0 - step * (n_bins - k))  # exact: 24 + 31 bits
    return exact.astype(np.float32).astype(np.float64)


def ece(
    probs: Any,
    labels: Any,
    n_bins: int = 15,
    strategy: Literal["uniform", "quantile"] = "uniform",
) -> float:
    """Expected calibration error Σ_b (n_b/n) |ȳ_b − p̄_b| of the predicted click probability.

    With the defaults it equals ``torchmetrics.classification.BinaryCalibrationError(
    n_bins=15, norm="l1")`` on probabilities: bins over p itself (not max(p, 1−p)), see the
    module docstring. ``strategy="quantile"`` uses equal-mass bins instead, see
    :func:`reliability_curve`.
    """
    return reliability_curve(probs, labels, n_bins=n_bins, strategy=strategy).ece()


def compute_all(probs: Any, labels: Any, n_bins: int = 15) -> dict[str, float]:
    """The global metrics of one set of predictions (each declared below).

    Returns:
        ``{"auc", "logloss", "brier", "ece", "ece_mass", "pcoc", "ne"}`` -> float.
    """
    p, y = _check(probs, labels)
    return _global_metrics(p, y, n_bins, None, with_auc=True)


def _global_metrics(
    p: np.ndarray, y: np.ndarray, n_bins: int, order: np.ndarray | None, with_auc: bool
) -> dict[str, float]:
    # validated once by the caller; each metric below would otherwise re-check n rows
    p64 = p.astype(np.float64, copy=False)
    pc = np.clip(p64, DEFAULT_EPS, 1.0 - DEFAULT_EPS)
    ll = float(-np.mean(y * np.log(pc) + (1.0 - y) * np.log1p(-pc)))
    h = _binary_entropy(float(y.mean()))
    clicks = float(y.sum())
    out = {"auc": auc(p, y)} if with_auc else {}
    out.update(
        logloss=ll,
        brier=float(np.mean((p64 - y) ** 2)),
        ece=_curve(p, y, n_bins, "uniform").ece(),
        ece_mass=_curve(p, y, n_bins, "quantile", order).ece(),
        pcoc=float(p64.sum() / clicks) if clicks > 0 else float("nan"),
        ne=ll / h if not np.isnan(h) else float("nan"),
    )
    return out


def calibration_summary(
    probs: Any,
    labels: Any,
    fields: Any = None,
    *,
    names: Sequence[str] | None = None,
    n_bins: int = 15,
    base_rate: float | None = None,
    min_count: int = 100,
    with_auc: bool = True,
    per_field: bool = True,
    mce_max_depth: int = 3,
    mce_max_segments: int = 1000,
    mce_max_rows: int | None = 250_000,
) -> dict[str, float]:
    """Every global, bin-free and field-level metric of one set of predictions.

    The one call a report makes per evaluation: :func:`compute_all`'s metrics plus ECCE
    (with σ, ECCE/σ and p-value), the calibration-free NE and, with ``fields``, Field-RCE /
    Field-ECE (mean and worst field, and per field) and the multicalibration error.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        fields: optional [n, F] integer codes (or a mapping name -> [n] codes).
        names: F field names for an array.
        n_bins: ECE bins.
        base_rate: the training click rate; adds ``ne_train`` (He et al. 2014's NE).
        min_count: Field-RCE/ECE pool values with fewer rows.
        with_auc: include AUC (skip it when only calibration is wanted).
        per_field: include ``field_rce:<name>`` / ``field_ece:<name>`` per field.
        mce_max_depth, mce_max_segments, mce_max_rows: see :func:`multicalibration_error`.

    Returns:
        Metric name -> float: :func:`compute_all`'s, ``ecce``, ``ecce_std``, ``ecce_sigmas``,
        ``ecce_pvalue``, ``ne_calfree`` (``ne_train`` with ``base_rate``) and, with fields,
        ``field_rce_mean``, ``field_rce_max``, ``field_ece_mean``, ``field_ece_max``,
        ``field_rce:<field>``, ``field_ece:<field>``, ``mce``, ``mce_sigmas``,
        ``mce_relative``, ``mce_pvalue``, ``mce_pvalue_unadjusted`` and ``mce_segments``
        (each declared in :data:`~ctrcal.metrics.METRICS`).
    """
    p, y = _check(probs, labels)
    order = np.argsort(p, kind="stable")  # shared by equal-mass ECE and ECCE
    out = _global_metrics(p, y, n_bins, order, with_auc)
    t = ecce_test(p, y, order=order)
    out.update(ecce=t.ecce, ecce_std=t.std, ecce_sigmas=t.sigmas, ecce_pvalue=t.pvalue)
    out["ne_calfree"] = calibration_free_ne(p, y)
    if base_rate is not None:
        out["ne_train"] = normalized_entropy(p, y, base_rate=base_rate)
    if fields is None:
        return out
    checked = check_fields(fields, p.shape[0], names)  # once for both field metrics
    fc = field_calibration(p, y, checked, min_count=min_count, top_k=0)
    summary = fc.summary()
    for key in ("field_rce_mean", "field_rce_max", "field_ece_mean", "field_ece_max"):
        out[key] = summary[key]
    if per_field:
        for name, stats in fc.fields.items():
            out[f"field_rce:{name}"] = stats.rce
            out[f"field_ece:{name}"] = stats.ece
    mc = multicalibration_error(
        p,
        y,
        checked,
        max_depth=mce_max_depth,
        max_segments=mce_max_segments,
        max_rows=mce_max_rows,
    )
    out.update(
        mce=mc.mce,
        mce_sigmas=mc.sigmas,
        mce_relative=mc.relative,
        mce_pvalue=mc.pvalue_adjusted,
        mce_pvalue_unadjusted=mc.pvalue,
        mce_segments=float(mc.n_segments),
    )
    return out


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

_GLOBAL = "compute_all"
declare_metric(
    "auc",
    label="AUC",
    definition="ROC AUC: probability that a random click is scored above a random non-click "
    "(ties count ½); higher is better.",
    better="higher",
    compute=auc,
    section="ranking",
    tables=("calibration", "shift", "compared"),
    bounds=(0.0, 1.0),
)
declare_metric(
    "auc_retained",
    label="AUC retained vs clean (AUC_s / AUC_0)",
    definition="AUC under the shift divided by the clean AUC of the same run (per seed, then "
    "averaged); higher means more of the clean ranking quality survives.",
    better="higher",
    computed_by="the shift report, from the AUC of each seed clean and shifted",
    kind="derived",
    section="ranking",
    tables=("shift", "compared"),
)
declare_metric(
    "prauc",
    label="PR-AUC (average precision)",
    definition="average precision, Σ_k (R_k − R_{k−1})·P_k over thresholds k from the highest "
    "score down (sklearn's average_precision_score): the area under the precision–recall "
    "curve; a random ranking scores the click rate; higher is better.",
    better="higher",
    compute=average_precision,
    weighted=True,
    section="ranking",
    tables=("calibration",),
    bounds=(0.0, 1.0),
)
declare_metric(
    "ece",
    label="ECE",
    definition="expected calibration error, Σ_b (n_b/n)·|click rate_b − mean p_b| over 15 "
    "equal-width bins of the predicted click probability p (torchmetrics "
    "BinaryCalibrationError, norm='l1'); lower is better.",
    better="lower",
    compute=ece,
    computed_by=_GLOBAL,
    tables=("calibration", "shift", "compared"),
    bounds=(0.0, 1.0),
)
declare_metric(
    "ece_mass",
    label="ECE (15 equal-mass bins)",
    definition="the same ECE over 15 equal-mass bins (each holds n/15 rows sorted by p), "
    "which resolves the low-probability range where CTR predictions live; lower is better.",
    better="lower",
    computed_by=_GLOBAL,
    tables=("calibration", "shift", "compared"),
    bounds=(0.0, 1.0),
)
declare_metric(
    "pcoc",
    label="PCOC (Σp / Σy)",
    definition="predicted over observed clicks, Σp / Σy; 1 is calibrated on average, > 1 "
    "over-predicts.",
    better=None,
    compute=pcoc,
    tables=("calibration", "shift"),
)
declare_metric(
    "pcoc_error",
    label="|PCOC − 1|",
    definition="distance of PCOC from 1, |Σp / Σy − 1|: how PCOC is compared between "
    "variants; lower is better.",
    better="lower",
    computed_by="the shift report, from PCOC",
    kind="derived",
    tables=("compared",),
)
declare_metric(
    "logloss",
    label="Logloss",
    definition="mean negative log-likelihood −mean[y·log p + (1−y)·log(1−p)], p clipped to "
    "[1e-7, 1−1e-7]; lower is better.",
    better="lower",
    compute=logloss,
    section="scores",
    tables=("calibration", "shift", "compared"),
)
declare_metric(
    "brier",
    label="Brier score",
    definition="mean squared error of the probability, mean[(p − y)²]; lower is better.",
    better="lower",
    compute=brier,
    section="scores",
    tables=("calibration", "shift", "compared"),
    bounds=(0.0, 1.0),
)
declare_metric(
    "ne",
    label="Normalized entropy",
    definition="normalized entropy, logloss / H(base rate): logloss relative to always "
    "predicting the observed click rate; < 1 beats that constant, lower is better.",
    better="lower",
    compute=normalized_entropy,
    section="scores",
    tables=("calibration", "shift", "compared"),
)
declare_metric(
    "ne_calfree",
    label="Calibration-free NE",
    definition="calibration-free NE: NE after one logit shift that makes Σp = Σy; the part "
    "of NE no global recalibration fixes.",
    better="lower",
    compute=calibration_free_ne,
    section="scores",
    tables=("calibration",),
)
declare_metric(
    "ne_train",
    label="NE (training click rate)",
    definition="He et al. (2014)'s NE: logloss / H(training click rate), whose normaliser does "
    "not move when a shift moves the evaluated click rate; lower is better.",
    better="lower",
    computed_by="calibration_summary(base_rate=...)",
    section="scores",
)
