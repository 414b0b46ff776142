"""Row-level bootstrap confidence intervals of one evaluation (and of a paired comparison).

Training seeds say how much a metric moves when the model is trained again; a single test set
has its own sampling noise: the rows. Both CIs here resample *rows*.

**ECE, PCOC and AUC of one evaluation** (:func:`bootstrap_ci`): the Poisson bootstrap
(Hanley and MacGibbon 2006; Chamandy et al. 2012), each row drawn w_i ~ Poisson(1) times per
replicate, the standard bootstrap for large data (the replicate's size varies by about √n,
irrelevant to these ratio metrics). It is computed without a weight per row and replicate:

1. Rows are sorted by p once and cut into at most ``max_blocks`` blocks of consecutive rows;
   a block never splits a run of equal p nor straddles an ECE bin edge.
2. A cell is (block, label). The sum of the Poisson(1) weights of a cell's c rows is exactly
   Poisson(c), so every replicate draws one count T per cell (``n_boot × cells`` draws in all,
   not ``n_boot × n``).
3. Given T, the cell's weighted Σ w·p has mean T·p̄ and variance T·var(p) (T draws with
   replacement of the cell's p), drawn as a normal with those moments.
4. ECE needs Σw, Σw·y and Σw·p per bin: sums of cells, exact given the cell draws. PCOC too.
   AUC's pairs in different blocks are ordered by the blocks (no ties cross a block), so
   Σ T_pos,k · Σ_{l<k} T_neg,l is exact; the pairs *within* a block enter by their mean given
   the counts, T_pos,k · T_neg,k · AUC_k.

With at most ``max_blocks`` rows every block is one run of equal p, every cell holds one value
of p and one label, and the result is the Poisson bootstrap exactly. Above, the approximation
is confined to the within-block term of AUC (a fraction ~1/max_blocks of the pairs) and the
normal draw of a cell's Σw·p (cells span ~1/max_blocks of the rows in p order, so var(p) is
tiny). Cost: one sort and O(n) passes, then O(n_boot · max_blocks).

**Paired comparison of two models on the same rows** (:func:`paired_bootstrap`): any metrics,
each replicate resampling row indices once (multinomial, n of n) and evaluating both models
on them, so the difference keeps the pairing. A replicate is its row counts (how often each
row was drawn: the same draws, so the same rows, as taking the rows themselves). For the
calibration report's metrics (:class:`ReplicateRows`) the counts are the weights of sums
over rows sorted once: linear metrics are one product of the counts with per-row columns;
AUC, ECCE, equal-width and equal-mass ECE, the Brier terms and Field-RCE/ECE are running or
grouped sums; the logit shift (calibration-free NE, calibration-in-the-large) and the
calibration slope are Newton's method on Taylor series around the fit on all rows (the
series' sums again one product; radius π in the logit, checked per replicate); smooth ECE
and the multicalibration error run their own searches on weighted rows. Every value equals
the metric of the replicate's rows up to the order of floating-point sums (and the
iterative fits' tolerance, 1e-10); a replicate outside the series' reach, or with a segment
column left at one value, is evaluated on its rows as before.

Intervals are percentile intervals of the replicates; ``se`` is their standard deviation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import check_probs_labels
from ctrcal.metrics._metrics import _uniform_edges

__all__ = ["BootstrapCI", "PairedCI", "bootstrap_ci", "paired_bootstrap"]

BOOTSTRAP_METRICS = ("ece", "pcoc", "auc")


@dataclass(frozen=True)
class BootstrapCI:
    """A metric with its row-level bootstrap interval.

    Attributes:
        estimate: the metric on the rows as given.
        low, high: the percentile interval at ``level``.
        se: standard deviation of the replicates.
        level: the interval's coverage, e.g. 0.95.
        replicates: [n_boot] the metric per replicate (NaN where undefined).
    """

    estimate: float
    low: float
    high: float
    se: float
    level: float
    replicates: np.ndarray

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "se": self.se}


def _interval(est: float, reps: np.ndarray, level: float) -> BootstrapCI:
    ok = reps[np.isfinite(reps)]
    if ok.size < 2:
        nan = float("nan")
        return BootstrapCI(float(est), nan, nan, nan, level, reps)
    a = (1.0 - level) / 2.0
    low, high = np.quantile(ok, [a, 1.0 - a])
    return BootstrapCI(float(est), float(low), float(high), float(ok.std(ddof=1)), level, reps)


def _check_args(n_boot: int, level: float) -> None:
    if not isinstance(n_boot, (int, np.integer)) or n_boot < 2:
        raise ValueError(f"n_boot: expected an integer >= 2, got {n_boot!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a coverage in (0, 1), got {level!r}")


@dataclass(frozen=True)
class _Cells:
    """Per-(block, label) sufficient statistics; blocks in p order. Arrays are [K]."""

    n_pos: np.ndarray
    n_neg: np.ndarray
    mean_p_pos: np.ndarray
    mean_p_neg: np.ndarray
    var_p_pos: np.ndarray
    var_p_neg: np.ndarray
    within_auc: np.ndarray  # mean pair score of the block's (pos, neg) pairs (0 if none)
    bin_starts: np.ndarray  # first block of every non-empty ECE bin


def _cells(p: np.ndarray, y: np.ndarray, n_bins: int, max_blocks: int) -> _Cells:
    """Sort once, then work on runs of equal p (p is constant in a run: its sums need no pass
    over rows) and reduce runs to blocks with contiguous ``reduceat``."""
    n = p.shape[0]
    order = np.argsort(p)  # ties form runs below, so any order of equal p will do
    ps = p[order]
    run_start = np.empty(n, dtype=bool)
    run_start[0] = True
    np.not_equal(ps[1:], ps[:-1], out=run_start[1:])
    first = np.flatnonzero(run_start)  # [R] first sorted position of every run
    length = np.diff(np.append(first, n)).astype(np.float64)
    clicks_before = np.concatenate([[0.0], np.cumsum(y[order])])
    pos = clicks_before[np.append(first[1:], n)] - clicks_before[first]  # clicks per run
    neg = length - pos
    pr = ps[first].astype(np.float64)
    # blocks: a run belongs to the block of its first row; blocks also end at ECE bin edges
    edges = _uniform_edges(n_bins, p.dtype)  # the bins of metrics.ece, boundary cases alike
    cuts = np.searchsorted(pr, edges, side="left")  # first run of each bin (edges <= p)
    new_bin = np.zeros(first.shape[0], dtype=bool)
    new_bin[cuts[(cuts > 0) & (cuts < first.shape[0])]] = True
    key = first // -(-n // max_blocks)
    start = new_bin.copy()
    start[0] = True
    start[1:] |= key[1:] != key[:-1]
    bstart = np.flatnonzero(start)  # [K] first run of every block

    def per_block(x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(x, bstart)

    n_pos, n_neg = per_block(pos), per_block(neg)
    p2 = pr * pr
    with np.errstate(invalid="ignore", divide="ignore"):
        mp_pos = np.where(n_pos > 0, per_block(pos * pr) / n_pos, 0.0)
        mp_neg = np.where(n_neg > 0, per_block(neg * pr) / n_neg, 0.0)
        vp_pos = np.where(n_pos > 0, np.maximum(per_block(pos * p2) / n_pos - mp_pos**2, 0), 0.0)
        vp_neg = np.where(n_neg > 0, np.maximum(per_block(neg * p2) / n_neg - mp_neg**2, 0), 0.0)
    # within-block pairs of each run's clicks: the block's non-clicks in runs below it, plus
    # half the non-clicks of its own run (ties)
    neg_before = np.cumsum(neg) - neg
    block = np.cumsum(start) - 1
    score = pos * (neg_before - neg_before[bstart][block] + 0.5 * neg)
    pairs = n_pos * n_neg
    with np.errstate(invalid="ignore", divide="ignore"):
        within = np.where(pairs > 0, per_block(score) / pairs, 0.0)
    bin_starts = np.flatnonzero(new_bin[bstart] | (np.arange(bstart.shape[0]) == 0))
    return _Cells(n_pos, n_neg, mp_pos, mp_neg, vp_pos, vp_neg, within, bin_starts)


def _metrics_of_counts(
    c: _Cells, t_pos: np.ndarray, t_neg: np.ndarray, s_pos: np.ndarray, s_neg: np.ndarray
) -> dict[str, np.ndarray]:
    """ECE, PCOC and AUC of weighted cell totals [R, K] (or [1, K] for the point estimate)."""
    total = t_pos.sum(axis=1) + t_neg.sum(axis=1)
    clicks = t_pos.sum(axis=1)
    sum_p = s_pos + s_neg
    gap = np.add.reduceat(sum_p - t_pos, c.bin_starts, axis=1)
    negs = t_neg.sum(axis=1)
    below = np.cumsum(t_neg, axis=1) - t_neg
    u = (t_pos * below).sum(axis=1) + (t_pos * t_neg * c.within_auc).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "ece": np.abs(gap).sum(axis=1) / total,
            "pcoc": np.where(clicks > 0, sum_p.sum(axis=1) / clicks, np.nan),
            "auc": np.where((clicks > 0) & (negs > 0), u / (clicks * negs), np.nan),
        }


def bootstrap_ci(
    probs: Any,
    labels: Any,
    *,
    n_boot: int = 200,
    level: float = 0.95,
    n_bins: int = 15,
    seed: int = 0,
    max_blocks: int = 1024,
) -> dict[str, BootstrapCI]:
    """Row-level Poisson-bootstrap intervals of ECE, PCOC and AUC (module docstring).

    The estimates equal :func:`~ctrcal.metrics._metrics.ece` (``n_bins`` equal-width bins),
    :func:`~ctrcal.metrics._metrics.pcoc` and :func:`~ctrcal.metrics._metrics.auc`.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        n_boot: replicates (``report.bootstrap``).
        level: interval coverage.
        n_bins: ECE's bins.
        seed: the replicates' seed (same seed, same intervals).
        max_blocks: blocks of consecutive rows in p order (module docstring); at least the
            number of rows gives the exact Poisson bootstrap.

    Returns:
        ``{"ece", "pcoc", "auc"} -> BootstrapCI``.
    """
    _check_args(n_boot, level)
    if not isinstance(max_blocks, (int, np.integer)) or max_blocks < 1:
        raise ValueError(f"max_blocks: expected a positive integer, got {max_blocks!r}")
    p, y = check_probs_labels(probs, labels)
    c = _cells(p, y, int(n_bins), int(max_blocks))
    point = _metrics_of_counts(
        c,
        c.n_pos[None],
        c.n_neg[None],
        (c.n_pos * c.mean_p_pos)[None],
        (c.n_neg * c.mean_p_neg)[None],
    )
    rng = np.random.default_rng(seed)
    shape = (int(n_boot), c.n_pos.shape[0])
    t_pos = rng.poisson(c.n_pos, size=shape).astype(np.float64)
    t_neg = rng.poisson(c.n_neg, size=shape).astype(np.float64)
    s_pos = t_pos * c.mean_p_pos + np.sqrt(t_pos * c.var_p_pos) * rng.standard_normal(shape)
    s_neg = t_neg * c.mean_p_neg + np.sqrt(t_neg * c.var_p_neg) * rng.standard_normal(shape)
    reps = _metrics_of_counts(c, t_pos, t_neg, s_pos, s_neg)
    return {m: _interval(float(point[m][0]), reps[m], level) for m in BOOTSTRAP_METRICS}


@dataclass(frozen=True)
class PairedCI:
    """One metric of two models on the same rows, with paired row-bootstrap intervals.

    Attributes:
        a, b: each model's metric with its interval.
        diff: b − a with its interval (the pairing kept: both on the same resampled rows).
        pvalue: two-sided bootstrap p-value of ``diff`` (twice the smaller share of replicates
            on either side of 0, at least ``resolution``).
        resolution: 1 / the number of finite replicates, the smallest p-value they can give:
            a ``pvalue`` equal to it means "p < resolution", not a value.
    """

    a: BootstrapCI
    b: BootstrapCI
    diff: BootstrapCI
    pvalue: float
    resolution: float


MetricFn = Callable[[np.ndarray, np.ndarray, np.ndarray | None], Mapping[str, float]]


def paired_bootstrap(
    metric_fn: MetricFn,
    probs_a: Any,
    probs_b: Any,
    labels: Any,
    *,
    n_boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
    weighted: Mapping[str, Any] | None = None,
) -> dict[str, PairedCI]:
    """Paired row bootstrap of every metric ``metric_fn`` returns (module docstring).

    Args:
        metric_fn: ``metric_fn(probs, labels, rows) -> {name: value}``; ``rows`` [m] are the
            row indices evaluated (None: all rows, in order), so the function can take the
            same rows of anything else it needs (segment columns).
        probs_a, probs_b: [n] the two models' click probabilities.
        labels: [n] clicks, 0/1.
        n_boot: replicates.
        level: interval coverage.
        seed: the replicates' seed.
        weighted: when ``metric_fn`` computes the calibration report's metrics
            (``model_metrics``), their keyword arguments ``segments`` (name -> [n] codes),
            ``n_bins`` and ``min_count``: the replicates are then evaluated from their row
            counts (:class:`ReplicateRows`), and ``metric_fn`` only evaluates the rows of a
            replicate they cannot evaluate exactly. None: ``metric_fn`` evaluates every
            replicate.

    Returns:
        ``{metric: PairedCI}`` for every metric of the point evaluation.
    """
    _check_args(n_boot, level)
    pa, y = check_probs_labels(probs_a, labels)
    pb, _ = check_probs_labels(probs_b, labels)
    est_a, est_b = dict(metric_fn(pa, y, None)), dict(metric_fn(pb, y, None))
    names = [k for k in est_a if k in est_b]
    reps = np.full((2, len(names), int(n_boot)), np.nan)
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    # a replicate draws n row positions of the rows sorted by model a's probabilities, and
    # takes them in that order: the same multiset of rows as any order (row order only moves
    # choices among equals, such as MCE's random subsample), and the metrics' sorts of a's
    # probabilities meet sorted input. Its rows are the count of each position drawn.
    by_a = np.argsort(pa, kind="stable")
    models = (pa, pb)
    evaluators = None
    if weighted is not None:
        segments = {k: np.asarray(v)[by_a] for k, v in weighted.get("segments", {}).items()}
        options = {k: weighted[k] for k in ("n_bins", "min_count") if k in weighted}
        evaluators = [ReplicateRows(p[by_a], y[by_a], segments, **options) for p in models]
    chunk = max(1, min(int(n_boot), _CHUNK_ELEMENTS // max(n, 1)))
    for start in range(0, int(n_boot), chunk):
        stop = min(start + chunk, int(n_boot))
        counts = np.stack(
            [np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(start, stop)]
        )
        for side, p in enumerate(models):
            redo = np.arange(stop - start)
            if evaluators is not None:
                values, exact = evaluators[side].evaluate(counts)
                _declared_weighted(values, names, p[by_a], y[by_a], counts)
                if all(k in values for k in names):
                    for j, k in enumerate(names):
                        reps[side, j, start:stop] = values[k]
                    redo = np.flatnonzero(~exact)
            for i in redo:
                rows = by_a[np.repeat(np.arange(n), counts[i])]
                m = metric_fn(p[rows], y[rows], rows)
                reps[side, :, start + i] = [m.get(k, np.nan) for k in names]
    reps_a, reps_b = reps
    out = {}
    for j, k in enumerate(names):
        d = reps_b[j] - reps_a[j]
        ok = d[np.isfinite(d)]
        if ok.size:
            side = min(float((ok <= 0).mean()), float((ok >= 0).mean()))
            resolution = 1.0 / ok.size
            pval = min(1.0, max(2.0 * side, resolution))
        else:
            pval = resolution = float("nan")
        out[k] = PairedCI(
            _interval(est_a[k], reps_a[j], level),
            _interval(est_b[k], reps_b[j], level),
            _interval(est_b[k] - est_a[k], d, level),
            pval,
            resolution,
        )
    return out


def _declared_weighted(
    values: dict[str, np.ndarray], names: list[str], p: np.ndarray, y: np.ndarray, counts
) -> None:
    """Every metric of ``names`` missing from ``values`` whose declaration takes row counts
    (``weighted``), computed by its own function on each replicate's counts."""
    from ctrcal.metrics._registry import metric_of

    desc = None
    for name in names:
        m = metric_of(name) if name not in values else None
        if m is not None and m.weighted and m.compute is not None and m.name == name:
            if desc is None:  # rows already in descending order make a ranking's sort cheap
                desc = np.argsort(-p, kind="stable")
            ps, ys = p[desc], y[desc]
            values[name] = np.array([m.compute(ps, ys, sample_weight=c[desc]) for c in counts])


