"""``ctrcal.metrics``: every metric of CTR predictions, numpy only, in one public place.

Every metric takes ``(probs, labels)`` (torchmetrics' order), accepts numpy arrays or tensors
and is defined once, in a private submodule; this package is its one public name::

    import ctrcal.metrics
    ctrcal.metrics.ece(probs, labels)
    ctrcal.metrics.smooth_ece(probs, labels).value
    ctrcal.metrics.bootstrap_ci(probs, labels, "ece")

Every metric is declared once, beside its function, in :data:`METRICS` (its function,
direction, label and definition; :func:`declare_metric` adds one, :func:`metrics_in` lists
those of a report's table, :func:`metric_of` finds the declaration of a result's key); the
reports, the deploy gate and the docs read that table.

Two tools of the metrics are public too, because the calibrators share them:
:func:`as_numpy` (how a metric reads its input: numpy or a tensor on any device) and
:func:`newton_logistic` (the one logistic fit: the calibration slope here, Platt and
temperature scaling in :mod:`ctrcal.calibration.scaling`).
"""

from __future__ import annotations

from ctrcal.metrics._bootstrap import BootstrapCI, PairedCI, bootstrap_ci, paired_bootstrap
from ctrcal.metrics._brier import BrierDecomposition, brier_decomposition
from ctrcal.metrics._drift import (
    TRUST_RULE,
    ChunkDrift,
    DriftMonitor,
    DriftScore,
    feature_kind,
    js_distance,
)
from ctrcal.metrics._ecce import (
    ECCETest,
    Multicalibration,
    ecce,
    ecce_pvalue_from_sigmas,
    ecce_std,
    ecce_test,
    multicalibration_error,
)
from ctrcal.metrics._field import (
    FieldCalibration,
    bucketize,
    field_calibration,
    field_ece,
    field_rce,
)
from ctrcal.metrics._inputs import as_numpy
from ctrcal.metrics._label_free import (
    ESTIMATED_METRICS,
    LABEL_FREE_ESTIMATORS,
    LABEL_FREE_METRICS,
    doc_estimates,
    doc_gap,
    estimate_key,
    expected_auc,
    importance_weighted_estimates,
    label_free_errors,
    label_free_estimates,
)
from ctrcal.metrics._metrics import (
    ReliabilityCurve,
    auc,
    average_precision,
    brier,
    calibration_free_ne,
    calibration_summary,
    compute_all,
    ece,
    logloss,
    normalized_entropy,
    pcoc,
    reliability_curve,
)
from ctrcal.metrics._recalibration import (
    Recalibration,
    calibration_slope_intercept,
    newton_logistic,
)
from ctrcal.metrics._registry import (
    METRICS,
    Metric,
    declare_metric,
    metric_of,
    metrics_in,
)
from ctrcal.metrics._risk_coverage import RiskCoverage, risk_coverage
from ctrcal.metrics._segments import (
    MAX_SEGMENT_VALUES,
    Segment,
    SegmentScan,
    holm,
    worst_segments,
)
from ctrcal.metrics._smooth_ece import SmoothECE, smooth_ece, smooth_ece_at

__all__ = [
    "LABEL_FREE_METRICS",
    "MAX_SEGMENT_VALUES",
    "METRICS",
    "BootstrapCI",
    "BrierDecomposition",
    "ESTIMATED_METRICS",
    "LABEL_FREE_ESTIMATORS",
    "ChunkDrift",
    "DriftMonitor",
    "DriftScore",
    "ECCETest",
    "FieldCalibration",
    "Metric",
    "Multicalibration",
    "PairedCI",
    "Recalibration",
    "ReliabilityCurve",
    "RiskCoverage",
    "Segment",
    "SegmentScan",
    "SmoothECE",
    "TRUST_RULE",
    "as_numpy",
    "auc",
    "average_precision",
    "bootstrap_ci",
    "brier",
    "brier_decomposition",
    "bucketize",
    "calibration_free_ne",
    "calibration_slope_intercept",
    "calibration_summary",
    "compute_all",
    "doc_estimates",
    "doc_gap",
    "estimate_key",
    "declare_metric",
    "ece",
    "ecce",
    "ecce_pvalue_from_sigmas",
    "ecce_std",
    "ecce_test",
    "expected_auc",
    "feature_kind",
    "field_calibration",
    "field_ece",
    "field_rce",
    "holm",
    "importance_weighted_estimates",
    "js_distance",
    "label_free_errors",
    "label_free_estimates",
    "logloss",
    "metric_of",
    "metrics_in",
    "multicalibration_error",
    "newton_logistic",
    "normalized_entropy",
    "paired_bootstrap",
    "pcoc",
    "reliability_curve",
    "risk_coverage",
    "smooth_ece",
    "smooth_ece_at",
    "worst_segments",
]
