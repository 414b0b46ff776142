"""The shift report scores its own monitor: drift alarms and label-free estimates against the
truth the report knows.

The reference is the clean validation split (features, each variant's probabilities and the
clicks); the analysis is the evaluated split cut into chunks, clean and at every shift point.
Per point the drift of every chunk (:class:`~ctrcal.metrics.DriftMonitor`) is computed once,
since every variant sees the same shifted rows; per variant, seed and point every estimator
(:data:`~ctrcal.metrics.LABEL_FREE_ESTIMATORS`) is applied per chunk. Recorded per evaluation
(so the report's statistics give their mean ± SE over seeds):

* ``drift_alarm``: the fraction of chunks that raise any alarm (``trusted`` is its complement);
* ``drift_features``: features alarmed per chunk, on average;
* ``domain_classifier``: the domain classifier's AUC, averaged over the chunks;
* ``unseen_rate``: the rate of categorical values the reference never saw, averaged likewise;
* ``auc_est_iw_cbpe``, ``auc_est_doc``: the estimates, averaged over the chunks, and their
  errors ``..._err`` against each chunk's measured AUC; CBPE's error the same way,
  ``auc_est_chunk_err`` (its whole-split ``auc_est_err`` is the report's own).

:func:`monitor_lines` words them: per shift, variant and point the drift, each estimator's
error and whether the alarm fired, then the grid's sums: **misses** (points where the best
estimator's |mean error| exceeds :data:`MISS_AUC` yet the point raises no alarm) and **false
alarms** (clean chunks that alarm). A point raises the alarm when at least half of its chunks
do (:data:`POINT_ALARM`): the error is a mean over the chunks, so is the alarm.

What was chosen after seeing which shift (:data:`TUNING`): the alarm rate (0.05), the bins, the
classifier and the weights' clip are the library's defaults, fixed before any shift was seen.
The pooled unseen-value rate was added after categorical corruption at 5 % went unseen by the
other scores; it has no parameter of its own (its threshold follows the same rule), but
categorical corruption is not held out for it. Gaussian noise cannot move it (it changes no
categorical value), so the clean chunks are where its false alarms are measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.reports.markdown import markdown_table

__all__ = ["MISS_AUC", "POINT_ALARM", "TUNING", "ShiftMonitor", "monitor_lines", "monitor_summary"]

MISS_AUC = 0.01  # an estimate further than this from the measured AUC needs an alarm
POINT_ALARM = 0.5  # a point alarms when at least this fraction of its chunks alarm
TUNING = (
    "the alarm rate, bins and classifier were fixed before any shift was seen; the pooled "
    "unseen-value rate (no parameter of its own) was added after categorical corruption at "
    "5 % went unseen, so that family is not held out for it; Gaussian noise changes no "
    "categorical value, and the clean chunks measure its false alarms"
)
CHUNKS = 20  # chunks of the evaluated split (false alarms are counted over them)
ERRORS = {"cbpe": "auc_est_chunk_err", "iw_cbpe": "auc_est_iw_cbpe_err", "doc": "auc_est_doc_err"}


def _features(batches: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """name -> [n] values of shifted batches: numerics (model space: the drift's bins and
    trees read ranks only, which the monotone transform keeps) and categorical ids."""
    import torch

    num = torch.cat([b.numeric for b in batches.batches]).double().numpy()
    cat = torch.cat([b.categorical for b in batches.batches]).numpy().astype(np.int64)
    cols = [num[:, j] for j in range(num.shape[1])] + [cat[:, j] for j in range(cat.shape[1])]
    return dict(zip(names, cols, strict=True))


class ShiftMonitor:
    """Drift per point (shared by every variant) and estimates per evaluation.

    Args:
        chunk_rows: rows per chunk of the evaluated split.
        names: the feature names, numerics first (the batches' column order).
        seed: seeds the drift's subsamples and classifiers.
    """

    def __init__(self, chunk_rows: int, names: Sequence[str], seed: int = 0) -> None:
        self.chunk_rows = chunk_rows
        self.names = list(names)
        self.seed = seed

    @classmethod
    def of(cls, feature_map: Any, valid_rows: int, test_rows: int) -> ShiftMonitor | None:
        """A monitor whose chunks cut the evaluated split in :data:`CHUNKS`; None when they
        would be too small, or too large for the validation split to give the thresholds
        enough chunks."""
        from ctrcal.metrics._drift import MIN_CHUNK_ROWS, MIN_REFERENCE_CHUNKS

        rows = test_rows // CHUNKS
        if rows < MIN_CHUNK_ROWS or valid_rows // rows < MIN_REFERENCE_CHUNKS:
            return None
        names = [*feature_map.numeric_fields, *feature_map.categorical_fields]
        return cls(rows, names)

    def fit(self, valid_batches: Any) -> ShiftMonitor:
        """Learn the drift's bins and thresholds from the clean validation batches."""
        from ctrcal.metrics import DriftMonitor

        self.drift_ = DriftMonitor(self.chunk_rows, seed=self.seed)
        self.drift_.fit(_features(valid_batches, self.names))
        self.points_: dict[Any, list] = {}
        return self

    def chunks(self, point: Any, batches: Any) -> list:
        """The drift of every chunk of ``point`` (computed once per point)."""
        found = self.points_.get(point)
        if found is None:
            found = self.points_[point] = self.drift_.transform(_features(batches, self.names))
        return found

    def values(
        self,
        chunks: list,
        probs: np.ndarray,
        labels: np.ndarray,
        ref_probs: np.ndarray,
        ref_labels: np.ndarray,
    ) -> dict[str, float]:
        """What one evaluation records (module docstring)."""
        from ctrcal.metrics import (
            auc,
            doc_estimates,
            doc_gap,
            expected_auc,
            importance_weighted_estimates,
        )

        gap = doc_gap(ref_probs, ref_labels)
        iw, doc, iw_err, doc_err, cbpe_err = [], [], [], [], []
        for c in chunks:
            p, y = probs[c.start : c.stop], labels[c.start : c.stop]
            measured = auc(p, y)
            rows = c.reference_rows
            a = importance_weighted_estimates(ref_probs[rows], ref_labels[rows], c.density_ratio, p)
            b = doc_estimates(ref_probs, ref_labels, p, gap)
            iw.append(a["auc"])
            doc.append(b["auc"])
            iw_err.append(a["auc"] - measured)
            doc_err.append(b["auc"] - measured)
            cbpe_err.append(expected_auc(p) - measured)
        return {
            "drift_alarm": float(np.mean([c.alarm for c in chunks])),
            "drift_features": float(
                np.mean([sum(s.alarm for s in c.scores if s.feature is not None) for c in chunks])
            ),
            "domain_classifier": float(
                np.mean(
                    [s.value for c in chunks for s in c.scores if s.method == "domain_classifier"]
                )
            ),
            "unseen_rate": float(
                np.mean([s.value for c in chunks for s in c.scores if s.method == "unseen_rate"])
            ),
            "auc_est_iw_cbpe": float(np.nanmean(iw)),
            "auc_est_doc": float(np.nanmean(doc)),
            "auc_est_iw_cbpe_err": float(np.nanmean(iw_err)),
            "auc_est_doc_err": float(np.nanmean(doc_err)),
            "auc_est_chunk_err": float(np.nanmean(cbpe_err)),
        }


def monitor_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per variant and point: each estimator's error (mean, SE), the best estimator,
    the alarm fraction and whether it is a miss. Empty without monitoring."""
    from ctrcal.reports.shift.stats import CLEAN

    if "drift_alarm" not in set(table["metric"]):
        return pd.DataFrame()
    wide = table.pivot_table(
        index=["variant", "shift", "intensity"], columns="metric", values=["mean", "se"]
    )
    rows = []
    for (variant, shift, s), r in wide.iterrows():
        errors = {e: float(r[("mean", m)]) for e, m in ERRORS.items() if ("mean", m) in r}
        best = min(errors, key=lambda e: abs(errors[e]) if np.isfinite(errors[e]) else np.inf)
        alarm = float(r[("mean", "drift_alarm")])
        rows.append(
            {
                "variant": variant,
                "shift": shift,
                "intensity": float(s),
                "clean": shift == CLEAN,
                "alarm": alarm,
                "domain_auc": float(r[("mean", "domain_classifier")]),
                "unseen": float(r.get(("mean", "unseen_rate"), np.nan)),
                "features": float(r[("mean", "drift_features")]),
                **{f"err_{e}": v for e, v in errors.items()},
                **{f"se_{e}": float(r[("se", m)]) for e, m in ERRORS.items() if ("se", m) in r},
                "best": best,
                "miss": abs(errors[best]) > MISS_AUC and alarm < POINT_ALARM,
            }
        )
    return pd.DataFrame(rows)


def _pm(mean: float, se: float) -> str:
    if not np.isfinite(mean):
        return "–"
    return f"{mean:+.4f} ± {se:.4f}" if np.isfinite(se) else f"{mean:+.4f}"


def closest_lines(results: pd.DataFrame, variants: Sequence[str], shift: str) -> list[str]:
    """At the strongest point of ``shift``, per variant: the estimator closest to the measured
    AUC (mean ± SE over seeds) and a paired t-test over seeds of whether its |error| is below
    CBPE's (two-sided; with few seeds the design may not tell)."""
    from scipy import special  # scipy comes with scikit-learn

    from ctrcal.reports.shift.stats import per_seed_values

    ps = per_seed_values(results)
    ps = ps[(ps["shift"] == shift) & ps["metric"].isin(list(ERRORS.values()))]
    if ps.empty:
        return []
    top = float(ps["intensity"].max())
    ps = ps[ps["intensity"] == top]
    lines = []
    for v in variants:
        wide = ps[ps["variant"] == v].pivot_table(index="seed", columns="metric", values="value")
        if wide.empty or ERRORS["cbpe"] not in wide:
            continue
        errors = {e: wide[m] for e, m in ERRORS.items() if m in wide}
        best = min(errors, key=lambda e: abs(float(errors[e].mean())))
        err = errors[best]
        n = int(err.count())
        se = float(err.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        text = f"- {v}: **{best}** is closest, error {_pm(float(err.mean()), se)}"
        if best != "cbpe" and n > 1:
            diff = (errors["cbpe"].abs() - err.abs()).dropna()
            sd = float(diff.std(ddof=1))
            t = float(diff.mean()) / (sd / np.sqrt(diff.size)) if sd > 0 else float("inf")
            p = float(2.0 * special.stdtr(diff.size - 1, -abs(t)))
            verdict = "significantly" if p < 0.05 else "not significantly (the design cannot tell)"
            text += (
                f"; closer than CBPE {verdict}, paired t-test over {diff.size} seeds p = {p:.3g}"
            )
        lines.append(text)
    return [f"Closest estimator at {shift} @ {top:g}:", "", *lines, ""] if lines else []


def monitor_lines(
    table: pd.DataFrame,
    variants: Sequence[str],
    shifts: Sequence[dict[str, Any]],
    results: pd.DataFrame | None = None,
) -> list[str]:
    """The report's section on the monitor (module docstring); empty without monitoring.
    With ``results`` (one row per seed), the closest estimator at each shift's strongest point
    (:func:`closest_lines`)."""
    from ctrcal.metrics import TRUST_RULE
    from ctrcal.reports.shift.stats import CLEAN

    summary = monitor_summary(table)
    if summary.empty:
        return []
    from ctrcal.reports.shift.stats import format_intensity

    clean = summary[summary["clean"]]
    # the drift of a clean chunk is the same for every variant and seed
    chunks = CHUNKS
    false_alarms = int(round(float(clean["alarm"].iloc[0]) * chunks)) if len(clean) else 0
    shifted = summary[~summary["clean"]]
    misses = shifted[shifted["miss"]]
    lines = [
        "## Monitoring scored against the truth",
        "",
        "The evaluated split in chunks, each against the clean validation split: input drift "
        "(a Jensen–Shannon distance per feature, the unseen-value rate over the categorical "
        "features, a domain classifier's AUC) with thresholds from the validation split's own "
        "chunks at a 5 % false-alarm rate per clean chunk, and three label-free AUC estimates "
        "per chunk (CBPE, importance-weighted CBPE, DoC), error = estimate − measured, mean ± "
        f"SE over training seeds. Trust: {TRUST_RULE}. A point raises the alarm when at least "
        f"{POINT_ALARM:.0%} of its chunks do. Tuning: {TUNING}.",
        "",
        f"**False alarms: {false_alarms} of {chunks} clean chunks** (the drift of clean "
        "inputs is the same for every variant and seed). "
        f"**Misses: {len(misses)} of {len(shifted)} shifted points** (the best estimator's "
        f"|error| > {MISS_AUC} AUC while the point raises no alarm)"
        + (
            ": "
            + "; ".join(f"{r.variant} {r.shift} @ {r.intensity:g}" for r in misses.itertuples())
            if len(misses)
            else ""
        )
        + ".",
        "",
    ]
    header = ["variant", "point", "alarmed chunks", "domain AUC", "unseen rate"]
    header += ["features alarmed"]
    header += [f"error {e}" for e in ERRORS] + ["closest"]
    units = {i["label"]: i.get("unit", "std") for i in shifts}
    for info in [{"label": CLEAN}, *shifts]:
        label = info["label"]
        sub = summary[summary["shift"] == label].sort_values("intensity")
        if sub.empty:
            continue
        rows = []
        for v in variants:
            for r in sub[sub["variant"] == v].itertuples():
                point = "clean" if label == CLEAN else format_intensity(r.intensity, units[label])
                rows.append(
                    [
                        v,
                        point,
                        f"{r.alarm:.0%}",
                        f"{r.domain_auc:.3f}",
                        f"{r.unseen:.4f}",
                        f"{r.features:.1f}",
                        *(
                            _pm(getattr(r, f"err_{e}", np.nan), getattr(r, f"se_{e}", np.nan))
                            for e in ERRORS
                        ),
                        r.best + (" (**miss**)" if r.miss else ""),
                    ]
                )
        lines += [f"{label}:", "", markdown_table(header, rows), ""]
    for info in shifts if results is not None else []:
        lines += closest_lines(results, variants, info["label"])
    return lines