# ---------------------------------------------------------------------------------------------
# Count-weighted replicates: the paired bootstrap's metrics without materialising its rows

_MCE_KEYS = ("mce", "mce_sigmas", "mce_relative", "mce_pvalue", "mce_pvalue_unadjusted")
_MCE_KEYS += ("mce_segments",)  # calibration_summary's keys, in WeightedMCE's order
_CHUNK_ELEMENTS = 1 << 22  # replicates drawn together: at most this many counts at once
_TAYLOR_TERMS = 12  # terms of the logit-shift expansion (module docstring)
_TAYLOR_MAX_STEP = 0.25  # beyond this shift from the full rows' root, solve exactly instead
_EXTREME_LOGIT = 14.0  # rows whose shifted logit may reach the logloss clip: summed exactly
_SLOPE_TERMS = 8  # terms of the calibration slope's expansion


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _sigmoid_derivatives(s: np.ndarray, k: int) -> np.ndarray:
    """[k + 1, n]: the j-th derivatives of the sigmoid at x, j = 0..k, from s = sigmoid(x).

    Each is a polynomial in s (d/dx P(s) = P'(s)·s(1 − s)), kept as coefficients."""
    out = np.empty((k + 1, s.shape[0]))
    coef = np.array([0.0, 1.0])  # P_0(s) = s, coefficients of s^0, s^1, ...
    for j in range(k + 1):
        out[j] = np.polynomial.polynomial.polyval(s, coef)
        # P' · (s − s²)
        d = np.polynomial.polynomial.polyder(coef)
        coef = np.polynomial.polynomial.polymul(d, [0.0, 1.0, -1.0])
    return out


