"""Field-level and bin-free calibration in the shift report: the fields and the metrics.

What the evaluation grid (:mod:`ctrcal.reports.shift.grid`) needs beyond the metric functions:

* :func:`load_split_fields`: the *clean* field codes of a split (categoricals as encoded,
  numerics bucketised into equal-mass buckets). Segments are defined by what a row really is,
  so a shift that corrupts the model's inputs does not move a row to another segment; they are
  also the ``segments`` of segment-aware calibrators.
* :func:`evaluation_metrics`: every metric of one evaluation
  (:func:`~ctrcal.metrics.calibration_summary` with the report's settings).
* :func:`oracle_calibration`: the same metrics of the generator's true probabilities
  (synthetic data): the floor no model beats in expectation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.reports.shift.shift_tables import shift_report_extras

__all__ = ["SplitFields", "evaluation_metrics", "load_split_fields", "oracle_calibration"]


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


def evaluation_metrics(
    probs: np.ndarray,
    labels: np.ndarray,
    fields: SplitFields | None,
    report: Any,
    rows: np.ndarray | None = None,
) -> dict[str, float]:
    """Every metric of one evaluation on ``rows`` (all when None), per the report settings.

    Without ``fields`` (or with ``report.field_metrics`` off) only the global and bin-free
    metrics, the Brier decomposition and the label-free estimates; with them also
    Field-RCE/ECE (summary and per field), the multicalibration error and the worst-segment
    counts (:func:`~ctrcal.reports.shift.shift_tables.shift_report_extras`).
    """
    p = probs if rows is None else probs[rows]
    y = labels if rows is None else labels[rows]
    use = fields.usable(rows) if (fields is not None and report.field_metrics) else None
    if use is not None and not use.names:
        use = None
    out = M.calibration_summary(
        p,
        y,
        None if use is None else use.codes,
        names=None if use is None else use.names,
        n_bins=report.ece_bins,
        min_count=report.field_min_count,
    )
    out.update(shift_report_extras(p, y, out, use, report.ece_bins, report.field_min_count))
    return out


def oracle_calibration(
    data_dir: Path, split: str, labels: np.ndarray, fields: SplitFields | None, report: Any
) -> dict[str, float] | None:
    """The report's metrics of the generator's true probabilities (None for real data).

    Reads the ``true_prob`` column the preparation keeps for synthetic sources; returns None
    when it is absent or its rows do not line up with the split's labels.
    """
    from ctrcal.reports.shift.row_level import oracle_probs

    prob = oracle_probs(Path(data_dir), split, labels)
    if prob is None:
        return None
    return evaluation_metrics(prob, labels, fields, report)
