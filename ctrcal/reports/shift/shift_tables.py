"""The shift report's deployment tables: label-free estimates under shift, the Brier terms and
the worst segments.

Per evaluation (:func:`shift_report_extras`, called by
:func:`~ctrcal.reports.shift.calibrate.evaluation_metrics`) the report records

* Murphy's Brier terms (``ctrcal.metrics.brier_decomposition``) on the report's ECE bins;
* the label-free AUC and logloss (``ctrcal.metrics.label_free_estimates``) and their errors,
  estimate − measured: how far a monitor without labels would be off at that shift point;
* with fields: how many segments (one field = one value, clean codes, at least
  ``field_min_count`` rows) are flagged at a Holm-adjusted 5 %, and the largest |σ|.

:func:`label_free_lines` words the estimates as one table per shift (variant × point,
estimate, measured and error, mean ± SE over seeds); :func:`segment_lines` lists the worst
segments of training seed 0 at the clean point and at each shift's strongest intensity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.metrics import (
    METRICS,
    SegmentScan,
    brier_decomposition,
    label_free_errors,
    worst_segments,
)
from ctrcal.reports.markdown import markdown_table
from ctrcal.reports.shift.stats import CLEAN, format_intensity

__all__ = [
    "label_free_lines",
    "record_segments",
    "segment_lines",
    "segment_scan",
    "shift_report_extras",
]

SEGMENTS_SHOWN = 5  # worst segments listed per variant and point


def segment_scan(p: np.ndarray, y: np.ndarray, fields: Any, min_count: int) -> SegmentScan:
    """The worst segments of one evaluation over the clean field codes (``SplitFields``)."""
    cols = {name: fields.codes[:, j] for j, name in enumerate(fields.names)}
    return worst_segments(p, y, cols, min_count=min_count, max_values=None, top=SEGMENTS_SHOWN)


def shift_report_extras(
    p: np.ndarray,
    y: np.ndarray,
    measured: Mapping[str, float],
    fields: Any,
    n_bins: int,
    min_count: int,
) -> dict[str, float]:
    """The module docstring's values of one evaluation.

    Args:
        p, y: [n] probabilities and clicks of the evaluated rows.
        measured: the evaluation's metrics (``auc``, ``logloss``, ...).
        fields: the usable clean fields of these rows (``SplitFields``) or None.
        n_bins: ECE bins.
        min_count: rows a segment needs to be tested.
    """
    out = brier_decomposition(p, y, n_bins).as_dict()
    lf = label_free_errors(p, y, dict(measured))
    out.update({k: lf[k] for k in ("auc_est", "auc_est_err", "logloss_est", "logloss_est_err")})
    if fields is not None:
        scan = segment_scan(p, y, fields, min_count)
        out["segments_flagged"] = float(scan.flagged_count)
        out["segment_sigma_max"] = abs(scan.segments[0].sigma) if scan.segments else np.nan
    return out


def _cell(table: pd.DataFrame, metric: str) -> str:
    hit = table[table["metric"] == metric]
    if hit.empty:
        return "–"
    mean, se = float(hit["mean"].iloc[0]), float(hit["se"].iloc[0])
    if not np.isfinite(mean):
        return "n/a"
    return f"{mean:.4f}" if not np.isfinite(se) else f"{mean:.4f} ± {se:.4f}"


def label_free_lines(
    table: pd.DataFrame, variants: Sequence[str], shifts: Sequence[dict[str, Any]]
) -> list[str]:
    """One table per shift: each variant at each point, estimated vs measured AUC and logloss
    and the error (mean ± SE over training seeds). Empty when the table has no estimates."""
    if "auc_est" not in set(table["metric"]):
        return []
    lines = [
        "## Label-free estimates under shift",
        "",
        "What a monitor without labels would report: the AUC and logloss the model expects of "
        "itself if its probabilities are calibrated (CBPE's AUC, the mean entropy), beside the "
        "measured values; error = estimate − measured, mean ± SE over training seeds. The "
        "smaller the error under a shift, the longer label-free monitoring stays honest.",
        "",
    ]
    metrics = ["auc_est", "auc", "auc_est_err", "logloss_est", "logloss", "logloss_est_err"]
    header = ["variant", "point", *(METRICS.get(m).label for m in metrics)]
    for info in shifts:
        label, unit = info["label"], info.get("unit", "std")
        sub = table[table["shift"].isin([CLEAN, label])]
        points = sorted(
            set(zip(sub["shift"], sub["intensity"], strict=True)),
            key=lambda pt: (pt[0] != CLEAN, float(pt[1])),
        )
        rows = []
        for v in variants:
            for sh, s in points:
                at = sub[(sub["variant"] == v) & (sub["shift"] == sh) & (sub["intensity"] == s)]
                if at.empty:
                    continue
                name = "clean" if sh == CLEAN else format_intensity(s, unit)
                rows.append([v, name, *(_cell(at, m) for m in metrics)])
        lines += [f"{label}:", "", markdown_table(header, rows), ""]
    return lines


def segment_lines(scans: Mapping[str, Mapping[str, dict[str, Any]]]) -> list[str]:
    """The worst segments per variant and point (``{variant: {point: scan.as_dict()}}``)."""
    if not any(scans.values()):
        return []
    lines = [
        "## Worst segments",
        "",
        f"Training seed 0, first noise seed: the {SEGMENTS_SHOWN} segments (one field = one "
        "clean value) with the largest |σ| = |observed − predicted clicks| / sqrt(Σp(1−p)), "
        "p-values Holm-adjusted over every segment tested; mean ± SE over seeds of the number "
        "flagged is in `results.csv` (`segments_flagged`).",
        "",
    ]
    header = [
        "variant",
        "point",
        "segment",
        "rows",
        "observed / predicted [95 % CI]",
        "σ",
        "p (Holm)",
        "flagged / tested",
    ]
    rows = []
    for variant, by_point in scans.items():
        for point, ws in by_point.items():
            for s in ws["segments"][:SEGMENTS_SHOWN]:
                rows.append(
                    [
                        variant,
                        point,
                        s["name"],
                        f"{s['rows']:,}",
                        f"{s['ratio']:.3f} [{s['low']:.3f}, {s['high']:.3f}]",
                        f"{s['sigma']:+.1f}",
                        f"{s['pvalue_adjusted']:.2g}",
                        f"{ws['flagged']} / {ws['tested']}",
                    ]
                )
    return lines + [markdown_table(header, rows), ""]


def record_segments(
    store: dict[str, Any],
    point: str,
    probs: np.ndarray,
    labels: np.ndarray,
    rows: np.ndarray,
    fields: Any,
    report: Any,
) -> None:
    """Keep the worst segments of one evaluation (``rows`` of ``probs``) in ``store[point]``
    (without fields or with ``report.field_metrics`` off: nothing)."""
    if fields is None or not report.field_metrics:
        return
    use = fields.usable(rows)
    if not use.names:
        return
    scan = segment_scan(probs[rows], labels[rows], use, report.field_min_count)
    store[point] = scan.as_dict(top=SEGMENTS_SHOWN)
