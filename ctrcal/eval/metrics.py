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
* ``normalized_entropy``: logloss / H(ȳ) with H(q) = -q log q - (1-q) log(1-q), the logloss
  relative to always predicting the observed base rate (< 1 beats it; NaN if ȳ is 0 or 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "DEFINITIONS",
    "ReliabilityCurve",
    "auc",
    "brier",
    "compute_all",
    "ece",
    "logloss",
    "normalized_entropy",
    "pcoc",
    "reliability_curve",
]

DEFAULT_EPS = 1e-7

# One-line definitions, printed in reports next to the tables.
DEFINITIONS: dict[str, str] = {
    "auc": "ROC AUC: probability that a random click is scored above a random non-click "
    "(ties count ½); higher is better.",
    "logloss": "mean negative log-likelihood −mean[y·log p + (1−y)·log(1−p)], p clipped to "
    "[1e-7, 1−1e-7]; lower is better.",
    "brier": "mean squared error of the probability, mean[(p − y)²]; lower is better.",
    "ece": "expected calibration error, Σ_b (n_b/n)·|click rate_b − mean p_b| over 15 "
    "equal-width bins of the predicted click probability p (torchmetrics "
    "BinaryCalibrationError, norm='l1'); lower is better.",
    "ece_mass": "the same ECE over 15 equal-mass bins (each holds n/15 rows sorted by p), "
    "which resolves the low-probability range where CTR predictions live; lower is better.",
    "pcoc": "predicted over observed clicks, Σp / Σy; 1 is calibrated on average, > 1 "
    "over-predicts.",
    "ne": "normalized entropy, logloss / H(base rate): logloss relative to always predicting "
    "the observed click rate; < 1 beats that constant, lower is better.",
}


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, on any device
        x = x.detach().to("cpu")
        if x.dtype.is_floating_point and x.element_size() == 2:
            x = x.float()  # bf16 has no numpy twin; widening is exact
        x = x.numpy()
    arr = np.asarray(x)
    if arr.ndim == 2 and arr.shape[1] == 1:  # a [n, 1] column, as some models return
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    return arr


def _check(probs: Any, labels: Any, unit: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validated (probs, labels) as 1-D numpy arrays; probs keep their float dtype.

    ``unit=False`` accepts any finite scores (for AUC) instead of probabilities in [0, 1].
    """
    p = _as_numpy(probs, "probs")
    y = _as_numpy(labels, "labels")
    if p.shape != y.shape:
        raise ValueError(f"probs and labels differ in length: {p.shape[0]} vs {y.shape[0]}")
    if p.size == 0:
        raise ValueError("probs is empty")
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    if not np.isfinite(p).all():
        raise ValueError("probs contains NaN or infinite values")
    if unit and (p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(
            f"probs must lie in [0, 1] (got min {p.min():.4g}, max {p.max():.4g}); "
            "pass sigmoid(logits)"
        )
    y = y.astype(np.float64, copy=False)
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    return p, y


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


def normalized_entropy(probs: Any, labels: Any, eps: float = DEFAULT_EPS) -> float:
    """Normalized entropy: logloss / H(ȳ), ȳ the observed click rate of these rows.

    NaN when the rows hold a single class (the constant predictor is then perfect).
    """
    p, y = _check(probs, labels)
    h = _binary_entropy(float(y.mean()))
    if np.isnan(h):
        return float("nan")
    return logloss(p, y, eps=eps) / h


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
    if strategy == "uniform":
        edges = _uniform_edges(int(n_bins), p.dtype)
        idx = np.searchsorted(edges, p, side="right") - 1
        nb = int(n_bins) + 1
    elif strategy == "quantile":
        n = p.shape[0]
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
    import torch

    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    return torch.linspace(0.0, 1.0, n_bins + 1, dtype=tdtype).double().numpy()


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
    """Every metric of :data:`DEFINITIONS` for one set of predictions.

    Returns:
        ``{"auc", "logloss", "brier", "ece", "ece_mass", "pcoc", "ne"}`` -> float.
    """
    p, y = _check(probs, labels)
    return {
        "auc": auc(p, y),
        "logloss": logloss(p, y),
        "brier": brier(p, y),
        "ece": ece(p, y, n_bins=n_bins),
        "ece_mass": ece(p, y, n_bins=n_bins, strategy="quantile"),
        "pcoc": pcoc(p, y),
        "ne": normalized_entropy(p, y),
    }
