"""Worst segments: which values of which columns the model mis-predicts, ranked and tested.

A segment is the rows where one column takes one value (``site = a``) or, when asked, where
two columns take one pair of values (``site = a & device = ios``). For each segment with at
least ``min_count`` rows:

* ``observed`` = Σ y and ``predicted`` = Σ p (clicks), and their ``ratio`` = observed /
  predicted (1 is calibrated; 0.67 means the model predicts 1.5 times the clicks it gets);
* its interval: the exact Poisson (Garwood) interval of the observed count divided by the
  predicted one, as for a standardised incidence ratio;
* ``sigma`` = (observed − predicted) / sqrt(Σ p(1−p)): the gap in units of its standard
  deviation *if the model were calibrated on the segment* (a Poisson-binomial sum), and the
  two-sided normal p-value of that z;
* ``pvalue_adjusted``: Holm's step-down adjustment over every segment tested (columns and
  pairs together), which controls the family-wise error rate at any dependence between
  segments (they overlap: every row is in one segment per column);
* ``detectable``: the smallest relative error |ratio − 1| that a segment of this size would
  show at 50 % power at Holm's strictest level α/m (m segments tested) — a segment whose
  ``detectable`` is 0.4 cannot reveal a 10 % miscalibration.

Segments are ranked by |sigma|, the evidence of miscalibration (MCGrad's multicalibration
error also takes the worst segment by its noise-normalised gap); a segment with fewer than
``min_count`` rows is skipped and counted. Rows where a pair's columns take a combination of
values are one segment only when that combination has ``min_count`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_probs_labels
from ctrcal.metrics._registry import declare_metric

__all__ = ["MAX_SEGMENT_VALUES", "Segment", "SegmentScan", "holm", "worst_segments"]

# A column with more values than this is an identifier, not a segment: per-value rows are
# tiny, the list is unreadable and the adjustment over that many tests is powerless.
MAX_SEGMENT_VALUES = 10_000


@dataclass(frozen=True)
class Segment:
    """One segment's calibration (module docstring)."""

    name: str
    rows: int
    observed: float
    predicted: float
    ratio: float
    low: float
    high: float
    sigma: float
    pvalue: float
    pvalue_adjusted: float
    detectable: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SegmentScan:
    """Every tested segment, ranked by |sigma| (largest first).

    Attributes:
        segments: the tested segments, ranked (the first ``top`` and every flagged one, when
            :func:`worst_segments` was given ``top``).
        tested: segments tested (the Holm family).
        skipped: segments with fewer than ``min_count`` rows (not tested).
        min_count: rows a segment needs to be tested.
        alpha: family-wise level of ``flagged``.
        level: coverage of the ratio intervals.
        adjustment: how the p-values are adjusted (``"holm"``).
        flagged_count: segments flagged among all tested.
    """

    segments: list[Segment]
    tested: int
    skipped: int
    min_count: int
    alpha: float
    level: float
    adjustment: str = "holm"
    flagged_count: int = 0

    @property
    def flagged(self) -> list[Segment]:
        """Segments whose adjusted p-value is below ``alpha``."""
        return [s for s in self.segments if s.pvalue_adjusted < self.alpha]

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        """The JSON form (``top``: keep the first ``top`` segments of the ranking)."""
        keep = self.segments if top is None else self.segments[:top]
        return {
            "tested": self.tested,
            "skipped": self.skipped,
            "min_count": self.min_count,
            "alpha": self.alpha,
            "level": self.level,
            "adjustment": self.adjustment,
            "flagged": self.flagged_count,
            "segments": [s.as_dict() for s in keep],
        }