class ReplicateRows:
    """One model's rows, prepared once, to evaluate the report's metrics on bootstrap
    replicates given as row counts (the multiset of rows a replicate drew).

    Every metric equals the one computed on the replicate's rows themselves (the rows
    repeated by their counts), up to the order of floating-point sums; a replicate this
    class cannot evaluate exactly (a segment column left with one value, a logit shift far
    from the full rows') is reported, and the caller evaluates its rows directly.

    Args:
        p: [n] probabilities, in the order the replicates' rows come in (ties among equal
            probabilities are sorted in this order, as a stable sort of the rows would).
        y: [n] clicks, 0/1.
        segments: name -> [n] integer codes (the report's segment columns).
        n_bins: ECE's bins.
        min_count: Field-RCE/ECE pool values with fewer rows.
    """

    def __init__(
        self,
        p: np.ndarray,
        y: np.ndarray,
        segments: Mapping[str, np.ndarray],
        *,
        n_bins: int = 15,
        min_count: int = 100,
    ) -> None:
        from ctrcal.metrics._inputs import dense_codes
        from ctrcal.metrics._metrics import DEFAULT_EPS, _logit_shift, calibration_summary

        n = p.shape[0]
        self.n, self.n_bins, self.min_count = n, int(n_bins), int(min_count)
        self.p, self.y = p, y
        # a column of one value says nothing and is left out (as the report leaves it out)
        self.segments = {k: np.asarray(v) for k, v in segments.items()}
        self.segments = {k: v for k, v in self.segments.items() if v.size and v.min() != v.max()}
        # the multicalibration error's options in the report (calibration_summary's own)
        summary = inspect.signature(calibration_summary).parameters
        self.mce_options = {
            "max_depth": summary["mce_max_depth"].default,
            "max_segments": summary["mce_max_segments"].default,
        }
        self.mce_rows = summary["mce_max_rows"].default
        self.mce: Any = None  # the segments' prepared search, on the first replicate
        if self.mce_rows is not None and n > self.mce_rows:  # its subsample of the rows
            self.mce_take = np.random.default_rng(0).choice(
                n, size=int(self.mce_rows), replace=False
            )
        self.order = np.argsort(p, kind="stable")
        ps = p[self.order]
        self.ps = ps.astype(np.float64)
        self.ys = y[self.order].astype(np.float64)
        run_start = np.empty(n, dtype=bool)
        run_start[:1] = True
        np.not_equal(ps[1:], ps[:-1], out=run_start[1:])
        self.run_starts = np.flatnonzero(run_start)
        self.run_ends = np.append(self.run_starts[1:], n) - 1  # last row of every run
        edges = _uniform_edges(self.n_bins, p.dtype)
        bins = np.searchsorted(edges, ps, side="right") - 1
        self.bin_starts = np.flatnonzero(np.append(True, bins[1:] != bins[:-1]))
        pc = np.clip(self.ps, DEFAULT_EPS, 1.0 - DEFAULT_EPS)
        self.eps = DEFAULT_EPS
        self.z = np.log(pc) - np.log1p(-pc)
        ll = -(self.ys * np.log(pc) + (1.0 - self.ys) * np.log1p(-pc))
        # columns whose count-weighted sums are linear metrics
        self.linear = np.stack(
            [self.ys, self.ps, ll, (self.ps - self.ys) ** 2, self.ps * (1.0 - self.ps)], axis=1
        )
        clicks = float(y.sum())
        single = clicks in (0.0, float(n))
        self.b0 = 0.0 if single else _logit_shift(self.z, clicks, 0.0, 100, 1e-10)
        x = self.z + self.b0
        self.extreme = np.flatnonzero(np.abs(x) > _EXTREME_LOGIT)
        s = _sigmoid(x)
        deriv = _sigmoid_derivatives(s, _TAYLOR_TERMS)
        deriv[:, self.extreme] = 0.0
        loss0 = np.logaddexp(0.0, x) - self.ys * x
        loss0[self.extreme] = 0.0
        self.taylor = np.concatenate([deriv, loss0[None]], axis=0)  # [K + 2, n]
        self._slope_setup(single)
        self.fields: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
        for name, col in self.segments.items():
            codes, values = dense_codes(col[self.order])
            self.fields[name] = (codes, values.shape[0])

    def _slope_setup(self, single: bool) -> None:
        """The calibration slope's fit on all rows, and the sums its expansion needs: for
        every row, the sigmoid's derivatives at the fitted logit x times powers of z."""
        from ctrcal.metrics._recalibration import newton_logistic

        k = _SLOPE_TERMS
        self.slope0 = np.array([1.0, 0.0])
        if not single:
            design = np.stack([self.z, np.ones_like(self.z)], axis=1)
            self.slope0, _ = newton_logistic(design, self.ys, np.array([1.0, 0.0]), 100, 1e-10)
        x = self.slope0[0] * self.z + self.slope0[1]
        self.slope_extreme = np.flatnonzero(np.abs(x) > _EXTREME_LOGIT)
        core = np.ones(self.n, dtype=bool)
        core[self.slope_extreme] = False
        deriv = _sigmoid_derivatives(_sigmoid(x), k + 1)  # [K + 2, n]
        deriv[:, ~core] = 0.0
        zp = self.z[None, :] ** np.arange(k + 3)[:, None]  # [K + 3, n]
        # rows (j, e) of the grid σ^(j)(x)·z^e (j = 0..K+1, e = 0..K+2) that the Newton
        # steps read (e <= j + 1), then Σ y·z^e for e = 0, 1
        self.slope_grid = [(j, e) for j in range(k + 2) for e in range(min(j + 1, k + 2) + 1)]
        cols = [deriv[j] * zp[e] for j, e in self.slope_grid]
        yz = self.ys * np.where(core, 1.0, 0.0)
        self.slope_cols = np.stack([*cols, yz, yz * self.z])  # [columns, n]

    def _slope(self, c, clicks, total, out, exact) -> None:
        """Calibration slope and intercept of every replicate: Newton's method on the
        likelihood's gradient, expanded around the fit on all rows (logit x = b0·z + a0, a
        change u = δa + δb·z of it), the sums one product of the counts with the columns."""
        from math import comb, factorial

        k = _SLOPE_TERMS
        mom = (self.slope_cols @ c.T).T  # [R, columns]
        grid = np.zeros((c.shape[0], k + 2, k + 3))
        j_idx, e_idx = np.array(self.slope_grid).T
        grid[:, j_idx, e_idx] = mom[:, : len(self.slope_grid)]
        yz0, yz1 = mom[:, -2], mom[:, -1]
        ext = self.slope_extreme
        ce, ze, ye = c[:, ext], self.z[ext], self.ys[ext]
        xe = self.slope0[0] * ze + self.slope0[1]
        coef = np.array(
            [
                [comb(j, m) / factorial(j) if m <= j else 0.0 for m in range(k + 1)]
                for j in range(k + 1)
            ]
        )  # [K+1 (order j), K+1 (power m of δb)]
        da = np.zeros(c.shape[0])
        db = np.zeros(c.shape[0])
        converged = np.zeros(c.shape[0], dtype=bool)
        for _ in range(30):
            # term (j, m): C(j, m)/j! · δa^(j−m) · δb^m
            pa = da[:, None] ** np.arange(k + 1)
            pb = db[:, None] ** np.arange(k + 1)
            jm = np.arange(k + 1)[:, None] - np.arange(k + 1)[None, :]
            w = coef[None] * pa[:, np.clip(jm, 0, k)] * pb[:, None, :]  # [R, j, m]
            w = np.where(jm[None] >= 0, w, 0.0)

            def s(shift: int, e: int, w: np.ndarray = w) -> np.ndarray:
                # Σ_j Σ_m w[j, m] · grid[j + shift, m + e]
                g = grid[:, shift : shift + k + 1, e : e + k + 1]
                return (w * g).sum(axis=(1, 2))

            g0, g1 = s(0, 0) - yz0, s(0, 1) - yz1
            h00, h01, h11 = s(1, 0), s(1, 1), s(1, 2)
            if ext.size:
                se = _sigmoid(xe + da[:, None] + db[:, None] * ze)
                d = ce * (se - ye)
                g0, g1 = g0 + d.sum(axis=1), g1 + (d * ze).sum(axis=1)
                v = ce * se * (1.0 - se)
                h00 = h00 + v.sum(axis=1)
                h01 = h01 + (v * ze).sum(axis=1)
                h11 = h11 + (v * ze * ze).sum(axis=1)
            det = h00 * h11 - h01 * h01
            with np.errstate(invalid="ignore", divide="ignore"):
                step_a = (h11 * g0 - h01 * g1) / det
                step_b = (h00 * g1 - h01 * g0) / det
            step_a = np.where(np.isfinite(step_a), step_a, 0.0)
            step_b = np.where(np.isfinite(step_b), step_b, 0.0)
            da, db = da - step_a, db - step_b
            converged = np.maximum(np.abs(step_a), np.abs(step_b)) <= 1e-13
            if converged.all():
                break
        # trusted where the series' last order adds next to nothing to the gradient (its terms
        # shrink geometrically within the radius, so the rest is smaller still)
        last = [np.abs((w[:, k] * grid[:, k, e : e + k + 1]).sum(axis=1)) for e in (0, 1)]
        small = last[0] + last[1] <= 1e-12 * total
        single = (clicks == 0) | (clicks == total)
        exact &= single | (converged & small)
        out["cal_slope"] = np.where(single, np.nan, self.slope0[0] + db)
        out["cal_intercept"] = np.where(single, np.nan, self.slope0[1] + da)

    # -- families ----------------------------------------------------------------------------

    def evaluate(self, counts: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Metrics of replicates ``counts`` [R, n] (in the rows' given order).

        Returns:
            ``({metric: [R] values}, exact [R])``: ``exact`` is False where the caller must
            evaluate the replicate's rows itself.
        """
        c = counts[:, self.order].astype(np.float64)
        out: dict[str, np.ndarray] = {}
        exact = np.ones(c.shape[0], dtype=bool)
        total = c.sum(axis=1)
        sums = c @ self.linear  # [R, 5]
        clicks, sum_p = sums[:, 0], sums[:, 1]
        cy, cp = c * self.ys, c * self.ps  # shared by the families below
        self._global(c, cy, cp, total, sums, out)
        self._ecce(cy, cp, total, sums[:, 4], out)
        self._shift(c, total, clicks, out, exact)
        self._slope(c, clicks, total, out, exact)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["pcoc"] = np.where(clicks > 0, sum_p / clicks, np.nan)
        if self.fields:
            exact &= self._fields(c, cy, cp, total, out)
        self._direct(c, counts, out)
        return out, exact

    def _direct(self, c: np.ndarray, counts: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Per replicate, by the metrics' own functions on weighted rows: smooth ECE (its
        bandwidth search) and the multicalibration error (its segment search)."""
        from ctrcal.metrics._ecce import WeightedMCE, multicalibration_error
        from ctrcal.metrics._smooth_ece import _fixed_point, _Sorted

        r_count = c.shape[0]
        keys = ["smooth_ece", "smooth_ece_sigma", *(_MCE_KEYS if self.segments else ())]
        for k in keys:
            out[k] = np.full(r_count, np.nan)
        residual = self.ps - self.ys
        for r in range(r_count):
            s = _fixed_point(_Sorted(self.ps, residual, c[r]))
            out["smooth_ece"][r], out["smooth_ece_sigma"][r] = float(s), s.sigma
        if not self.segments:
            return
        usable = {k: v for k, v in self.segments.items() if v.min() != v.max()}
        subsampled = self.mce_rows is not None and self.n > self.mce_rows
        if usable and self.mce is None and not subsampled:
            # (a subsample weights a quarter of the rows or fewer: sorting those is cheaper
            # than passes over all of them)
            self.mce = WeightedMCE(self.p, self.y, usable, **self.mce_options)
        for r in range(r_count):
            weight = counts[r]
            if self.mce_rows is not None and self.n > self.mce_rows:
                # the rows of multicalibration_error's own subsample: its positions in the
                # replicate's rows (each row repeated by its count, in the given order)
                at = np.searchsorted(np.cumsum(weight), self.mce_take, side="right")
                weight = np.bincount(at, minlength=self.n)
            used = weight > 0
            fields = {k: v for k, v in self.segments.items() if v[used].min() != v[used].max()}
            if not fields:
                continue
            got = self.mce(weight) if self.mce and len(fields) == len(usable) else None
            if got is None:  # other values kept, or a column left at one value
                mc = multicalibration_error(
                    self.p, self.y, fields, sample_weight=weight, max_rows=None, **self.mce_options
                )
                got = (mc.mce, mc.sigmas, mc.relative, mc.pvalue_adjusted, mc.pvalue, mc.n_segments)
            for key, value in zip(_MCE_KEYS, got, strict=True):
                out[key][r] = value

    def _global(self, c, cy, cp, total, sums, out) -> None:
        clicks = sums[:, 0]
        with np.errstate(invalid="ignore", divide="ignore"):
            q = clicks / total
            h = -(q * np.log(q) + (1.0 - q) * np.log1p(-q))
            h = np.where((q > 0) & (q < 1), h, np.nan)
            out["logloss"] = sums[:, 2] / total
            out["brier"] = sums[:, 3] / total
            out["ne"] = out["logloss"] / h
        # AUC: runs of equal p; the clicks of a run beat the non-clicks of the runs below it
        # and tie with half of their own run's
        pos = np.add.reduceat(cy, self.run_starts, axis=1)
        neg = np.add.reduceat(c, self.run_starts, axis=1) - pos
        below = np.cumsum(neg, axis=1) - neg
        u = (pos * (below + 0.5 * neg)).sum(axis=1)
        negs = total - clicks
        with np.errstate(invalid="ignore", divide="ignore"):
            out["auc"] = np.where((clicks > 0) & (negs > 0), u / (clicks * negs), np.nan)
        # equal-width bins: contiguous in p order
        nb = np.add.reduceat(c, self.bin_starts, axis=1)
        sp = np.add.reduceat(cp, self.bin_starts, axis=1)
        sy = np.add.reduceat(cy, self.bin_starts, axis=1)
        out["ece"] = np.abs(sy - sp).sum(axis=1) / total
        base = clicks / total
        with np.errstate(invalid="ignore", divide="ignore"):
            keep = nb > 0
            mp = np.where(keep, sp / np.where(keep, nb, 1), 0.0)
            my = np.where(keep, sy / np.where(keep, nb, 1), 0.0)
        w = nb / total[:, None]
        rel = (w * (mp - my) ** 2).sum(axis=1)
        res = (w * (my - base[:, None]) ** 2).sum(axis=1)
        unc = base * (1.0 - base)
        out["brier_reliability"], out["brier_resolution"] = rel, res
        out["brier_uncertainty"] = unc
        out["brier_remainder"] = out["brier"] - (rel - res + unc)
        # equal-mass bins of the replicate's rows: bin g holds positions [gN//B, (g+1)N//B)
        # of the rows repeated by their counts; a row's copies may straddle a cut
        cum_c = np.cumsum(c, axis=1)
        cum_p = np.cumsum(cp, axis=1)
        cum_y = np.cumsum(cy, axis=1)
        ece_mass = np.empty(c.shape[0])
        for r in range(c.shape[0]):
            n_r = int(round(total[r]))
            bins = min(self.n_bins, n_r)
            cuts = -((np.arange(bins + 1) * -n_r) // bins)  # position i is in bin ⌊i·B/N⌋
            j = np.minimum(np.searchsorted(cum_c[r], cuts, side="left"), self.n - 1)
            left = cum_c[r, j] - cuts  # copies of row j beyond the cut
            fp = cum_p[r, j] - left * self.ps[j]
            fy = cum_y[r, j] - left * self.ys[j]
            ece_mass[r] = np.abs(np.diff(fy) - np.diff(fp)).sum() / total[r]
        out["ece_mass"] = ece_mass

    def _ecce(self, cy, cp, total, var_sum, out) -> None:
        from ctrcal.metrics._ecce import ecce_pvalue_from_sigmas

        path = np.cumsum(cy - cp, axis=1)[:, self.run_ends]
        e = (np.maximum(path.max(axis=1), 0.0) - np.minimum(path.min(axis=1), 0.0)) / total
        std = np.sqrt(var_sum) / total
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(std > 0, e / std, np.where(e > 0, np.inf, 0.0))
        out["ecce"], out["ecce_std"], out["ecce_sigmas"] = e, std, z
        out["ecce_pvalue"] = np.asarray(ecce_pvalue_from_sigmas(z), dtype=np.float64)

    def _shift(self, c, total, clicks, out, exact) -> None:
        """The logit shift b with Σ sigmoid(z + b) = Σ y of every replicate, and the NE after
        it: Taylor series around the full rows' root b0 in δ = b − b0 (its radius is π), the
        sums over rows one product of the counts with the derivatives' columns."""
        k = _TAYLOR_TERMS
        # [R, K + 2]: Σ c·σ^(j)(z + b0), j = 0..K, and Σ c·loss(b0) (this order of the
        # product: numpy's product with a transposed operand on the right is slow)
        mom = (self.taylor @ c.T).T
        fact = np.cumprod(np.append(1.0, np.arange(1, k + 2)))  # 0! .. (K+1)!
        ext = self.extreme
        ce, ze, ye = c[:, ext], self.z[ext], self.ys[ext]
        delta = np.zeros(c.shape[0])
        for _ in range(50):
            powers = delta[:, None] ** np.arange(k + 1)
            f = (mom[:, : k + 1] * powers / fact[: k + 1]).sum(axis=1)
            df = (mom[:, 1 : k + 1] * powers[:, :k] / fact[:k]).sum(axis=1)
            if ext.size:
                se = _sigmoid(ze + self.b0 + delta[:, None])
                f += (ce * se).sum(axis=1)
                df += (ce * se * (1.0 - se)).sum(axis=1)
            gap = f - clicks
            step = gap / np.maximum(df, 1e-300)
            delta -= np.clip(step, -5.0, 5.0)
            if np.all(np.abs(step) <= 1e-14 * (1.0 + np.abs(delta))):
                break
        single = (clicks == 0) | (clicks == total)
        exact &= single | (np.abs(delta) <= _TAYLOR_MAX_STEP)
        b = self.b0 + delta
        # Σ c·loss(b0 + δ): loss(b0) + (σ − y)·δ + Σ_{j≥2} σ^(j−1) δ^j / j!
        powers = delta[:, None] ** np.arange(k + 2)
        core_clicks = clicks - (ce * ye).sum(axis=1)  # the clicks of the expanded rows
        loss = mom[:, k + 1] + (mom[:, 0] - core_clicks) * delta
        loss += (mom[:, 1 : k + 1] * powers[:, 2 : k + 2] / fact[2 : k + 2]).sum(axis=1)
        if ext.size:
            xe = ze + b[:, None]
            pe = np.clip(_sigmoid(xe), self.eps, 1.0 - self.eps)
            loss += (ce * -(ye * np.log(pe) + (1.0 - ye) * np.log1p(-pe))).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = clicks / total
            h = -(q * np.log(q) + (1.0 - q) * np.log1p(-q))
            ne = (loss / total) / h
        out["ne_calfree"] = np.where(single, np.nan, ne)
        out["cal_intercept_large"] = np.where(single, np.nan, b)

    def _fields(self, c, cy, cp, total, out) -> np.ndarray:
        """Field-RCE / Field-ECE of every segment column (``field_calibration``'s rule: values
        below min_count rows pooled into one); False where a column has one value left (the
        report then leaves it out, which the caller's own evaluation does)."""
        ok = np.ones(c.shape[0], dtype=bool)
        rces, eces = [], []
        r_count = c.shape[0]
        for name, (codes, n_values) in self.fields.items():
            # per value: rows, clicks and Σp of every replicate, by one bincount over the
            # replicates' rows side by side (value v of replicate r at r·V + v)
            at = (np.arange(r_count)[:, None] * n_values + codes).ravel()
            size = r_count * n_values
            cnt, cl, sp = (
                np.bincount(at, weights=x.ravel(), minlength=size).reshape(r_count, n_values)
                for x in (c, cy, cp)
            )
            seen = cnt > 0
            d = np.where(seen, cl - sp, 0.0)
            ok &= (cnt > 0).sum(axis=1) >= 2
            kept = cnt >= self.min_count
            rare = (cnt > 0) & ~kept
            pooled = [np.where(rare, v, 0.0).sum(axis=1) for v in (cnt, d, cl)]
            with np.errstate(invalid="ignore", divide="ignore"):
                term = np.where(kept & (cl > 0), cnt * np.abs(d) / np.where(cl > 0, cl, 1), 0.0)
                rce = term.sum(axis=1) + np.where(
                    pooled[2] > 0,
                    pooled[0] * np.abs(pooled[1]) / np.where(pooled[2] > 0, pooled[2], 1),
                    0.0,
                )
            ece = np.where(kept, np.abs(d), 0.0).sum(axis=1) + np.abs(pooled[1])
            rces.append(rce / total)
            eces.append(ece / total)
            out[f"field_rce:{name}"] = rces[-1]
            out[f"field_ece:{name}"] = eces[-1]
        for metric, arr in (("rce", np.stack(rces)), ("ece", np.stack(eces))):
            finite = np.isfinite(arr)
            with np.errstate(invalid="ignore"):
                masked = np.where(finite, arr, -np.inf)
            worst = np.where(finite.any(axis=0), masked.argmax(axis=0), 0)
            out[f"field_{metric}_mean"] = np.nanmean(np.where(finite, arr, np.nan), axis=0)
            out[f"field_{metric}_max"] = arr[worst, np.arange(arr.shape[1])]
        return ok
