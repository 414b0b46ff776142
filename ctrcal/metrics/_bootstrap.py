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
calibration report's metrics every replicate, and the estimates (a column of ones), are
evaluated together from the counts by
:class:`~ctrcal.metrics._paired_counts.ReplicateCounts`: one pass over the rows sorted once
per model, in blocks, all replicates at once (one matrix product and one sparse product a
block), then running sums over groups of rows; every value equals the metric of the
replicate's rows up to the order of floating-point sums (and the fits' tolerance, 1e-10), and
a replicate outside the series' reach, or with a segment column left at one value, is
evaluated on its rows as before. Smooth ECE, the calibration slope and intercept and the
multicalibration error run a search or a fit of their own per replicate, from half the cost of
every other metric together to several times it: they are paired when asked (``also``: a
gate's rules), else left out of the comparison.

Intervals are percentile intervals of the replicates; ``se`` is their standard deviation.
"""

from __future__ import annotations

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
            ``n_bins`` and ``min_count``, and ``also``: metric names to pair beyond the
            default set (a gate's rules). The estimates and replicates are then evaluated
            from row counts (:class:`~ctrcal.metrics._paired_counts.ReplicateCounts`): every
            metric of the report's table but smooth ECE, the calibration slope and intercept
            and the multicalibration error (a search or a fit of their own per replicate, from
            half the cost of all the others together to several times it), which are paired
            when ``also`` names them. ``metric_fn`` then only evaluates the rows of a
            replicate the counts cannot evaluate exactly. None: ``metric_fn`` evaluates the
            estimates and every replicate.

    Returns:
        ``{metric: PairedCI}`` for every metric of the point evaluation.
    """
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    from ctrcal.metrics._paired_counts import (
        MCE_KEYS,
        SLOPE_KEYS,
        SMOOTH_KEYS,
        ReplicateCounts,
        replicate_counts,
        workers,
    )

    _check_args(n_boot, level)
    pa, y = check_probs_labels(probs_a, labels)
    pb, _ = check_probs_labels(probs_b, labels)
    n_boot = int(n_boot)
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    # a replicate draws n row positions of the rows sorted by model a's probabilities, and
    # takes them in that order: the same multiset of rows as any order (row order only moves
    # choices among equals, such as MCE's random subsample), and the metrics' sorts of a's
    # probabilities meet sorted input. Its rows are the count of each position drawn.
    by_a = np.argsort(pa, kind="stable")
    models = (pa, pb)
    if weighted is None:
        est_a, est_b = dict(metric_fn(pa, y, None)), dict(metric_fn(pb, y, None))
        names = [k for k in est_a if k in est_b]
        reps = np.full((2, len(names), n_boot), np.nan)
        for i in range(n_boot):
            counts = np.bincount(rng.integers(0, n, n), minlength=n)
            rows = by_a[np.repeat(np.arange(n), counts)]
            for side, p in enumerate(models):
                m = metric_fn(p[rows], y[rows], rows)
                reps[side, :, i] = [m.get(k, np.nan) for k in names]
    else:
        segments = {k: np.asarray(v)[by_a] for k, v in weighted.get("segments", {}).items()}
        options = {k: weighted[k] for k in ("n_bins", "min_count") if k in weighted}
        also = set(weighted.get("also", ()))
        # the metrics with a fit or search of their own per replicate: paired when asked
        left_out = {*SMOOTH_KEYS, *SLOPE_KEYS, *MCE_KEYS} - also
        options.update(
            smooth=bool(also & set(SMOOTH_KEYS)),
            slope=bool(also & set(SLOPE_KEYS)),
            mce=bool(also & set(MCE_KEYS)),
        )
        ys = y[by_a]
        chunk = max(1, min(n_boot, _COUNT_BYTES // max(n, 1)))
        est: list[dict[str, float]] = [{}, {}]
        names: list[str] = []
        reps = np.empty((0,))
        with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers()) as pool:
            # the two models prepared while the replicates are drawn; the rows and clicks
            # per segment value are the same for both (a's pass sums them)
            made = [
                pool.submit(ReplicateCounts, pa[by_a], ys, segments, **options),
                pool.submit(ReplicateCounts, pb[by_a], ys, segments, field_counts=False, **options),
            ]
            for start in range(0, n_boot, chunk):
                stop = min(start + chunk, n_boot)
                # the estimates are the first chunk's column of ones (every row once)
                counts = replicate_counts(rng, n, stop - start, ones=start == 0)
                evaluators = [m.result() for m in made]
                # the two models' passes side by side where a core is free (numpy releases
                # the GIL in them)
                done = list(pool.map(lambda ev, c=counts: ev.evaluate(c), evaluators))
                if evaluators[1].fields:
                    fields, ok = evaluators[1].fields_with(evaluators[0])
                    done[1][0].update(fields)
                    done[1][1][:] &= ok
                for side, (p, (values, exact)) in enumerate(zip(models, done, strict=True)):
                    _declared_rest(values, p[by_a], ys, counts, left_out)
                    drawn = counts
                    if start == 0:
                        if not exact[0]:  # (never seen: the series are at their centre)
                            for k, v in metric_fn(p, y, None).items():
                                if k in values:
                                    values[k][0] = v
                        est[side] = {k: float(v[0]) for k, v in values.items()}
                        if side == 0:
                            names = list(values)
                            reps = np.full((2, len(names), n_boot), np.nan)
                        values = {k: v[1:] for k, v in values.items()}
                        exact, drawn = exact[1:], counts[:, 1:]
                    for j, k in enumerate(names):
                        if k in values:
                            reps[side, j, start:stop] = values[k]
                    for i in np.flatnonzero(~exact):
                        rows = by_a[np.repeat(np.arange(n), drawn[:, i])]
                        m = metric_fn(p[rows], y[rows], rows)
                        reps[side, :, start + i] = [m.get(k, np.nan) for k in names]
        names = [k for k in names if k in est[1]]
        est_a, est_b = est
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


_COUNT_BYTES = 1 << 28  # replicates counted together: at most this many one-byte counts


def _declared_rest(
    values: dict[str, np.ndarray],
    p: np.ndarray,
    y: np.ndarray,
    counts: np.ndarray,
    left_out: set[str],
) -> None:
    """Every metric of the report's table (a labelled metric declared for the
    ``calibration`` table with its own ``compute``) that ``values`` lacks and that is not
    ``left_out``, by that function on each replicate of ``counts`` [n, R]: on its row
    counts where the declaration takes them (``weighted``), else on its rows."""
    from ctrcal.metrics._registry import metrics_in

    desc = None
    for m in metrics_in("calibration", kind="labelled"):
        if m.name in values or m.name in left_out or m.compute is None or m.segments:
            continue
        if m.weighted:
            if desc is None:  # rows already in descending order make a ranking's sort cheap
                desc = np.argsort(-p, kind="stable")
            ps, ys = p[desc], y[desc]
            got = [m.compute(ps, ys, sample_weight=counts[desc, r]) for r in range(counts.shape[1])]
        else:
            rows = [np.repeat(np.arange(p.shape[0]), counts[:, r]) for r in range(counts.shape[1])]
            got = [m.compute(p[at], y[at]) for at in rows]
        values[m.name] = np.asarray(got, dtype=np.float64)