def holm(pvalues: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order of ``pvalues``: the one correction
    for a family of tests in ctrcal (worst segments, the shift report's primary family).

    The k-th smallest of the m finite p-values is multiplied by (m − k + 1), made monotone by
    a running maximum and capped at 1. A NaN p-value is a test that could not be made (one
    seed, a metric undefined on the rows): it stays NaN, it is never a rejection, and it does
    not count in m, so the tests that were made are not penalised for it.

    Args:
        pvalues: [m] p-values in [0, 1], NaN for a test not made.

    Returns:
        [m] adjusted p-values (NaN where ``pvalues`` is NaN).
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    made = np.flatnonzero(np.isfinite(p))
    m = made.size
    if m == 0:
        return out
    order = made[np.argsort(p[made], kind="stable")]
    scaled = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    out[order] = np.minimum(scaled, 1.0)
    return out


def _codes(col: Any, name: str, n: int, max_values: int | None) -> np.ndarray:
    c = as_numpy(col, f"segments[{name!r}]")
    if c.shape[0] != n:
        raise ValueError(f"segments[{name!r}]: expected {n} values, got {c.shape[0]}")
    if c.dtype.kind not in "iu":
        raise ValueError(f"segments[{name!r}]: expected integer codes, got {c.dtype}")
    if c.size and c.min() < 0:
        raise ValueError(f"segments[{name!r}]: expected codes >= 0, got {int(c.min())}")
    values = int(c.max()) + 1 if c.size else 0
    if max_values is not None and values > max_values:
        uniq = np.unique(c).size
        if uniq > max_values:
            raise ValueError(
                f"segments[{name!r}]: {uniq:,} distinct values, more than the {max_values:,} "
                "a segment column may have (an identifier, not a segment)"
            )
    return c.astype(np.int64, copy=False)


def _sums(key: np.ndarray, p: np.ndarray, y: np.ndarray, v: np.ndarray):
    """Per distinct key: the key, rows, Σy, Σp, Σp(1−p)."""
    size = int(key.max()) + 1
    if size <= 4 * key.shape[0] + 1024:  # dense keys: bincount, no sort
        rows = np.bincount(key, minlength=size)
        present = np.flatnonzero(rows)
        inv = None
    else:
        present, inv = np.unique(key, return_inverse=True)
        key, size = inv, present.shape[0]
        rows = np.bincount(key, minlength=size)
    sums = [np.bincount(key, weights=w, minlength=size) for w in (y, p, v)]
    if inv is None:
        return present, rows[present], *(s[present] for s in sums)
    return present, rows, *sums


def worst_segments(
    probs: Any,
    labels: Any,
    segments: Mapping[str, Any],
    *,
    pairs: Sequence[tuple[str, str]] = (),
    value_names: Mapping[str, Sequence[str]] | None = None,
    min_count: int = 100,
    alpha: float = 0.05,
    level: float = 0.95,
    max_values: int | None = MAX_SEGMENT_VALUES,
    top: int | None = None,
) -> SegmentScan:
    """Rank and test every segment (module docstring).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        segments: column name -> [n] integer codes >= 0.
        pairs: pairs of column names whose value combinations are segments too.
        value_names: column name -> the value of each code (for the segment names; default
            the codes themselves).
        min_count: rows a segment needs to be tested.
        alpha: family-wise level at which a segment is flagged.
        level: coverage of the ratio intervals.
        max_values: a column with more distinct values is refused (ValueError); None: no
            cap (encoded fields whose rare values are pooled by ``min_count`` anyway).
        top: keep only the first ``top`` segments of the ranking (and every flagged one);
            None: all.

    Returns:
        :class:`SegmentScan`.
    """
    from scipy import special  # not scipy.stats: a 0.5 s heavier import for two quantiles

    p, y = check_probs_labels(probs, labels)
    p = p.astype(np.float64, copy=False)
    n = p.shape[0]
    if not isinstance(min_count, (int, np.integer)) or min_count < 1:
        raise ValueError(f"min_count: expected an integer >= 1, got {min_count!r}")
    if not 0.0 < alpha < 1.0 or not 0.0 < level < 1.0:
        raise ValueError(f"alpha, level: expected values in (0, 1), got {alpha!r}, {level!r}")
    codes = {str(k): _codes(v, str(k), n, max_values) for k, v in segments.items()}
    for a, b in pairs:
        for c in (a, b):
            if c not in codes:
                raise ValueError(f"pairs: {c!r} is not a segment column ({', '.join(codes)})")
    names = value_names or {}
    var = p * (1.0 - p)

    def label(col: str, code: int) -> str:
        vals = names.get(col)
        return f"{col}={vals[code] if vals is not None and code < len(vals) else code}"

    parts: list[tuple[tuple[str, ...], np.ndarray, np.ndarray]] = []  # (columns, keys, sums)
    skipped = 0
    groups = [((c,), codes[c]) for c in codes]
    for a, b in pairs:
        width = int(codes[b].max()) + 1
        groups.append(((a, b), codes[a] * width + codes[b]))
    for cols, key in groups:
        present, rows, obs, pred, v = _sums(key, p, y, var)
        keep = rows >= min_count
        skipped += int((~keep).sum())
        parts.append((cols, present[keep], np.stack([rows[keep], obs[keep], pred[keep], v[keep]])))
    starts = np.cumsum([0] + [k.shape[0] for _, k, _ in parts])

    def name_of(i: int) -> str:  # names are built only for the segments kept
        j = int(np.searchsorted(starts, i, side="right")) - 1
        cols, keys, _ = parts[j]
        k = int(keys[i - starts[j]])
        if len(cols) == 1:
            return label(cols[0], k)
        width = int(codes[cols[1]].max()) + 1
        return f"{label(cols[0], k // width)} & {label(cols[1], k % width)}"

    if starts[-1] == 0:
        return SegmentScan([], 0, skipped, int(min_count), alpha, level, flagged_count=0)
    rows, obs, pred, v = np.concatenate([a for _, _, a in parts], axis=1)
    m = rows.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        sigma = np.where(v > 0, (obs - pred) / np.sqrt(v), np.where(obs == pred, 0.0, np.inf))
        pval = 2.0 * special.ndtr(-np.abs(sigma))
        ratio = np.where(pred > 0, obs / pred, np.nan)
        a = (1.0 - level) / 2.0
        # the exact Poisson interval: chi2.ppf(q, 2k) / 2 is the Gamma(k) quantile q
        low = np.where(obs > 0, special.gammaincinv(obs, a), 0.0) / pred
        high = special.gammaincinv(obs + 1.0, 1.0 - a) / pred
        z_crit = float(special.ndtri(1.0 - alpha / (2.0 * m)))
        detectable = np.where(pred > 0, z_crit * np.sqrt(v) / pred, np.nan)
    adjusted = holm(pval)
    order = np.lexsort((np.arange(m), -np.abs(sigma)))
    flagged = int((adjusted < alpha).sum())
    if top is not None:  # the flagged ones rank first (smallest p-values): keep at least those
        order = order[: max(int(top), flagged)]
    ranked = [
        Segment(
            name_of(int(i)),
            int(rows[i]),
            float(obs[i]),
            float(pred[i]),
            float(ratio[i]),
            float(low[i]),
            float(high[i]),
            float(sigma[i]),
            float(pval[i]),
            float(adjusted[i]),
            float(detectable[i]),
        )
        for i in order
    ]
    return SegmentScan(ranked, m, skipped, int(min_count), alpha, level, flagged_count=flagged)


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

declare_metric(
    "segments_flagged",
    label="Segments flagged",
    definition="segments (one field = one clean value, at least min_count rows) whose "
    "observed clicks differ from the predicted ones at a Holm-adjusted 5 %.",
    better="lower",
    computed_by="worst_segments",
    section="segments",
)
declare_metric(
    "segment_sigma_max",
    label="Largest segment |σ|",
    definition="the largest |σ| = |observed − predicted clicks| / sqrt(Σp(1−p)) over those "
    "segments.",
    better="lower",
    computed_by="worst_segments",
    section="segments",
)
