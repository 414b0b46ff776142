"""Field-level and bin-free calibration in the shift report: fields, calibrators, oracle, figure.

What the report needs beyond the metric functions, in one place, so the report's protocol
(:mod:`ctrcal.eval.report`) calls it in a few lines:

* :func:`load_split_fields`: the *clean* field codes of a split (categoricals as encoded,
  numerics bucketised into equal-mass buckets). Segments are defined by what a row really is,
  so a shift that corrupts the model's inputs does not move a row to another segment.
* :class:`ReportCalibrator`: temperature / Platt / isotonic / field-aware calibration behind
  one ``fit(logits, labels, fields)`` / ``predict_proba(logits, fields)`` interface.
* :func:`evaluation_metrics`: every metric of one evaluation
  (:func:`~ctrcal.eval.metrics.calibration_summary` with the report's settings).
* :func:`oracle_calibration`: the same metrics of the generator's true probabilities
  (synthetic data): the floor no model beats in expectation.
* :func:`plot_field_rce`: Field-RCE by field × intensity for the baseline and the best variant.
* :func:`~ctrcal.eval.calibration_keys.check_calibration_keys`: the config checks of the keys
  above, without data (in a module of its own: ``ctrcal validate`` loads no numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctrcal.eval import metrics as M
from ctrcal.eval.calibration_keys import (  # noqa: F401 - re-exported
    CALIBRATIONS,
    calibration_kind,
    check_calibration_keys,
)

if TYPE_CHECKING:  # pandas loads only where a report is written, not for `ctrcal validate`
    import pandas as pd

__all__ = [
    "ReportCalibrator",
    "SplitFields",
    "best_variant",
    "calibration_kind",
    "check_calibration_keys",
    "evaluation_metrics",
    "load_split_fields",
    "oracle_calibration",
    "plot_field_rce",
]

@dataclass(frozen=True)
class SplitFields:
    """Clean field codes of a split, row-aligned with its predictions.

    Attributes:
        codes: [n, F] int32 codes (categoricals, then bucketised numerics), column-major.
        names: F field names (``C1`` ..., then ``I1`` ...).
    """

    codes: np.ndarray
    names: list[str]

    def column(self, name: str) -> np.ndarray:
        return self.codes[:, self.names.index(name)]

    def usable(self, rows: np.ndarray | None = None) -> SplitFields:
        """The fields with at least two values on ``rows`` (a constant field says nothing)."""
        codes = self.codes if rows is None else self.codes[rows]
        if codes.shape[0] == 0:
            return SplitFields(codes, list(self.names))
        keep = codes.min(axis=0) != codes.max(axis=0)
        if not keep.all():
            codes = codes[:, keep]
        names = [n for n, k in zip(self.names, keep, strict=True) if k]
        return SplitFields(np.asfortranarray(codes), names)


def load_split_fields(data: Any, batch_size: int, numeric_buckets: int = 10) -> SplitFields:
    """Clean field codes of a split in prediction order.

    Args:
        data: a :class:`~ctrcal.data.loader.ParquetCTRData` split.
        batch_size: rows per batch read.
        numeric_buckets: equal-mass buckets per numeric field (0: categoricals only).
    """
    import torch

    from ctrcal.train.predict import iter_batches

    cats, nums = [], []
    for b in iter_batches(data, batch_size):
        cats.append(b.categorical.detach().to("cpu", torch.int32))
        if numeric_buckets:
            nums.append(b.numeric.detach().to("cpu", torch.float64))
    fm = data.feature_map
    codes = [torch.cat(cats).numpy()] if cats else [np.zeros((0, 0), np.int32)]
    names = list(fm.categorical_fields)
    if numeric_buckets and nums:
        numeric = torch.cat(nums).numpy()
        codes.append(
            np.stack(
                [M.bucketize(numeric[:, j], numeric_buckets) for j in range(numeric.shape[1])],
                axis=1,
            ).astype(np.int32)
        )
        names += list(fm.numeric_fields)
    # column-major: each field contiguous, as the field metrics read them
    return SplitFields(np.asfortranarray(np.concatenate(codes, axis=1)), names)


class ReportCalibrator:
    """One post-hoc calibrator of a report variant, fitted on clean validation predictions.

    Args:
        kind: one of :data:`CALIBRATIONS`.
        field: the field of ``kind="field"``.
        method: ``"platt"`` or ``"isotonic"`` per field value (``kind="field"``).
        shrinkage: pseudo-rows of the global calibrator per value (``kind="field"``).
    """

    def __init__(
        self,
        kind: str,
        field: str | None = None,
        method: str = "platt",
        shrinkage: float = 1000.0,
    ) -> None:
        from ctrcal.eval.calibration import (
            FieldAwareCalibration,
            IsotonicCalibration,
            PlattScaling,
            TemperatureScaling,
        )

        if kind not in CALIBRATIONS:
            raise ValueError(f"kind: expected one of {CALIBRATIONS}, got {kind!r}")
        if kind == "field" and field is None:
            raise ValueError("field: field-aware calibration needs a field")
        self.kind, self.field = kind, field
        self.calibrator_ = {
            "temperature": TemperatureScaling,
            "platt": PlattScaling,
            "isotonic": IsotonicCalibration,
        }.get(kind, lambda: FieldAwareCalibration(method=method, shrinkage=shrinkage))()

    @classmethod
    def for_variant(cls, variant: Any) -> ReportCalibrator | None:
        kind = calibration_kind(variant)
        if kind is None:
            return None
        return cls(
            kind,
            field=variant.field_calibration,
            method=variant.field_calibration_method,
            shrinkage=variant.field_calibration_shrinkage,
        )

    def describe(self) -> str:
        if self.kind == "field":
            c = self.calibrator_
            return (
                f"field-aware {c.method} calibration on {self.field} (shrinkage {c.shrinkage:g}) "
                "on clean validation"
            )
        what = "regression" if self.kind == "isotonic" else "scaling"
        return f"{self.kind} {what} on clean validation"

    def _values(self, fields: SplitFields | None) -> np.ndarray:
        if fields is None or self.field not in fields.names:
            raise ValueError(f"field-aware calibration needs the codes of field {self.field!r}")
        return fields.column(self.field)

    def fit(self, logits: np.ndarray, labels: np.ndarray, fields: SplitFields | None = None):
        if self.kind == "field":
            self.calibrator_.fit(logits, labels, self._values(fields))
        else:
            self.calibrator_.fit(logits, labels)
        return self

    def predict_proba(self, logits: np.ndarray, fields: SplitFields | None = None) -> np.ndarray:
        if self.kind == "field":
            out = self.calibrator_.predict_proba(logits, self._values(fields))
        else:
            out = self.calibrator_.predict_proba(logits)
        return np.asarray(out, dtype=np.float64)


def evaluation_metrics(
    probs: np.ndarray,
    labels: np.ndarray,
    fields: SplitFields | None,
    report: Any,
    rows: np.ndarray | None = None,
) -> dict[str, float]:
    """Every metric of one evaluation on ``rows`` (all when None), per the report settings.

    Without ``fields`` (or with ``report.field_metrics`` off) only the global and bin-free
    metrics; with them also Field-RCE/ECE (summary and per field) and the multicalibration
    error.
    """
    p = probs if rows is None else probs[rows]
    y = labels if rows is None else labels[rows]
    use = fields.usable(rows) if (fields is not None and report.field_metrics) else None
    if use is not None and not use.names:
        use = None
    return M.calibration_summary(
        p,
        y,
        None if use is None else use.codes,
        names=None if use is None else use.names,
        n_bins=report.ece_bins,
        min_count=report.field_min_count,
    )


def oracle_calibration(
    data_dir: Path, split: str, labels: np.ndarray, fields: SplitFields | None, report: Any
) -> dict[str, float] | None:
    """The report's metrics of the generator's true probabilities (None for real data).

    Reads the ``true_prob`` column the preparation keeps for synthetic sources; returns None
    when it is absent or its rows do not line up with the split's labels.
    """
    import pyarrow.parquet as pq

    from ctrcal.data.prepare import PROB_COL

    files = sorted((Path(data_dir) / split).glob("*.parquet"))
    if not files or PROB_COL not in pq.read_schema(files[0]).names:
        return None
    parts = [pq.read_table(f, columns=[PROB_COL, "label"]) for f in files]
    prob = np.concatenate([t.column(PROB_COL).to_numpy() for t in parts]).astype(np.float64)
    lab = np.concatenate([t.column("label").to_numpy() for t in parts]).astype(np.float64)
    if lab.shape != labels.shape or not np.array_equal(lab, labels):
        return None
    return evaluation_metrics(prob, labels, fields, report)


def best_variant(
    summary: pd.DataFrame, baseline: str, metric: str = "field_rce_mean"
) -> str | None:
    """The non-baseline variant with the lowest ``metric`` averaged over shifted points."""
    sub = summary[(summary["metric"] == metric) & (summary["intensity"] > 0)]
    sub = sub[sub["variant"] != baseline]
    if sub.empty:
        return None
    means = sub.groupby("variant", sort=False)["mean"].mean()
    return str(means.idxmin())


def plot_field_rce(
    summary: pd.DataFrame,
    variants: Sequence[str],
    path: str | Path,
    shift: str | None = None,
    unit: str = "std",
) -> Path | None:
    """Heatmaps of Field-RCE (mean over seeds) by field × intensity, one panel per variant.

    Args:
        summary: columns ``variant, [shift,] intensity, metric, mean`` with per-field metrics
            ``field_rce:<field>``.
        variants: the panels, e.g. the baseline and the best variant.
        path: PNG to write.
        shift: keep the clean point and this shift's points (None: all points).
        unit: how the shift's intensities read (see :func:`~ctrcal.eval.stats.format_intensity`).

    Returns:
        ``path``, or None when the summary holds no per-field values.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctrcal.eval.stats import format_intensity

    sub = summary[summary["metric"].str.startswith("field_rce:")]
    if shift is not None and "shift" in sub.columns:
        sub = sub[sub["shift"].isin(["clean", shift])]
    sub = sub[sub["variant"].isin(variants)]
    if sub.empty:
        return None
    fields = list(dict.fromkeys(sub["metric"].str.slice(len("field_rce:"))))
    levels = sorted(set(sub["intensity"].astype(float)))
    grids = []
    for v in variants:
        g = np.full((len(fields), len(levels)), np.nan)
        for r in sub[sub["variant"] == v].itertuples():
            g[fields.index(r.metric[len("field_rce:") :]), levels.index(float(r.intensity))] = (
                r.mean
            )
        grids.append(g)
    vmax = float(np.nanmax(grids)) if np.isfinite(grids).any() else 1.0
    fig, axes = plt.subplots(
        1,
        len(variants),
        figsize=(1.2 + 1.1 * len(levels) * len(variants), 0.8 + 0.22 * len(fields)),
        squeeze=False,
        sharey=True,
    )
    for ax, v, g in zip(axes[0], variants, grids, strict=True):
        im = ax.imshow(g, aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax)
        ax.set_title(v, fontsize=9)
        ticks = ["clean" if s == 0 else format_intensity(s, unit) for s in levels]
        ax.set_xticks(range(len(levels)), ticks, fontsize=7)
        ax.set_yticks(range(len(fields)), fields, fontsize=6)
        ax.set_xlabel("shift intensity", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Field-RCE")
    fig.suptitle(
        "Field-RCE by field and shift intensity" + (f" ({shift})" if shift else ""), fontsize=9
    )
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
