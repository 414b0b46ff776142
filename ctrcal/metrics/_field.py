"""Field-level calibration: how far predictions are off within each value of a field.

Global ECE and PCOC average over every advertiser, publisher and site; a model can be
calibrated on average and off by 30 % on a large field value. These metrics look per value
of a categorical field (or of a bucketised numeric, see :func:`bucketize`).

For one field with values v (N rows in all, N_v rows of value v, D_v = Σ_{i∈v} (y_i − p_i),
Y_v = Σ_{i∈v} y_i):

* **Field-RCE** (relative calibration error; Pan et al., "Field-aware Calibration: A Simple
  and Empirically Strong Method for Reliable Probabilistic Predictions", WWW 2020, eq. 3):
  ``(1/N) Σ_v N_v · |D_v| / Y_v`` over the values with at least one click (a value without
  clicks has no relative error and contributes nothing; N stays the number of all rows).
* **Field-ECE** (the same paper): ``(1/N) Σ_v N_v · |D_v / N_v| = (1/N) Σ_v |D_v|``, the
  count-weighted absolute gap between a value's click rate and its mean prediction.
* **PCOC per value**: ``Σ_{i∈v} p_i / Y_v`` for the ``top_k`` most frequent values.

Values seen in fewer than ``min_count`` rows are pooled into one value per field before any
of this (their few clicks make a per-value ratio pure noise); pooling happens on the per-value
sums, so it is exact and costs O(number of values).

Cost per field: three ``bincount`` passes (rows, Σ(y − p), clicks over the positive rows
only), O(n); no Python loop over values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_fields, check_probs_labels, dense_codes
from ctrcal.metrics._registry import declare_metric

__all__ = [
    "FieldCalibration",
    "FieldStats",
    "bucketize",
    "field_calibration",
    "field_ece",
    "field_rce",
]

DEFAULT_MIN_COUNT = 100
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class FieldStats:
    """Calibration of one field.

    Attributes:
        rce: Field-RCE (see the module docstring).
        ece: Field-ECE.
        n_values: distinct values with at least ``min_count`` rows (kept apart).
        pooled_rows: rows of the values pooled for having fewer than ``min_count`` rows.
        top_values: [k] the most frequent values (original codes), most frequent first.
        top_counts: [k] their row counts.
        top_pcoc: [k] their PCOC Σp / Σy (NaN where the value has no click).
    """

    rce: float
    ece: float
    n_values: int
    pooled_rows: int
    top_values: np.ndarray
    top_counts: np.ndarray
    top_pcoc: np.ndarray


@dataclass(frozen=True)
class FieldCalibration:
    """Field-level calibration of every field, with a summary across fields.

    Attributes:
        fields: field name -> :class:`FieldStats`, in input order.
    """

    fields: dict[str, FieldStats] = field(default_factory=dict)

    def values(self, metric: str) -> dict[str, float]:
        """``{field name: value}`` of ``"rce"`` or ``"ece"``."""
        if metric not in ("rce", "ece"):
            raise ValueError(f"metric must be 'rce' or 'ece', got {metric!r}")
        return {name: getattr(s, metric) for name, s in self.fields.items()}

    def summary(self) -> dict[str, Any]:
        """Mean and worst field of Field-RCE and Field-ECE.

        Returns:
            ``{"field_rce_mean", "field_rce_max", "field_rce_worst", "field_ece_mean",
            "field_ece_max", "field_ece_worst"}``; ``*_worst`` is the field's name.
        """
        out: dict[str, Any] = {}
        for metric in ("rce", "ece"):
            vals = self.values(metric)
            names = list(vals)
            arr = np.array([vals[k] for k in names], dtype=np.float64)
            worst = int(np.nanargmax(arr)) if np.isfinite(arr).any() else 0
            out[f"field_{metric}_mean"] = float(np.nanmean(arr)) if arr.size else float("nan")
            out[f"field_{metric}_max"] = float(arr[worst]) if arr.size else float("nan")
            out[f"field_{metric}_worst"] = names[worst] if names else ""
        return out


def _field_stats(
    codes: np.ndarray,
    values: np.ndarray,
    diff: np.ndarray,
    pos: np.ndarray,
    n: int,
    min_count: int,
    top_k: int,
) -> FieldStats:
    nv = values.shape[0]
    count = np.bincount(codes, minlength=nv).astype(np.float64)
    d = np.bincount(codes, weights=diff, minlength=nv)
    clicks = np.bincount(codes[pos], minlength=nv).astype(np.float64)
    kept = count >= min_count
    rare = (count > 0) & ~kept
    # the pooled value: sums over the rare values, appended as one more value
    count_k = np.append(count[kept], count[rare].sum())
    d_k = np.append(d[kept], d[rare].sum())
    clicks_k = np.append(clicks[kept], clicks[rare].sum())
    has_click = clicks_k > 0
    rce = float(np.sum(count_k[has_click] * np.abs(d_k[has_click]) / clicks_k[has_click]) / n)
    ece = float(np.abs(d_k).sum() / n)
    # top_k most frequent kept values; ties broken by the smaller code, deterministically
    kept_idx = np.flatnonzero(kept)
    k = min(top_k, kept_idx.size)
    if k:
        cand = kept_idx
        if kept_idx.size > 4 * k:  # partial selection first: O(V) instead of a full sort
            thresh = np.partition(count[kept_idx], kept_idx.size - k)[kept_idx.size - k]
            cand = kept_idx[count[kept_idx] >= thresh]
        order = np.lexsort((cand, -count[cand]))[:k]
        top = cand[order]
    else:
        top = kept_idx[:0]
    with np.errstate(divide="ignore", invalid="ignore"):
        pcoc = np.where(clicks[top] > 0, (clicks[top] - d[top]) / clicks[top], np.nan)
    return FieldStats(
        rce=rce,
        ece=ece,
        n_values=int(kept.sum()),
        pooled_rows=int(count[rare].sum()),
        top_values=values[top],
        top_counts=count[top].astype(np.int64),
        top_pcoc=pcoc,
    )


def _check_counts(min_count: int, top_k: int) -> None:
    if not isinstance(min_count, (int, np.integer)) or min_count < 1:
        raise ValueError(f"min_count: expected a positive integer, got {min_count!r}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k: expected a non-negative integer, got {top_k!r}")


def field_calibration(
    probs: Any,
    labels: Any,
    fields: Any,
    *,
    names: Sequence[str] | None = None,
    min_count: int = DEFAULT_MIN_COUNT,
    top_k: int = DEFAULT_TOP_K,
) -> FieldCalibration:
    """Field-RCE, Field-ECE and per-value PCOC of every field (module docstring).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        fields: [n, F] integer codes (array or tensor), a mapping ``name -> [n] codes`` or a
            sequence of [n] arrays; see :func:`~ctrcal.metrics._inputs.check_fields`.
        names: F field names for an array (default ``field0`` ...).
        min_count: values with fewer rows are pooled into one value per field.
        top_k: how many of the most frequent values get their own PCOC.

    Returns:
        A :class:`FieldCalibration`; ``.summary()`` gives mean and worst field.

    Raises:
        ValueError: naming the argument (``probs``, ``labels``, ``fields[...]``, ...).
    """
    _check_counts(min_count, top_k)
    p, y = check_probs_labels(probs, labels)
    keys, cols, ranges = check_fields(fields, p.shape[0], names)
    n = p.shape[0]
    diff = y - p.astype(np.float64)
    pos = np.flatnonzero(y)
    out = {}
    for key, col, (lo, hi) in zip(keys, cols, ranges, strict=True):
        codes, values = dense_codes(col, lo, hi)
        out[key] = _field_stats(codes, values, diff, pos, n, int(min_count), int(top_k))
    return FieldCalibration(out)


def field_rce(probs: Any, labels: Any, values: Any, min_count: int = DEFAULT_MIN_COUNT) -> float:
    """Field-RCE of one field, ``(1/N) Σ_v N_v |Σ_v (y − p)| / Σ_v y`` (Pan et al. 2020).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] 0/1.
        values: [n] integer codes of the field.
        min_count: values with fewer rows are pooled into one.
    """
    stats = field_calibration(probs, labels, {"values": values}, min_count=min_count, top_k=0)
    return stats.fields["values"].rce


def field_ece(probs: Any, labels: Any, values: Any, min_count: int = DEFAULT_MIN_COUNT) -> float:
    """Field-ECE of one field, ``(1/N) Σ_v |Σ_v (y − p)|`` (Pan et al. 2020).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] 0/1.
        values: [n] integer codes of the field.
        min_count: values with fewer rows are pooled into one.
    """
    stats = field_calibration(probs, labels, {"values": values}, min_count=min_count, top_k=0)
    return stats.fields["values"].ece


def bucketize(x: Any, n_buckets: int = 10, name: str = "x") -> np.ndarray:
    """Equal-mass bucket codes of a numeric column, for field-level metrics.

    Edges are the ``k / n_buckets`` quantiles of the finite values of ``x`` (duplicates
    dropped, so a column with few distinct values gets fewer buckets); NaN (missing) and ±inf get
    a bucket of their own, the last code.

    Args:
        x: [n] numeric values (array or tensor).
        n_buckets: buckets at most (>= 2).
        name: the argument's name in error messages.

    Returns:
        [n] int32 codes in ``0..n_buckets`` (``n_buckets`` only for non-finite values).
    """
    if not isinstance(n_buckets, (int, np.integer)) or n_buckets < 2:
        raise ValueError(f"n_buckets: expected an integer >= 2, got {n_buckets!r}")
    arr = as_numpy(x, name).astype(np.float64, copy=False)
    finite = np.isfinite(arr)
    out = np.full(arr.shape[0], n_buckets, dtype=np.int32)
    if finite.any():
        vals = arr[finite]
        # inclusive upper bounds taken from the data, so tied values share a bucket
        qs = np.linspace(0, 1, n_buckets + 1)[1:-1]
        upper = np.unique(np.quantile(vals, qs, method="lower"))
        upper = upper[upper < vals.max()]
        out[finite] = np.searchsorted(upper, vals, side="left")
    return out


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

_SUMMARY = "calibration_summary"
declare_metric(
    "field_rce_mean",
    label="Field-RCE, mean over fields",
    definition="Field-RCE (Pan et al., WWW 2020), (1/N)·Σ_v N_v·|Σ_v(y−p)|/Σ_v y over the "
    "values v of a field (values below min_count rows pooled), mean over fields.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    tables=("calibration", "shift", "compared"),
    segments=True,
)
declare_metric(
    "field_rce_max",
    label="Field-RCE, worst field",
    definition="Field-RCE of the worst field.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    tables=("calibration", "shift", "compared"),
    segments=True,
)
declare_metric(
    "field_ece_mean",
    label="Field-ECE, mean over fields",
    definition="Field-ECE, (1/N)·Σ_v |Σ_v(y−p)|, mean over fields.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    tables=("calibration",),
    segments=True,
)
declare_metric(
    "field_ece_max",
    label="Field-ECE, worst field",
    definition="Field-ECE of the worst field.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    tables=("calibration",),
    segments=True,
)
declare_metric(
    "field_rce:<field>",
    label="Field-RCE of one field",
    definition="Field-RCE of one field (`field_rce`), per categorical field and, in the shift "
    "report, per bucketised numeric (report.field_numeric_buckets equal-mass buckets); "
    "segments use the clean field values of each row.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    segments=True,
)
declare_metric(
    "field_ece:<field>",
    label="Field-ECE of one field",
    definition="Field-ECE of one field (`field_ece`), (1/N)·Σ_v |Σ_v(y−p)| over its values.",
    better="lower",
    computed_by=_SUMMARY,
    section="fields",
    segments=True,
)
