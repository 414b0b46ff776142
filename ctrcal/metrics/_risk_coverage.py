"""Risk–coverage: is the predictive uncertainty useful for deciding which rows to trust?

Sort the rows by their predictive standard deviation (MC passes, an ensemble's spread), keep
the most confident fraction c (the smallest std) and evaluate only those. If the uncertainty
is informative, AUC rises and logloss falls as c shrinks; if it is noise, the curves are flat
(Geifman and El-Yaniv, "Selective classification for deep neural networks", NeurIPS 2017).
Rows tied in std are kept in their input order (a stable sort), so the selection is
deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_probs_labels
from ctrcal.metrics._metrics import auc, logloss
from ctrcal.metrics._registry import declare_metric

__all__ = ["COVERAGES", "RiskCoverage", "risk_coverage"]

COVERAGES = (0.5, 0.8, 1.0)


@dataclass(frozen=True)
class RiskCoverage:
    """Metrics on the most confident rows.

    Attributes:
        coverages: [k] fractions of rows kept (most confident first).
        rows: [k] rows kept.
        auc: [k] AUC of those rows (NaN with a single class).
        logloss: [k] their logloss.
    """

    coverages: np.ndarray
    rows: np.ndarray
    auc: np.ndarray
    logloss: np.ndarray

    def as_dict(self) -> dict[str, float]:
        """``{"auc@50%": ..., "logloss@50%": ..., ...}``."""
        out = {}
        for c, a, ll in zip(self.coverages, self.auc, self.logloss, strict=True):
            out[f"auc@{100 * c:g}%"] = float(a)
            out[f"logloss@{100 * c:g}%"] = float(ll)
        return out


def risk_coverage(
    probs: Any, labels: Any, std: Any, coverages: Sequence[float] = COVERAGES
) -> RiskCoverage:
    """AUC and logloss on the ``c`` most confident rows by predictive std, per coverage c.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        std: [n] predictive standard deviation per row (finite, >= 0).
        coverages: fractions in (0, 1]; each keeps ``ceil(c · n)`` rows.

    Returns:
        A :class:`RiskCoverage`.
    """
    p, y = check_probs_labels(probs, labels)
    s = as_numpy(std, "std").astype(np.float64, copy=False)
    if s.shape != p.shape:
        raise ValueError(f"std: expected {p.shape[0]} values (one per row), got {s.shape[0]}")
    if not np.isfinite(s).all() or (s < 0).any():
        raise ValueError("std: expected finite standard deviations >= 0")
    cov = np.asarray(list(coverages), dtype=np.float64)
    if cov.size == 0 or ((cov <= 0) | (cov > 1)).any():
        raise ValueError(f"coverages: expected fractions in (0, 1], got {list(coverages)}")
    order = np.argsort(s, kind="stable")
    n = p.shape[0]
    keep = np.ceil(cov * n - 1e-9).astype(np.int64).clip(1, n)
    aucs, lls = [], []
    for k in keep:
        rows = order[:k]
        aucs.append(auc(p[rows], y[rows]))
        lls.append(logloss(p[rows], y[rows]))
    return RiskCoverage(cov, keep, np.array(aucs), np.array(lls))


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

declare_metric(
    "pred_std",
    label="Mean predictive std",
    definition="variants with several samples per row (MC passes or ensemble members): mean "
    "over rows of the per-row standard deviation of the click probability across samples.",
    better=None,
    computed_by="the shift report's evaluation grid",
    kind="derived",
    section="uncertainty",
)
declare_metric(
    "std_auroc",
    label="AUROC of std: shifted vs clean",
    definition="AUROC of the per-row predictive std at telling shifted rows (positive) from "
    "the same rows clean (negative); 0.5 = no signal.",
    better="higher",
    computed_by="the shift report's evaluation grid",
    kind="derived",
    section="uncertainty",
    bounds=(0.0, 1.0),
)
for _metric in ("auc", "logloss"):
    declare_metric(
        f"{_metric}@<c>%",
        label=f"{'AUC' if _metric == 'auc' else 'Logloss'} on the most confident c % of rows",
        definition=f"risk–coverage: {'AUC' if _metric == 'auc' else 'logloss'} on the c % of "
        "rows with the smallest predictive std (variants with one); useful uncertainty makes "
        f"it {'higher' if _metric == 'auc' else 'lower'} as c shrinks.",
        better="higher" if _metric == "auc" else "lower",
        computed_by="risk_coverage",
        section="uncertainty",
    )
