"""Bin-free calibration: ECCE, its significance, and the multicalibration error.

**ECCE** (estimated cumulative calibration error; Arrieta-Ibarra, Gujral, Tannen, Tygert and
Xu, "Metrics of calibration for probabilistic predictions", JMLR 23(351), 2022). Sort the n
rows by predicted probability p; the cumulative differences

    C_j = (1/n) Σ_{i ≤ j} (y_(i) − p_(i)),   C_0 = 0,

trace a path that stays near zero for a calibrated predictor. ECCE is its range,
``max_j C_j − min_j C_j`` (the unnormalised Kuiper statistic); no bins, so no bin count to
choose. Tied predictions are one point of the path (C is read only after the last row of each
run of equal p), so ECCE does not depend on how a sort orders ties.

Under perfect calibration (y_i ~ Bernoulli(p_i)) C is approximately Brownian motion run to
time σ² with ``σ = sqrt(Σ p_i (1 − p_i)) / n`` (:func:`ecce_std`), so ``ECCE / σ`` is the
range of a standard Brownian motion on [0, 1]. Its distribution (Feller 1951) gives the
p-value (:func:`ecce_pvalue_from_sigmas`):

    P(R ≤ x) = Σ_{k ≥ 0} (8/x² + 2/(π² (k+½)²)) · exp(−2 π² (k+½)² / x²).

**Multicalibration error** (MCE; Guy, Haimovich, Linder, Okati, Perini, Tax and Tygert,
"Measuring multi-calibration", arXiv:2506.11251, 2025, as implemented by Meta's MCGrad). Each
field is collapsed to its ``max_values − 1`` most frequent values plus "other"; segments are
the whole set and every combination of values of up to ``max_depth`` fields with at least
``min_count`` rows (enumerated by depth, then field combination, at most ``max_segments``).
Within segment s (n_s rows), ECCE_s and σ_s are computed as above with 1/n_s in place of 1/n.
The worst segment is the one whose miscalibration is most *significant*:

    MCE_σ = max_s ECCE_s / σ_s,    MCE = MCE_σ · σ_global    (the "noise-weighted" MCE),

MCE relative = MCE / min(ȳ, 1 − ȳ); its p-value is that of MCE_σ (unadjusted, as MCGrad
reports it) and, for family-wise control, Bonferroni-adjusted over the segments tested.

Cost: ECCE is one sort, O(n log n). MCE sorts once and then costs O(n) per field combination
(a stable radix sort of small segment codes, a cumulative sum, per-segment max/min via
``reduceat``); no Python loop over values. That is ~130 passes over the rows for 26 fields
and 1000 segments, so above ``max_rows`` rows (default 250 000) it is evaluated on a uniform
random subsample of ``max_rows`` rows (fixed ``seed``): σ_s is then the subsample's, so the
significance stays valid (with less power), and the cost stays bounded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import as_numpy, check_fields, check_probs_labels, dense_codes
from ctrcal.metrics._registry import declare_metric

__all__ = [
    "ECCETest",
    "Multicalibration",
    "ecce",
    "ecce_pvalue_from_sigmas",
    "ecce_std",
    "ecce_test",
    "multicalibration_error",
]

OTHER = "other"  # the collapsed value of a field's less frequent values


@dataclass(frozen=True)
class ECCETest:
    """ECCE with its noise level under perfect calibration.

    Attributes:
        ecce: the range of the cumulative differences (absolute, in probability units).
        std: σ = sqrt(Σ p(1−p)) / n, ECCE's scale under perfect calibration.
        sigmas: ecce / std (inf when std is 0 and ecce is not).
        pvalue: P(range of standard Brownian motion ≥ sigmas): small = detectably
            miscalibrated.
    """

    ecce: float
    std: float
    sigmas: float
    pvalue: float


def ecce_pvalue_from_sigmas(x: Any) -> Any:
    """P(R ≥ x) for R the range of a standard Brownian motion on [0, 1] (scalar or array).

    Evaluated from the series in the module docstring; below x = 0.1 the probability is 1 to
    double precision, above x = 40 it is 0.
    """
    arr = np.atleast_1d(np.asarray(x, dtype=np.float64))
    out = np.ones_like(arr)
    out[np.isnan(arr)] = np.nan
    mid = (arr >= 0.1) & (arr < 40.0)
    out[arr >= 40.0] = 0.0
    if mid.any():
        xm = arr[mid]
        # terms decay like exp(-2π²(k+½)²/x²): k up to ~1.4·x reaches 1e-17
        kmax = int(math.ceil(1.4 * float(xm.max()))) + 3
        k = np.arange(kmax)[:, None] + 0.5
        terms = (8.0 / xm**2 + 2.0 / (math.pi**2 * k**2)) * np.exp(-2.0 * math.pi**2 * k**2 / xm**2)
        out[mid] = np.clip(1.0 - terms.sum(axis=0), 0.0, 1.0)
    return float(out[0]) if np.ndim(x) == 0 else out


def _sigmas(e: np.ndarray, s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        z = e / s
    return np.where(s > 0, z, np.where(e > 0, np.inf, 0.0))


def _sorted(
    p: np.ndarray, y: np.ndarray, order: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """p sorted ascending, y − p in that order, and whether any p ties."""
    if order is None:
        order = np.argsort(p, kind="stable")
    ps = p[order].astype(np.float64, copy=False)
    ds = y[order] - ps
    ties = bool(ps.shape[0] > 1 and np.any(ps[1:] == ps[:-1]))
    return ps, ds, ties


def _path_range(ps: np.ndarray, ds: np.ndarray, ties: bool) -> float:
    c = np.cumsum(ds)
    if ties:  # read the path only after the last of each run of equal p
        ends = np.append(ps[1:] != ps[:-1], True)
        c = c[ends]
    return float(max(c.max(), 0.0) - min(c.min(), 0.0))


def ecce(probs: Any, labels: Any) -> float:
    """ECCE: range of (1/n) Σ_{i≤j} (y − p) over rows sorted by p (module docstring)."""
    return ecce_test(probs, labels).ecce


def ecce_std(probs: Any) -> float:
    """σ = sqrt(Σ p(1 − p)) / n: the scale of ECCE under perfect calibration."""
    p, _ = check_probs_labels(probs, np.zeros(np.shape(probs)[0]))
    p = p.astype(np.float64, copy=False)
    return float(np.sqrt(np.dot(p, 1.0 - p)) / p.shape[0])


def ecce_test(probs: Any, labels: Any, *, order: Any = None) -> ECCETest:
    """ECCE, its σ under perfect calibration, ECCE/σ and the p-value (module docstring).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        order: optional [n] permutation sorting ``probs`` ascending, when the caller has one
            (saves the sort).
    """
    p, y = check_probs_labels(probs, labels)
    n = p.shape[0]
    if order is not None:
        order = as_numpy(order, "order")
        if order.shape != p.shape or not np.issubdtype(order.dtype, np.integer):
            raise ValueError(f"order: expected {n} integer positions, got {order.shape}")
    ps, ds, ties = _sorted(p, y, order)
    if order is not None and n > 1 and np.any(ps[1:] < ps[:-1]):
        raise ValueError("order: does not sort probs ascending")
    e = _path_range(ps, ds, ties) / n
    std = float(np.sqrt(np.dot(ps, 1.0 - ps)) / n)
    z = float(_sigmas(np.array([e]), np.array([std]))[0])
    return ECCETest(e, std, z, float(ecce_pvalue_from_sigmas(z)))


@dataclass(frozen=True)
class Multicalibration:
    """The multicalibration error and the segments behind it (see the module docstring).

    Attributes:
        mce: noise-weighted MCE, ``sigmas · global_std`` (absolute, probability units).
        sigmas: the largest ECCE_s / σ_s over the segments.
        relative: mce / min(ȳ, 1 − ȳ) (a fraction of the base rate).
        pvalue: p-value of ``sigmas`` for one segment (unadjusted, as MCGrad reports it).
        pvalue_adjusted: Bonferroni over ``n_segments``, min(1, pvalue · n_segments).
        worst_segment: ``((field, value), ...)`` of the most significant segment; ``()`` is
            the whole set; ``value`` is an original code or ``"other"``.
        n_segments: segments evaluated (the whole set included).
        rows: rows evaluated (``max_rows`` when the input was subsampled).
        global_ecce: ECCE of the evaluated rows.
        global_std: σ of the evaluated rows.
        segment_ecce: [S] ECCE_s, in enumeration order (index 0 = the whole set).
        segment_sigmas: [S] ECCE_s / σ_s.
        segment_rows: [S] rows per segment.
        segments: S segment descriptions like ``worst_segment``.
    """

    mce: float
    sigmas: float
    relative: float
    pvalue: float
    pvalue_adjusted: float
    worst_segment: tuple[tuple[str, Any], ...]
    n_segments: int
    rows: int
    global_ecce: float
    global_std: float
    segment_ecce: np.ndarray
    segment_sigmas: np.ndarray
    segment_rows: np.ndarray
    segments: list[tuple[tuple[str, Any], ...]]


def _collapse(
    col: np.ndarray,
    max_values: int,
    lo: int | None,
    hi: int | None,
    weight: np.ndarray | None = None,
) -> tuple[np.ndarray, list[Any]]:
    """Codes 0..m−1 (m ≤ max_values): the most frequent values first, then "other"."""
    codes, values = dense_codes(col, lo, hi)
    count = np.bincount(codes, weights=weight, minlength=values.shape[0])
    present = np.flatnonzero(count)
    order = present[np.lexsort((present, -count[present]))]  # count desc, then code
    keep = order if order.size <= max_values else order[: max_values - 1]
    lut = np.full(values.shape[0], keep.size, dtype=np.uint16)
    lut[keep] = np.arange(keep.size, dtype=np.uint16)
    labels: list[Any] = [values[i].item() for i in keep]
    if order.size > keep.size:
        labels.append(OTHER)
    return lut[codes], labels


def _key_dtype(groups: int) -> type:
    return np.uint8 if groups <= 256 else np.uint16 if groups <= 65536 else np.int64


def _check_mce_args(max_depth: int, max_values: int, min_count: int, max_segments: int) -> None:
    for name, value, low in (
        ("max_depth", max_depth, 0),
        ("max_values", max_values, 2),
        ("min_count", min_count, 1),
        ("max_segments", max_segments, 1),
    ):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")


def multicalibration_error(
    probs: Any,
    labels: Any,
    fields: Any,
    *,
    names: Sequence[str] | None = None,
    max_depth: int = 3,
    max_values: int = 3,
    min_count: int = 10,
    max_segments: int = 1000,
    max_rows: int | None = 250_000,
    seed: int = 0,
    sample_weight: Any = None,
) -> Multicalibration:
    """The worst noise-weighted ECCE over segments of up to ``max_depth`` fields.

    Defaults are MCGrad's (depth 3, 3 values per field, segments of >= 10 rows, at most
    1000 segments).

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        fields: [n, F] integer codes (array or tensor), a mapping ``name -> [n] codes`` or a
            sequence of [n] arrays; bucketise numerics first (:func:`bucketize`).
        names: F field names for an array (default ``field0`` ...).
        max_depth: segments combine values of up to this many fields (0 = whole set only).
        max_values: values per field: the ``max_values − 1`` most frequent and "other".
        min_count: segments with fewer rows are not evaluated.
        max_segments: stop after this many segments (the whole set counts).
        max_rows: evaluate a uniform random subsample of this many rows when there are more
            (``None``: all rows).
        seed: the subsample's seed.
        sample_weight: optional [n] integer row counts (a row counted w times, as a
            bootstrap replicate counts its rows): the result of the rows repeated. Weighted
            rows are not subsampled (``max_rows`` must be None).

    Returns:
        A :class:`Multicalibration`.

    Raises:
        ValueError: naming the argument.
    """
    _check_mce_args(max_depth, max_values, min_count, max_segments)
    if max_rows is not None and (not isinstance(max_rows, (int, np.integer)) or max_rows < 2):
        raise ValueError(f"max_rows: expected None or an integer >= 2, got {max_rows!r}")
    p, y = check_probs_labels(probs, labels)
    keys, cols, ranges = check_fields(fields, p.shape[0], names)
    n_all = p.shape[0]
    weight = None
    if sample_weight is not None:
        weight = as_numpy(sample_weight, "sample_weight").astype(np.float64)
        if max_rows is not None:
            raise ValueError("sample_weight: weighted rows are not subsampled; pass max_rows=None")
        if weight.shape != (n_all,) or not np.all((weight >= 0) & (weight == np.floor(weight))):
            raise ValueError(f"sample_weight: expected {n_all} integer row counts >= 0")
        take = np.flatnonzero(weight > 0)  # a row counted 0 times is no row
        p, y, cols, weight = p[take], y[take], [c[take] for c in cols], weight[take]
        ranges = [(None, None)] * len(cols)
    elif max_rows is not None and n_all > max_rows:
        take = np.random.default_rng(seed).choice(n_all, size=int(max_rows), replace=False)
        p, y, cols = p[take], y[take], [c[take] for c in cols]
        ranges = [(None, None)] * len(cols)
    rows = p.shape[0]
    order = np.argsort(p, kind="stable")
    ps = p[order].astype(np.float64, copy=False)
    ds = y[order] - ps
    vs = ps * (1.0 - ps)
    n: float = rows
    if weight is not None:  # a row's counts enter its path step and its variance
        weight = weight[order]
        ds, vs, n = ds * weight, vs * weight, float(weight.sum())
    new_run = ps[1:] != ps[:-1]
    ties = bool(rows > 1 and not new_run.all())
    # runs of equal p, numbered in p order (int32 keeps the per-partition gather small)
    block = np.concatenate([[0], np.cumsum(new_run, dtype=np.int32)]) if ties else None
    global_ecce = _path_range(ps, ds, ties) / n
    global_std = float(np.sqrt(vs.sum()) / n)

    codes, labels_by_field = [], []
    for col, (lo, hi) in zip(cols, ranges, strict=True):
        c, lab = _collapse(col[order], int(max_values), lo, hi, weight)
        codes.append(c)
        labels_by_field.append(lab)
    sizes = [len(lab) for lab in labels_by_field]

    seg_e, seg_s, seg_n = [np.array([global_ecce])], [np.array([global_std])], [np.array([n])]
    seg_desc: list[tuple[tuple[str, Any], ...]] = [()]
    total = 1
    for depth in range(1, int(max_depth) + 1):
        for combo in itertools.combinations(range(len(cols)), depth):
            if total >= max_segments:
                break
            groups = int(np.prod([sizes[f] for f in combo]))
            dtype = _key_dtype(groups)
            key = codes[combo[0]].astype(dtype)
            for f in combo[1:]:
                key = key * dtype(sizes[f]) + codes[f].astype(dtype)
            in_group = np.bincount(key, minlength=groups)
            count = in_group if weight is None else np.bincount(key, weight, minlength=groups)
            ok = count >= min_count
            if not ok.any():
                continue
            e, s = _segments_range(key, in_group, ds, vs, block, count)
            nonempty = np.flatnonzero(in_group)
            sel = np.flatnonzero(ok[nonempty])[: max_segments - total]
            seg_e.append(e[sel])
            seg_s.append(s[sel])
            seg_n.append(count[nonempty[sel]])
            for g in nonempty[sel]:
                seg_desc.append(_describe(int(g), combo, sizes, keys, labels_by_field))
            total += sel.size
    e_all, s_all = np.concatenate(seg_e), np.concatenate(seg_s)
    z_all = _sigmas(e_all, s_all)
    worst = int(np.argmax(z_all))
    z = float(z_all[worst])
    pval = float(ecce_pvalue_from_sigmas(z))
    prev = float(y.mean()) if weight is None else float(np.dot(weight, y[order]) / n)
    base = min(prev, 1.0 - prev)
    mce = z * global_std if math.isfinite(z) else float("inf")
    return Multicalibration(
        mce=mce,
        sigmas=z,
        relative=mce / base if base > 0 else float("nan"),
        pvalue=pval,
        pvalue_adjusted=min(1.0, pval * total),
        worst_segment=seg_desc[worst],
        n_segments=total,
        rows=int(n),
        global_ecce=global_ecce,
        global_std=global_std,
        segment_ecce=e_all,
        segment_sigmas=z_all,
        segment_rows=np.concatenate(seg_n).astype(np.int64),
        segments=seg_desc,
    )


def _segments_range(
    key: np.ndarray,
    count: np.ndarray,
    ds: np.ndarray,
    vs: np.ndarray,
    block: np.ndarray | None,
    weighted: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """ECCE_s and σ_s of every non-empty group of ``key`` (rows already sorted by p).

    A stable sort by group keeps each group's rows in p order, so one cumulative sum holds
    every group's path back to back: group g's path is C[start_g − 1 ..] minus its first
    value, and its range comes from per-group max/min (``reduceat``). ``block`` numbers the
    runs of equal p (None: no ties); within a group only the last row of a run is a point of
    the path. ``weighted``: the groups' weighted sizes (rows counted by their weights, which
    ``ds`` and ``vs`` already carry); ``count`` stays their rows.
    """
    order = np.argsort(key, kind="stable")  # radix sort for these small integer keys
    c = np.cumsum(ds[order])
    nonempty = count > 0
    sizes = count[nonempty]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if block is None:
        hi = np.maximum.reduceat(c, starts)
        lo = np.minimum.reduceat(c, starts)
    else:
        b = block[order]
        last = np.empty(c.shape[0], dtype=bool)
        np.not_equal(b[1:], b[:-1], out=last[:-1])
        last[ends - 1] = True  # a group's last row ends its run even if p ties across groups
        keep = np.flatnonzero(last)
        ck = c[keep]
        first = np.searchsorted(keep, starts)  # every group keeps its last row, so in range
        hi = np.maximum.reduceat(ck, first)
        lo = np.minimum.reduceat(ck, first)
    base = np.where(starts > 0, c[np.maximum(starts - 1, 0)], 0.0)
    if weighted is not None:  # a group's rows counted by their weights
        sizes = weighted[nonempty]
    e = (np.maximum(hi, base) - np.minimum(lo, base)) / sizes
    var = np.bincount(key, weights=vs, minlength=count.shape[0])[nonempty]
    return e, np.sqrt(var) / sizes


def _describe(
    g: int, combo: tuple[int, ...], sizes: list[int], keys: list[str], labels: list[list[Any]]
) -> tuple[tuple[str, Any], ...]:
    parts = []
    for f in reversed(combo):  # the key is mixed-radix with the last field fastest
        g, code = divmod(g, sizes[f])
        parts.append((keys[f], labels[f][code]))
    return tuple(reversed(parts))


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

_SUMMARY = "calibration_summary"
declare_metric(
    "ecce",
    label="ECCE (bin-free cumulative calibration error)",
    definition="bin-free cumulative calibration error (Arrieta-Ibarra et al., JMLR 2022): range "
    "of (1/n)·Σ_{i≤j}(y−p) over rows sorted by p; lower is better.",
    better="lower",
    compute=ecce,
    section="bin-free",
    tables=("calibration", "shift", "compared"),
    bounds=(0.0, 1.0),
)
declare_metric(
    "ecce_std",
    label="σ of ECCE",
    definition="σ = sqrt(Σp(1−p))/n: the scale of ECCE under perfect calibration.",
    better=None,
    computed_by=_SUMMARY,
    section="bin-free",
)
declare_metric(
    "ecce_sigmas",
    label="ECCE / σ (its significance: > 2.5 is detectable at p < 0.05)",
    definition="ECCE / σ with σ = sqrt(Σp(1−p))/n its scale under perfect calibration; "
    "above ~2.5 miscalibration is detectable (ecce_pvalue < 0.05).",
    better=None,
    computed_by=_SUMMARY,
    section="bin-free",
    tables=("calibration", "shift"),
)
declare_metric(
    "ecce_pvalue",
    label="ECCE p-value",
    definition="P(ECCE this large | perfectly calibrated): range of Brownian motion.",
    better=None,
    computed_by=_SUMMARY,
    section="bin-free",
    tables=("calibration",),
    bounds=(0.0, 1.0),
)
declare_metric(
    "mce",
    label="Multicalibration error (noise-weighted worst segment)",
    definition="multicalibration error (MCGrad's noise-weighted definition): max over segments "
    "(values of up to 3 fields, top-2 values + other per field, >= 10 rows, <= 1000 segments; "
    "a fixed 250k-row subsample of larger splits) of ECCE_s/σ_s, times the global σ; lower "
    "is better.",
    better="lower",
    computed_by=_SUMMARY,
    section="segments",
    tables=("calibration", "shift", "compared"),
    segments=True,
)
declare_metric(
    "mce_sigmas",
    label="Multicalibration error / σ",
    definition="that worst segment's ECCE_s/σ_s.",
    better=None,
    computed_by=_SUMMARY,
    section="segments",
    tables=("calibration",),
    segments=True,
)
declare_metric(
    "mce_relative",
    label="Relative multicalibration error",
    definition="the multicalibration error over min(click rate, 1 − click rate).",
    better="lower",
    computed_by=_SUMMARY,
    section="segments",
    segments=True,
)
declare_metric(
    "mce_pvalue",
    label="Multicalibration error: p-value, Bonferroni-adjusted over the segments",
    definition="its p-value, Bonferroni-adjusted over the segments tested.",
    better=None,
    computed_by=_SUMMARY,
    section="segments",
    tables=("calibration", "shift"),
    segments=True,
    bounds=(0.0, 1.0),
)
declare_metric(
    "mce_pvalue_unadjusted",
    label="Multicalibration error: p-value, unadjusted",
    definition="the worst segment's p-value before the adjustment (as MCGrad reports it).",
    better=None,
    computed_by=_SUMMARY,
    section="segments",
    segments=True,
    bounds=(0.0, 1.0),
)
declare_metric(
    "mce_segments",
    label="Segments tested",
    definition="the number of segments the multicalibration error was taken over.",
    better=None,
    computed_by=_SUMMARY,
    section="segments",
    segments=True,
)


class WeightedMCE:
    """:func:`multicalibration_error` of the same rows under many row weightings (bootstrap
    replicates' row counts): the rows are sorted, collapsed and grouped once, and a weighting
    costs a few passes per field combination instead of a sort each.

    A weighting whose collapsed values differ from the rows' own (another value among a
    field's most frequent) is not evaluated here: :meth:`__call__` returns None and the
    caller runs ``multicalibration_error(..., sample_weight=...)``. When the same values
    rank in another order the segments are the same, numbered otherwise: the same result,
    but for which of two exactly equal segments is named the worst (and, when
    ``max_segments`` cuts the list, the order is required too).

    Args:
        probs, labels, fields, names, max_depth, max_values, min_count, max_segments: as for
            :func:`multicalibration_error` (no subsample: weight the subsample's rows).
    """

    def __init__(
        self,
        probs: Any,
        labels: Any,
        fields: Any,
        *,
        names: Sequence[str] | None = None,
        max_depth: int = 3,
        max_values: int = 3,
        min_count: int = 10,
        max_segments: int = 1000,
    ) -> None:
        _check_mce_args(max_depth, max_values, min_count, max_segments)
        p, y = check_probs_labels(probs, labels)
        _, cols, ranges = check_fields(fields, p.shape[0], names)
        self.min_count, self.max_segments = min_count, int(max_segments)
        self.max_values = int(max_values)
        order = np.argsort(p, kind="stable")
        self.order = order
        ps = p[order].astype(np.float64, copy=False)
        self.ds, self.vs, self.ys = y[order] - ps, ps * (1.0 - ps), y[order]
        new_run = ps[1:] != ps[:-1]
        self.ties = bool(ps.shape[0] > 1 and not new_run.all())
        block = np.concatenate([[0], np.cumsum(new_run, dtype=np.int32)]) if self.ties else None
        self.run_ends = np.flatnonzero(np.append(new_run, True)) if self.ties else None
        self.fields = []  # per field: dense codes in p order, number of values
        for col, (lo, hi) in zip(cols, ranges, strict=True):
            codes, values = dense_codes(col[order], lo, hi)
            self.fields.append((codes, values.shape[0]))
        collapsed = [self._collapse(codes, nv, None) for codes, nv in self.fields]
        sizes = [len(keep) + other for keep, other, _ in collapsed]
        # With every segment evaluated (no max_segments cut), a weighting that keeps the same
        # values of each field makes the same segments, only numbered in another order: the
        # same worst segment and the same count. With a cut, the order matters too.
        possible = 1 + sum(
            int(np.prod([sizes[f] for f in combo]))
            for depth in range(1, int(max_depth) + 1)
            for combo in itertools.combinations(range(len(cols)), depth)
        )
        self.ordered = possible > self.max_segments
        self.signature = [self._signature(keep, other) for keep, other, _ in collapsed]
        self.combos = []  # per combination: its row order, group starts, path points
        for depth in range(1, int(max_depth) + 1):
            for combo in itertools.combinations(range(len(cols)), depth):
                groups = int(np.prod([sizes[f] for f in combo]))
                key = collapsed[combo[0]][2].astype(np.int64)
                for f in combo[1:]:
                    key = key * sizes[f] + collapsed[f][2]
                rows = np.bincount(key, minlength=groups)
                by_key = np.argsort(key, kind="stable")
                present = np.flatnonzero(rows)
                ends = np.cumsum(rows[present])
                starts = ends - rows[present]
                if block is None:
                    keep, first = None, starts
                else:
                    b = block[by_key]
                    last = np.empty(b.shape[0], dtype=bool)
                    np.not_equal(b[1:], b[:-1], out=last[:-1])
                    last[ends - 1] = True
                    keep = np.flatnonzero(last)
                    first = np.searchsorted(keep, starts)
                self.combos.append((by_key, starts, keep, first))

    def _signature(self, keep: np.ndarray, other: bool) -> tuple:
        return (tuple(keep) if self.ordered else frozenset(keep.tolist()), other)

    def _collapse(
        self, codes: np.ndarray, n_values: int, weight: np.ndarray | None, codes_too: bool = True
    ) -> tuple[np.ndarray, bool, np.ndarray | None]:
        """(kept values, whether an "other" exists, collapsed codes): :func:`_collapse`'s."""
        count = np.bincount(codes, weights=weight, minlength=n_values)
        present = np.flatnonzero(count)
        order = present[np.lexsort((present, -count[present]))]
        keep = order if order.size <= self.max_values else order[: self.max_values - 1]
        if not codes_too:
            return keep, order.size > keep.size, None
        lut = np.full(n_values, keep.size, dtype=np.int64)
        lut[keep] = np.arange(keep.size)
        return keep, order.size > keep.size, lut[codes]

    def __call__(self, weight: np.ndarray) -> tuple[float, float, float, float, float, int] | None:
        """``(mce, sigmas, relative, pvalue_adjusted, pvalue, n_segments)`` of the rows
        weighted by ``weight`` [n] (integer counts, in the rows' given order), or None."""
        w = np.asarray(weight, dtype=np.float64)[self.order]
        for (codes, nv), signature in zip(self.fields, self.signature, strict=True):
            # the same values kept, in the same order (their codes), and an "other" as before;
            # rows of no weight in "other" stay there and add nothing
            keep, other, _ = self._collapse(codes, nv, w, codes_too=False)
            if self._signature(keep, other) != signature:
                return None
        n = float(w.sum())
        ds, vs = self.ds * w, self.vs * w
        c = np.cumsum(ds)
        path = c[self.run_ends] if self.ties else c
        global_ecce = float(max(path.max(), 0.0) - min(path.min(), 0.0)) / n
        global_std = float(np.sqrt(vs.sum()) / n)
        seg_e, seg_s = [np.array([global_ecce])], [np.array([global_std])]
        total = 1
        for by_key, starts, keep, first in self.combos:
            if total >= self.max_segments:
                break
            size = np.add.reduceat(w[by_key], starts)
            ok = size >= self.min_count
            if not ok.any():
                continue
            c = np.cumsum(ds[by_key])
            ck = c if keep is None else c[keep]
            hi = np.maximum.reduceat(ck, first)
            lo = np.minimum.reduceat(ck, first)
            base = np.where(starts > 0, c[np.maximum(starts - 1, 0)], 0.0)
            var = np.add.reduceat(vs[by_key], starts)
            sel = np.flatnonzero(ok)[: self.max_segments - total]
            seg_e.append((np.maximum(hi, base) - np.minimum(lo, base))[sel] / size[sel])
            seg_s.append(np.sqrt(var[sel]) / size[sel])
            total += sel.size
        z_all = _sigmas(np.concatenate(seg_e), np.concatenate(seg_s))
        z = float(z_all[int(np.argmax(z_all))])
        pval = float(ecce_pvalue_from_sigmas(z))
        prev = float(np.dot(w, self.ys) / n)
        base_rate = min(prev, 1.0 - prev)
        mce = z * global_std if math.isfinite(z) else float("inf")
        relative = mce / base_rate if base_rate > 0 else float("nan")
        return mce, z, relative, min(1.0, pval * total), pval, total
