"""The calibration report's metrics of many bootstrap replicates at once, from their row counts.

A replicate of the paired bootstrap (:func:`~ctrcal.metrics.paired_bootstrap`) draws n row
positions with replacement; its rows are the count of each position drawn. R replicates are
the counts [n, R] (one byte each), and every metric is computed from sums over the rows
sorted by p, weighted by the counts: one pass over the rows in blocks of consecutive sorted
rows, every replicate of a block at once (no per-row Python, no per-replicate pass):

* **products with per-row columns** (one matrix product a block): logloss, Σc·p², Σc·y·p,
  and the Taylor series of the logit shift (and of the calibration slope) around the fits
  on all rows;
* **sums over groups of consecutive rows** (one sparse product a block): per *fine group* Σc,
  Σc·y and Σc·p. Fine groups start at every run of equal p that holds a click (and end after
  it where it holds more than one row), at every *cell* edge, and hold at most
  ``_GROUP_ROWS`` rows; cells are ECE's equal-width bins (and, for smooth ECE, cut at every
  edge of every grid its bisection can reach, with Σc·p² and Σc·y·p per group too);
* **sums per value of every segment column** (one sparse product a block; columns of few
  values summed jointly): Σc·p, and, in one model's pass (the same rows for both), Σc and
  Σc·y.

From these sums, running over the groups:

* **AUC** and **average precision**: a run holding clicks scores its clicks against the
  non-clicks below it (and half its own); between such runs there are only non-clicks;
* **ECCE**: the path Σc(y − p) read at run ends; it only falls between runs holding
  clicks, so its extremes are at group starts and right after click runs;
* **equal-mass ECE**: a cut (position k·n/B of the replicate's n rows; a replicate always has
  n) falls in one fine group, found from the groups' running counts, and is placed among its
  rows from their counts;
* **ECE and Murphy's Brier terms**: the running sums at the bins' edges;
* **Field-RCE / Field-ECE**: the sums per value;
* **the logit shift** (calibration-free NE, calibration-in-the-large): Newton's method on
  its Taylor series (radius π in the logit; the series' sums are the matrix product above),
  checked per replicate.

Every value equals the metric of the replicate's rows up to the order of floating-point sums
(and the fits' tolerance, 1e-10). A replicate the series cannot reach, or with a segment
column left at one value, is reported as not exact and the caller evaluates its rows.

Three families run a fit or a search of their own per replicate and are computed only when
asked (a gate rule names them): **smooth ECE** (``smooth``: its bisection of σ, run for all
replicates together, the replicates at one σ sharing one FFT; at 100k rows as much as every
other metric together), **the calibration slope and intercept** (``slope``: Newton's method
on a two-parameter series of 67 more columns, with its own fit on all rows) and **the
multicalibration error** (``mce``: seven field combinations, each a running sum in its own
row order, on a subsample that differs per replicate above 250k rows; replicate by replicate,
several evaluations of every other metric each).

Memory: the counts (n·R bytes), a block of them as float64 (about ``_BLOCK_ELEMENTS`` values;
more where one run of equal p is longer) and, for smooth ECE, [cells, 5, R] running sums.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ctrcal.metrics._metrics import _uniform_edges

__all__ = [
    "MCE_KEYS",
    "SLOPE_KEYS",
    "SMOOTH_KEYS",
    "ReplicateCounts",
    "replicate_counts",
    "workers",
]

# calibration_summary's keys of the multicalibration error, in WeightedMCE's order
MCE_KEYS = ("mce", "mce_sigmas", "mce_relative", "mce_pvalue", "mce_pvalue_unadjusted")
MCE_KEYS += ("mce_segments",)
SLOPE_KEYS = ("cal_slope", "cal_intercept")
SMOOTH_KEYS = ("smooth_ece", "smooth_ece_sigma")
_GROUP_ROWS = 128  # a fine group holds at most this many rows: an equal-mass cut's search
_BLOCK_ELEMENTS = 1 << 19  # counts of one block (rows × replicates), 4 MiB as float64
_SHIFT = 3  # the first of the logit shift's columns (after logloss, p², y·p)
_JOINT_VALUES = 4096  # segment columns are summed jointly up to this many value combinations
_TAYLOR_TERMS = 12  # terms of the logit-shift expansion, at most
_TAYLOR_MAX_STEP = 0.25  # beyond this shift from the full rows' root (with all terms), solve
# exactly instead; with fewer terms K the step that keeps the same bound, (step/π)^(K+1)
_EXTREME_LOGIT = 14.0  # rows whose shifted logit may reach the logloss clip: summed exactly
_SLOPE_TERMS = 8  # terms of the calibration slope's expansion


def workers() -> int:
    """Threads for the replicates' counting and the two models' passes: two where there are
    two cores (numpy releases the GIL in them; on a free machine that nearly halves the
    time, on a busy one it takes the same time at 10-15 % more CPU)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(2, cores or 1)


def replicate_counts(
    rng: np.random.Generator, n: int, replicates: int, ones: bool = False
) -> np.ndarray:
    """[n, replicates] row counts: each replicate draws ``rng.integers(0, n, n)`` (the
    paired bootstrap's draws, replicate after replicate) and counts every position.

    One byte a count (a count above 255 has probability below 1e-500; one that comes widens
    the array). The draws are taken in order here while :func:`workers` threads count them
    (numpy's counting releases the GIL) and copy every group of replicates into the [n, R]
    layout.
    ``ones``: a first column of ones before them (every row once: the estimates)."""
    from concurrent.futures import ThreadPoolExecutor

    first = int(ones)
    out = np.empty((n, first + replicates), dtype=np.uint8)
    out[:, :first] = 1
    wide: dict[int, np.ndarray] = {}  # replicates with a count above 255

    def count(draws: np.ndarray, stage: np.ndarray, i: int, r: int) -> None:
        counts = np.bincount(draws, minlength=n)
        if counts.max() > np.iinfo(np.uint8).max:
            wide[r] = counts
        stage[i] = counts

    def place(stage: np.ndarray, at: int) -> None:
        for s in range(0, n, 1 << 13):
            out[s : s + (1 << 13), at : at + stage.shape[0]] = stage[:, s : s + (1 << 13)].T

    group = 32  # replicates staged together before one transposing copy
    # two stages, alternately: one is copied out while the other fills (fresh memory is
    # slow to touch, so neither is allocated again)
    stages = [np.empty((min(group, replicates), n), dtype=np.uint8) for _ in range(2)]
    with ThreadPoolExecutor(workers()) as pool:
        placed = [None, None]
        counted: list = []
        for k, g0 in enumerate(range(0, replicates, group)):
            if placed[k % 2] is not None:
                placed[k % 2].result()  # its stage is free again
            stage = stages[k % 2][: min(group, replicates - g0)]
            tasks = []
            for i in range(stage.shape[0]):
                tasks.append(pool.submit(count, rng.integers(0, n, n), stage, i, g0 + i))
                while sum(not t.done() for t in tasks) > 4:  # bound the draws held
                    next(t for t in tasks if not t.done()).result()
            for stage_before, at, before, j in counted:
                for t in before:
                    t.result()
                placed[j] = pool.submit(place, stage_before, at)
            counted = [(stage, first + g0, tasks, k % 2)]
        for stage_before, at, before, j in counted:
            for t in before:
                t.result()
            placed[j] = pool.submit(place, stage_before, at)
        for t in placed:
            if t is not None:
                t.result()
    if wide:
        out = out.astype(np.uint16)
        for r, counts in wide.items():
            out[:, first + r] = counts
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@functools.cache
def _derivative_polynomials(k: int) -> np.ndarray:
    """[k + 1, k + 2] coefficients (of s^0, s^1, ...) of the polynomials P_j with
    σ^(j)(x) = P_j(σ(x)), j = 0..k: P_0(s) = s, P_{j+1} = P_j'·(s − s²)."""
    out = np.zeros((k + 1, k + 2))
    coef = np.array([0.0, 1.0])
    for j in range(k + 1):
        out[j, : coef.shape[0]] = coef
        coef = np.polynomial.polynomial.polymul(np.polynomial.polynomial.polyder(coef), [0, 1, -1])
    return out


def _sigmoid_derivatives(s: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """[k + 1, n]: the j-th derivatives of the sigmoid at x, j = 0..k, from s = sigmoid(x)
    (every polynomial by Horner's rule at once; into ``out`` when given)."""
    coef = _derivative_polynomials(k)
    if out is None:
        out = np.empty((k + 1, s.shape[0]))
    out[...] = coef[:, -1:]
    for d in range(k, -1, -1):
        out *= s
        out += coef[:, d : d + 1]
    return out


def _columns_matrix(every: list, click: list, clicks: np.ndarray, size: int) -> Any:
    """A sparse [size, m] matrix (CSC) whose column i has one entry (row, value) from each
    pair of ``every`` ([m] rows, [m] values), and, where ``clicks[i]``, from each of
    ``click``: the sums of a block's rows that a product with their counts makes."""
    import scipy.sparse as sp

    m = clicks.shape[0]
    per = len(every) + clicks * len(click)  # entries of each column
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(per, out=indptr[1:])
    index = np.empty(indptr[-1], dtype=np.int64)
    data = np.empty(indptr[-1])
    at = indptr[:-1]
    for j, (r, x) in enumerate(every):
        index[at + j] = r
        data[at + j] = x
    at = at[clicks] + len(every)
    for j, (r, x) in enumerate(click):
        index[at + j] = r[clicks]
        data[at + j] = x[clicks]
    return sp.csc_matrix((data, index, indptr), shape=(size, m))


def _shift_terms(x: np.ndarray, extreme: np.ndarray) -> tuple[int, float]:
    """The logit shift's terms K and the step it trusts them to: the fewest terms whose
    step, at the same error bound as all terms at ``_TAYLOR_MAX_STEP``, spans 8 standard
    errors of the shift (1 / sqrt(Σ σ'(x)) over the rows ``x`` the series covers); a
    replicate beyond it is solved exactly instead, which 8 standard errors make rare."""
    s = _sigmoid(np.delete(x, extreme))
    info = float(np.dot(s, 1.0 - s))
    reach = 8.0 / np.sqrt(info) if info > 0 else np.inf
    full = _TAYLOR_TERMS + 1
    for k in range(4, _TAYLOR_TERMS + 1):
        step = np.pi * (_TAYLOR_MAX_STEP / np.pi) ** (full / (k + 1))
        if reach <= step:
            return k, float(step)
    return _TAYLOR_TERMS, _TAYLOR_MAX_STEP


def _joint_size(names: list[str], values: Mapping[str, int]) -> int:
    return int(np.prod([values[k] for k in names]))


class ReplicateCounts:
    """One model's rows, prepared once, to evaluate the report's metrics on bootstrap
    replicates given as row counts (module docstring).

    Args:
        p: [n] probabilities, in the order of the counts' rows (ties among equal
            probabilities are sorted in this order, as a stable sort of the rows would).
        y: [n] clicks, 0/1.
        segments: name -> [n] integer codes (the report's segment columns).
        n_bins: ECE's bins.
        min_count: Field-RCE/ECE pool values with fewer rows.
        smooth: also smooth ECE (module docstring).
        slope: also the calibration slope and intercept (module docstring).
        mce: also the multicalibration error (per replicate; module docstring).
        field_counts: with segment columns, this pass sums every value's Σc·p and, with
            this, its rows and clicks Σc, Σc·y; without, those are another pass's (the same
            for every model of the same rows): :meth:`fields_with`.
    """

    def __init__(
        self,
        p: np.ndarray,
        y: np.ndarray,
        segments: Mapping[str, np.ndarray],
        *,
        n_bins: int = 15,
        min_count: int = 100,
        smooth: bool = False,
        slope: bool = False,
        mce: bool = False,
        field_counts: bool = True,
    ) -> None:
        from ctrcal.metrics._inputs import dense_codes
        from ctrcal.metrics._metrics import DEFAULT_EPS, _logit_shift, calibration_summary
        from ctrcal.metrics._smooth_ece import bisection_grids, cell_edges

        n = p.shape[0]
        self.n, self.n_bins, self.min_count = n, int(n_bins), int(min_count)
        self.p, self.y = p, y
        # a column of one value says nothing and is left out (as the report leaves it out)
        self.segments = {k: np.asarray(v) for k, v in segments.items()}
        self.segments = {k: v for k, v in self.segments.items() if v.size and v.min() != v.max()}
        self.with_mce = bool(mce) and bool(self.segments)
        # the multicalibration error's options in the report (calibration_summary's own)
        summary = inspect.signature(calibration_summary).parameters
        self.mce_options = {
            "max_depth": summary["mce_max_depth"].default,
            "max_segments": summary["mce_max_segments"].default,
        }
        self.mce_rows = summary["mce_max_rows"].default
        self.mce: Any = None  # the segments' prepared search, on the first replicate
        if self.with_mce and self.mce_rows is not None and n > self.mce_rows:
            self.mce_take = np.random.default_rng(0).choice(
                n, size=int(self.mce_rows), replace=False
            )
        order = np.argsort(p, kind="stable")
        self.order = None if np.array_equal(order, np.arange(n)) else order
        raw = p[order]
        ps = raw.astype(np.float64)
        ys = y[order].astype(np.float64)
        self.ps, self.ys = ps, ys
        # runs of equal p; the runs holding a click ("click runs")
        run_start = np.empty(n + 1, dtype=bool)
        run_start[0] = run_start[n] = True
        np.not_equal(raw[1:], raw[:-1], out=run_start[1:n])
        bounds = np.flatnonzero(run_start)  # every run's first row, then n
        clicked = np.unique(np.cumsum(run_start[:n])[ys > 0] - 1)
        c_start, c_end = bounds[clicked], bounds[clicked + 1]
        # cells: ECE's equal-width bins (metrics.ece's edges) and smooth ECE's grid cells
        bins = np.searchsorted(_uniform_edges(self.n_bins, p.dtype), raw, side="right") - 1
        bin_starts = np.flatnonzero(np.append(True, bins[1:] != bins[:-1]))
        self.with_smooth = bool(smooth)
        self.group_kinds = 5 if self.with_smooth else 3
        grids = bisection_grids() if self.with_smooth else []
        grid_edges = {g: cell_edges(ps, g) for g in grids}
        cells = np.unique(np.concatenate([[0], bin_starts, *grid_edges.values()]))
        cells = cells[cells < n]
        # a click run of one row needs no group end after it: its group's other rows are
        # non-clicks, and the path after it is the group's start plus the row's own step
        tied = c_end - c_start > 1
        starts = np.concatenate([cells, c_start, c_end[tied], np.arange(0, n, _GROUP_ROWS)])
        starts = np.unique(starts)
        starts = starts[starts < n]  # [G] first row of every fine group
        self.starts = starts
        ends = np.append(starts[1:], n)
        self.group_of = np.repeat(np.arange(starts.shape[0], dtype=np.int64), ends - starts)
        self.cell_of = np.repeat(
            np.arange(cells.shape[0], dtype=np.int64), np.diff(np.append(cells, n))
        )
        self.cell_group = np.searchsorted(starts, cells)  # [C] each cell's first group
        self.bin_cells = np.searchsorted(cells, bin_starts)
        # a grid's cells as cell indices (edge n: past the last cell)
        self.grid_cells = {
            g: np.searchsorted(cells, np.append(e, n)) for g, e in grid_edges.items()
        }
        self.n_cells = cells.shape[0]
        # groups that start at a run's first row (their start is a point of the path);
        # a one-row click run's group: the path right after the run is the group's start
        # plus the row's step c·(1 − p)
        self.valid = run_start[starts]
        self.lift = np.zeros(starts.shape[0])
        one = ~tied
        self.lift[np.searchsorted(starts, c_start[one])] = 1.0 - ps[c_start[one]]
        # tied click runs [T]: first group, the group after the run; the groups inside them
        self.tied_start = np.searchsorted(starts, c_start[tied])
        self.tied_end = np.searchsorted(starts, c_end[tied])
        inside = np.zeros(starts.shape[0] + 1, dtype=np.int64)
        np.add.at(inside, self.tied_start, 1)
        np.add.at(inside, self.tied_end, -1)
        self.plain = np.cumsum(inside[:-1]) == 0  # groups of no tied click run
        # blocks of rows end where a run ends (a run's clicks meet all its rows in one block)
        self.block_bounds = starts[run_start[starts]]
        pc = np.clip(ps, DEFAULT_EPS, 1.0 - DEFAULT_EPS)
        self.eps = DEFAULT_EPS
        self.z = np.log(pc) - np.log1p(-pc)
        clicks = float(ys.sum())
        single = clicks in (0.0, float(n))
        self.b0 = 0.0 if single else _logit_shift(self.z, clicks, 0.0, 100, 1e-10)
        self.extreme = np.flatnonzero(np.abs(self.z + self.b0) > _EXTREME_LOGIT)
        self.shift_terms, self.shift_step = _shift_terms(self.z + self.b0, self.extreme)
        self.with_slope = bool(slope)
        self.slope_grid: list[tuple[int, int]] = []
        if self.with_slope:
            self._slope_setup(single)
        self.fields: dict[str, int] = {}  # name -> its number of values
        codes = {}
        for name, col in self.segments.items():
            codes[name], values = dense_codes(col[order])
            self.fields[name] = values.shape[0]
        self.field_offsets = np.cumsum([0, *self.fields.values()])
        # columns of few values summed as one: every combination of their values (a
        # product's rows cost per value summed, its entries per row and column)
        self.joints: list[tuple[np.ndarray, list[str]]] = []
        for name in sorted(self.fields, key=self.fields.get):
            last = self.joints[-1] if self.joints else None
            if last is not None and _joint_size(last[1], self.fields) * self.fields[name] <= (
                _JOINT_VALUES
            ):
                joint = last[0] * self.fields[name] + codes[name]
                self.joints[-1] = (joint, [*last[1], name])
            else:
                self.joints.append((codes[name].astype(np.int64), [name]))
        sizes = [_joint_size(names, self.fields) for _, names in self.joints]
        self.joint_offsets = np.cumsum([0, *sizes])
        # the sums per value: Σc·p, then (with field_counts) Σc and Σc·y
        self.field_kinds = (3 if field_counts else 1) if self.fields else 0
        self.last_fields: np.ndarray | None = None

    def _slope_setup(self, single: bool) -> None:
        """The point the calibration slope's series expands around: near the fit on all rows
        (logit x = b0·z + a0). Any point within the series' reach does (every replicate's
        fit, and the estimate's, is solved from it), so the fit stops at 1e-6."""
        from ctrcal.metrics._recalibration import newton_logistic

        k = _SLOPE_TERMS
        self.slope0 = np.array([1.0, 0.0])
        if not single:
            design = np.stack([self.z, np.ones_like(self.z)], axis=1)
            self.slope0, _ = newton_logistic(design, self.ys, np.array([1.0, 0.0]), 100, 1e-6)
        x = self.slope0[0] * self.z + self.slope0[1]
        self.slope_extreme = np.flatnonzero(np.abs(x) > _EXTREME_LOGIT)
        # the terms (j, e) σ^(j)(x)·z^e (j = 0..K+1, e = 0..K+2) that the Newton steps read
        # (e <= j + 1)
        self.slope_grid = [(j, e) for j in range(k + 2) for e in range(min(j + 1, k + 2) + 1)]

    # -- the pass over the rows --------------------------------------------------------------

    def _columns(self, s: int, e: int, out: np.ndarray) -> np.ndarray:
        """[k, e − s] the per-row columns of rows s..e (sorted) whose count-weighted sums the
        metrics read, written into ``out``: logloss, p², y·p (Brier's sums); σ^(j)(z + b0),
        j = 0..K, and the loss at b0 (the logit shift's series); with ``slope``, σ^(j)(x)·z^e
        of the slope's grid, then y and y·z (its gradient). Rows beyond the series' reach
        are zero here (summed exactly)."""
        m = e - s
        out = out[:, :m]
        z, y = self.z[s:e], self.ys[s:e]
        pc = np.clip(self.ps[s:e], self.eps, 1.0 - self.eps)
        out[0] = -(y * np.log(pc) + (1.0 - y) * np.log1p(-pc))
        np.multiply(self.ps[s:e], self.ps[s:e], out=out[1])
        np.multiply(self.ps[s:e], y, out=out[2])
        x = z + self.b0
        k = self.shift_terms
        shift = out[_SHIFT : _SHIFT + k + 1]
        _sigmoid_derivatives(_sigmoid(x), k, shift)
        out[_SHIFT + k + 1] = np.logaddexp(0.0, x) - y * x
        far = np.flatnonzero(np.abs(x) > _EXTREME_LOGIT)
        if far.size:
            out[_SHIFT : _SHIFT + k + 2, far] = 0.0
        if self.with_slope:
            self._slope_columns(z, y, out[_SHIFT + k + 2 :])
        return out

    def _slope_columns(self, z: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        ks = _SLOPE_TERMS
        xs = self.slope0[0] * z + self.slope0[1]
        deriv = _sigmoid_derivatives(_sigmoid(xs), ks + 1)
        far = np.flatnonzero(np.abs(xs) > _EXTREME_LOGIT)
        if far.size:
            deriv[:, far] = 0.0
        zp = np.empty((ks + 3, z.shape[0]))
        zp[0] = 1.0
        for i in range(1, ks + 3):
            np.multiply(zp[i - 1], z, out=zp[i])
        row = 0
        for j in range(ks + 2):  # the grid's terms of order j: e = 0..min(j + 1, K + 2)
            top = min(j + 1, ks + 2) + 1
            np.multiply(deriv[j], zp[:top], out=out[row : row + top])
            row += top
        out[row] = y
        if far.size:
            out[row, far] = 0.0
        np.multiply(out[row], z, out=out[row + 1])

    def _group_matrix(self, s: int, e: int, g0: int, g1: int) -> Any:
        """The sparse [kinds · groups, e − s] matrix of one block's group sums (module
        docstring): per fine group Σc, then Σc·y, Σc·p and, for smooth ECE's cells, Σc·p²,
        Σc·y·p."""
        p, clicks = self.ps[s:e], self.ys[s:e] > 0
        g = g1 - g0
        at = self.group_of[s:e] - g0
        ones = np.ones(e - s)
        every = [(at, ones), (at + 2 * g, p)]
        click = [(at + g, ones)]
        if self.with_smooth:
            every.append((at + 3 * g, p * p))
            click.append((at + 4 * g, p))
        return _columns_matrix(every, click, clicks, self.group_kinds * g)

    def _field_matrix(self, s: int, e: int) -> Any:
        """The sparse [kinds · combinations, e − s] matrix of rows s..e's sums per value
        combination of every joint of segment columns: Σc·p, then (``field_counts``) Σc and
        Σc·y."""
        p, clicks = self.ps[s:e], self.ys[s:e] > 0
        v = int(self.joint_offsets[-1])
        ones = np.ones(e - s)
        every, click = [], []
        for (joint, _), off in zip(self.joints, self.joint_offsets, strict=False):
            at = off + joint[s:e]
            every.append((at, p))
            if self.field_kinds == 3:
                every.append((at + v, ones))
                click.append((at + 2 * v, ones))
        return _columns_matrix(every, click, clicks, self.field_kinds * v)

    def _per_value(self, sums: np.ndarray) -> np.ndarray:
        """[kinds · values, R]: the sums per value of every segment column (offsets
        ``field_offsets``) from those per combination of its joint [kinds · combinations,
        R]."""
        r_count, width, v = sums.shape[1], int(self.joint_offsets[-1]), int(self.field_offsets[-1])
        out = np.empty((self.field_kinds * v, r_count))
        at = dict(zip(self.fields, self.field_offsets, strict=False))
        for kind in range(self.field_kinds):
            for (_, names), off in zip(self.joints, self.joint_offsets, strict=False):
                shape = [self.fields[k] for k in names]
                part = sums[kind * width + off : kind * width + off + int(np.prod(shape))]
                part = part.reshape(*shape, r_count)
                for i, name in enumerate(names):
                    other = tuple(j for j in range(len(names)) if j != i)
                    row = kind * v + at[name]
                    out[row : row + shape[i]] = part.sum(axis=other) if other else part
        return out

    def _blocks(self, replicates: int) -> list[tuple[int, int, int, int, int, int]]:
        """(rows s..e, groups g0..g1, cells c0..c1) of every block: about
        ``_BLOCK_ELEMENTS / replicates`` rows, ending where a run ends."""
        target = max(256, _BLOCK_ELEMENTS // max(replicates, 1))
        b = self.block_bounds
        cut = np.unique(b[np.searchsorted(b, np.arange(0, self.n, target))])
        cut = np.append(cut, self.n)
        out = []
        for s, e in zip(cut[:-1], cut[1:], strict=True):
            g0, g1 = int(self.group_of[s]), int(self.group_of[e - 1]) + 1
            c0, c1 = int(self.cell_of[s]), int(self.cell_of[e - 1]) + 1
            out.append((int(s), int(e), g0, g1, c0, c1))
        return out

    def _pass(self, counts: np.ndarray) -> dict[str, Any]:
        """One pass over the rows, every replicate of ``counts`` [n, R] at once: the sums the
        metrics read (module docstring)."""
        n, r_count = counts.shape
        k = _SHIFT + self.shift_terms + 2 + (len(self.slope_grid) + 2 if self.with_slope else 0)
        mom = np.zeros((k, r_count))
        # [cells + 1, kinds, R]: Σc, Σcy, Σcp (and Σcp², Σcyp) of the rows before every
        # cell, then of all (every cell starts a group: the groups' running sums there)
        kinds = self.group_kinds
        cells = np.empty((self.n_cells + 1, kinds, r_count))
        fields = np.zeros((self.field_kinds * int(self.joint_offsets[-1]), r_count))
        carry = np.zeros((3, r_count))  # Σc, Σcy, Σcp of the rows before the block
        carry_w = np.zeros((2, r_count))  # Σcp², Σcyp (smooth ECE's cells)
        hi, lo = np.zeros(r_count), np.zeros(r_count)  # the path's extremes (it starts at 0)
        u, ap = np.zeros(r_count), np.zeros(r_count)
        # equal-mass bins: cut k at ceil(k·n/B) of every replicate's n rows
        bins = min(self.n_bins, n)
        cuts = -((np.arange(1, bins + 1) * -n) // bins).astype(np.float64)
        mass = np.zeros((r_count, bins))
        clicks = self._clicks(counts)
        blocks = self._blocks(r_count)
        cols = np.empty((k, max(e - s for s, e, *_ in blocks)))
        # one buffer for every block's counts as float64 (fresh memory is slow to touch)
        held = np.empty((max(e - s for s, e, *_ in blocks), r_count))
        for s, e, g0, g1, c0, c1 in blocks:
            cb = held[: e - s]
            cb[...] = counts[s:e] if self.order is None else counts[self.order[s:e]]
            mom += self._columns(s, e, cols) @ cb
            out = self._group_matrix(s, e, g0, g1) @ cb
            g = g1 - g0
            # per group Σc, Σcy, Σcp after the carry: their running sums are the sums before
            # every group of the block, then after it
            grp = np.empty((3, r_count, g + 1))
            grp[:, :, 0] = carry
            grp[:, :, 1:] = out[: 3 * g].reshape(3, g, r_count).transpose(0, 2, 1)
            before = np.cumsum(grp, axis=2)
            n_before, y_before, p_before = before
            path = y_before - p_before  # Σc(y − p) before every group
            self._ranks(n, clicks, g0, g1, grp[1, :, 1:], n_before, y_before, path, u, ap)
            # the path's points: group starts at a run start, and the block's end (a run's)
            cand = path[:, :-1] + grp[1, :, 1:] * self.lift[g0:g1]
            ends = path[:, :-1]
            valid = self.valid[g0:g1]
            if not valid.all():
                cand, ends = cand[:, valid], ends[:, valid]
            np.maximum(hi, np.maximum(cand.max(axis=1), path[:, -1]), out=hi)
            np.minimum(lo, np.minimum(ends.min(axis=1), path[:, -1]), out=lo)
            self._mass_cuts(cb, s, g0, n_before, path, cuts, mass)
            # the cells that start in this block (the first may have begun before): the
            # running sums there; Σcp² and Σcyp are read only there (sums between them)
            c_first = c0 if self.cell_group[c0] >= g0 else c0 + 1
            at = self.cell_group[c_first:c1] - g0
            cells[c_first:c1, :3] = before[:, :, at].transpose(2, 0, 1)
            carry = before[:, :, -1]
            if kinds == 5:  # Σcp², Σcyp are read only at cells: sums between them
                bounds = np.concatenate([[0], at, [g]])
                cw = out[3 * g : 5 * g].reshape(2, g, r_count)
                part = np.add.reduceat(cw, bounds[:-1], axis=1)
                part[:, bounds[:-1] == bounds[1:]] = 0.0  # empty stretches (a cell at the start)
                zero = np.zeros((2, 1, r_count))
                more = carry_w[:, None] + np.concatenate([zero, part.cumsum(axis=1)], axis=1)
                cells[c_first:c1, 3:] = more[:, 1:-1].transpose(1, 0, 2)
                carry_w = more[:, -1]
            if self.fields:
                fields += self._field_matrix(s, e) @ cb
        cells[-1, :3] = carry
        if kinds == 5:
            cells[-1, 3:] = carry_w
        return {
            "mom": mom,
            "cells": cells,
            "fields": fields,
            "clicks": clicks,
            "ecce_range": hi - lo,
            "auc_u": u,
            "ap": ap,
            "mass": mass,
        }

    def _ranks(self, n, clicks, g0, g1, fy, n_before, y_before, path, u, ap) -> None:
        """A block's click runs: AUC's pairs (their clicks against the non-clicks below, and
        half of their own run's) and average precision's terms (the precision of the rows
        scored at least the run's p, weighted by its clicks). A group holds the clicks of
        at most one click run, at its start: summed over groups, but for tied runs, which
        may span groups and meet their own non-clicks (gathered)."""
        plain = self.plain[g0:g1]
        if not plain.all():
            fy = fy * plain
        at_n, at_y = n_before[:, :-1], y_before[:, :-1]
        u += np.einsum("rg,rg->r", fy, at_n - at_y)
        # a group with clicks has rows from its own on (no row left: no click either)
        shown = np.maximum(n - at_n, 1.0)
        ap += np.einsum("rg,rg->r", fy, (clicks[:, None] - at_y) / shown)
        k0, k1 = np.searchsorted(self.tied_start, [g0, g1])
        if k0 == k1:
            return
        a, b = self.tied_start[k0:k1] - g0, self.tied_end[k0:k1] - g0
        y_at, n_at = y_before[:, a], n_before[:, a]
        pos = y_before[:, b] - y_at
        own = n_before[:, b] - n_at - pos
        u += np.einsum("rk,rk->r", pos, n_at - y_at + 0.5 * own)
        ap += np.einsum("rk,rk->r", pos, (clicks[:, None] - y_at) / np.maximum(n - n_at, 1.0))

    def _clicks(self, counts: np.ndarray) -> np.ndarray:
        """[R] every replicate's clicks (read before the pass: precision needs them)."""
        at = np.flatnonzero(self.ys > 0)
        if self.order is not None:
            at = self.order[at]
        return counts[at].sum(axis=0, dtype=np.float64)

    def _mass_cuts(
        self,
        cb: np.ndarray,
        s: int,
        g0: int,
        n_before: np.ndarray,
        d_before: np.ndarray,
        cuts: np.ndarray,
        mass: np.ndarray,
    ) -> None:
        """The path Σc(y − p) at every equal-mass cut that falls in this block: the rows
        before the cut's position (the part of the row that straddles it too), as the
        quantile bins of the replicate's rows count them."""
        r_count, g = n_before.shape[0], n_before.shape[1] - 1
        inside = (cuts[None, :] > n_before[:, :1]) & (cuts[None, :] <= n_before[:, -1:])
        r, k = np.nonzero(inside)
        if r.size == 0:
            return
        # the fine group of each cut: the first whose running count reaches it
        span = float(self.n + 1)
        flat = (n_before[:, 1:] + span * np.arange(r_count)[:, None]).ravel()
        h = np.searchsorted(flat, cuts[k] + span * r, side="left") - r * g
        first = self.starts[g0 + h]
        width = int((np.append(self.starts, self.n)[g0 + h + 1] - first).max())
        at = first[:, None] + np.arange(width)[None, :]  # [cuts, width] rows (sorted)
        last = np.append(self.starts, self.n)[g0 + h + 1]
        valid = at < last[:, None]
        at = np.where(valid, at, first[:, None])
        c = np.where(valid, cb[at - s, r[:, None]], 0.0)
        running = n_before[r, h][:, None] + np.cumsum(c, axis=1)
        t = np.argmax(running >= cuts[k][:, None], axis=1)  # the row that reaches the cut
        j = first + t
        left = running[np.arange(r.size), t] - cuts[k]  # its copies beyond the cut
        step = c * (self.ys[at] - self.ps[at])
        upto = np.where(np.arange(width)[None, :] <= t[:, None], step, 0.0).sum(axis=1)
        mass[r, k] = d_before[r, h] + upto - left * (self.ys[j] - self.ps[j])

    # -- metrics -----------------------------------------------------------------------------

    def evaluate(self, counts: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Metrics of replicates ``counts`` [n, R] (in the rows' given order).

        Returns:
            ``({metric: [R] values}, exact [R])``: ``exact`` is False where the caller must
            evaluate the replicate's rows itself.
        """
        sums = self._pass(counts)
        r_count = counts.shape[1]
        total = np.full(r_count, float(self.n))
        out: dict[str, np.ndarray] = {}
        exact = np.ones(r_count, dtype=bool)
        clicks, cells = sums["clicks"], sums["cells"]
        sum_p, (sum_p2, sum_yp) = cells[-1, 2], sums["mom"][1:3]
        with np.errstate(invalid="ignore", divide="ignore"):
            q = clicks / total
            h = -(q * np.log(q) + (1.0 - q) * np.log1p(-q))
            h = np.where((q > 0) & (q < 1), h, np.nan)
            out["logloss"] = sums["mom"][0] / total
            out["brier"] = (sum_p2 - 2.0 * sum_yp + clicks) / total
            out["ne"] = out["logloss"] / h
            negs = total - clicks
            ok = (clicks > 0) & (negs > 0)
            out["auc"] = np.where(ok, sums["auc_u"] / (clicks * negs), np.nan)
            out["prauc"] = np.where(clicks > 0, sums["ap"] / clicks, np.nan)
            out["pcoc"] = np.where(clicks > 0, sum_p / clicks, np.nan)
        self._bins(cells, total, clicks, out)
        mass = np.diff(sums["mass"], axis=1, prepend=0.0)
        out["ece_mass"] = np.abs(mass).sum(axis=1) / total
        self._ecce(sums["ecce_range"], sum_p - sum_p2, total, out)
        mom = sums["mom"].T
        ext = counts[self.extreme if self.order is None else self.order[self.extreme]]
        self._shift(
            mom[:, _SHIFT : _SHIFT + self.shift_terms + 2],
            ext.T.astype(np.float64),
            total,
            clicks,
            out,
            exact,
        )
        if self.with_slope:
            ext = self.slope_extreme if self.order is None else self.order[self.slope_extreme]
            ce = counts[ext].T.astype(np.float64)
            self._slope(mom[:, _SHIFT + self.shift_terms + 2 :], ce, clicks, total, out, exact)
        if self.with_smooth:
            self._smooth(cells, out)
        self.last_fields = self._per_value(sums["fields"]) if self.fields else None
        if self.field_kinds == 3:
            exact &= self._fields(self.last_fields, self.last_fields, out)
        if self.with_mce:
            self._mce(counts, out)
        return out, exact

    def _bins(self, cells: np.ndarray, total, clicks, out) -> None:
        """ECE over the equal-width bins and Murphy's Brier terms (the same bins), from the
        running sums at every cell [cells + 1, 5, R]."""
        edges = cells[np.append(self.bin_cells, self.n_cells)]
        nb, sy, sp = (edges[1:] - edges[:-1])[:, :3].transpose(1, 2, 0)  # [R, bins] each
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

    def _ecce(self, e_range, var_sum, total, out) -> None:
        from ctrcal.metrics._ecce import ecce_pvalue_from_sigmas

        e = e_range / total
        std = np.sqrt(var_sum) / total
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(std > 0, e / std, np.where(e > 0, np.inf, 0.0))
        out["ecce"], out["ecce_std"], out["ecce_sigmas"] = e, std, z
        out["ecce_pvalue"] = np.asarray(ecce_pvalue_from_sigmas(z), dtype=np.float64)

    def _smooth(self, cells: np.ndarray, out) -> None:
        """smooth ECE: every grid's cell sums from the running sums at every cell
        [cells + 1, 5, R]; one bisection for all replicates."""
        from ctrcal.metrics._smooth_ece import fixed_points

        # a grid's cells are differences of the running sums at its edges (rows of
        # [cells + 1, 5, R], gathered whole); Σc·r = Σcp − Σcy and Σc·r·p = Σcp² − Σcyp
        # (r = p − y)
        running = cells

        def grid_cells(g: int, which: np.ndarray) -> np.ndarray:
            at = running[self.grid_cells[g]]  # [g, 5, R]
            if which.shape[0] < at.shape[2]:
                at = at[:, :, which]
            w, wy, wp, wp2, wyp = (at[1:] - at[:-1]).transpose(1, 2, 0)
            return [w, wp, wp - wy, wp2 - wyp]

        out["smooth_ece"], out["smooth_ece_sigma"] = fixed_points(grid_cells, cells.shape[2])

    def _shift(self, mom, ce, total, clicks, out, exact) -> None:
        """The logit shift b with Σ sigmoid(z + b) = Σ y of every replicate, and the NE after
        it: Taylor series around the full rows' root b0 in δ = b − b0 (its radius is π).

        Args:
            mom: [R, K + 2] Σ c·σ^(j)(z + b0), j = 0..K, and Σ c·loss(b0).
            ce: [R, extreme rows] their counts.
        """
        k = self.shift_terms
        fact = np.cumprod(np.append(1.0, np.arange(1, k + 2)))  # 0! .. (K+1)!
        ext = self.extreme
        ze, ye = self.z[ext], self.ys[ext]
        delta = np.zeros(mom.shape[0])
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
        exact &= single | (np.abs(delta) <= self.shift_step)
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

    def _slope(self, mom, ce, clicks, total, out, exact) -> None:
        """Calibration slope and intercept of every replicate: Newton's method on the
        likelihood's gradient, expanded around the fit on all rows (logit x = b0·z + a0, a
        change u = δa + δb·z of it).

        Args:
            mom: [R, grid + 2] Σ c·σ^(j)(x)·z^e over the slope's grid, then Σ c·y, Σ c·y·z.
            ce: [R, extreme rows] their counts.
        """
        from math import comb, factorial

        k = _SLOPE_TERMS
        grid = np.zeros((mom.shape[0], k + 2, k + 3))
        j_idx, e_idx = np.array(self.slope_grid).T
        grid[:, j_idx, e_idx] = mom[:, : len(self.slope_grid)]
        yz0, yz1 = mom[:, -2], mom[:, -1]
        ext = self.slope_extreme
        ze, ye = self.z[ext], self.ys[ext]
        xe = self.slope0[0] * ze + self.slope0[1]
        coef = np.array(
            [
                [comb(j, m) / factorial(j) if m <= j else 0.0 for m in range(k + 1)]
                for j in range(k + 1)
            ]
        )  # [K+1 (order j), K+1 (power m of δb)]
        da = np.zeros(mom.shape[0])
        db = np.zeros(mom.shape[0])
        converged = np.zeros(mom.shape[0], dtype=bool)
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

    def fields_with(self, counted: ReplicateCounts) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Field-RCE / Field-ECE of the last :meth:`evaluate`'s replicates, with the rows and
        clicks per value of ``counted``'s last pass over the same counts (this one summed
        Σc·p alone), and where they are exact (as :meth:`evaluate`'s)."""
        out: dict[str, np.ndarray] = {}
        ok = self._fields(self.last_fields, counted.last_fields, out)
        return out, ok

    def _fields(self, own: np.ndarray, counted: np.ndarray, out) -> np.ndarray:
        """Field-RCE / Field-ECE of every segment column (``field_calibration``'s rule: values
        below min_count rows pooled into one) from the sums per value (``own``: Σc·p first;
        ``counted``: then Σc and Σc·y) [kinds · V, R]; False where a column has one value
        left (the report then leaves it out, which the caller's own evaluation does)."""
        r_count = own.shape[1]
        total = float(self.n)
        ok = np.ones(r_count, dtype=bool)
        rces, eces = [], []
        width = int(self.field_offsets[-1])
        for (name, n_values), off in zip(self.fields.items(), self.field_offsets, strict=False):
            sp = own[off : off + n_values].T
            cnt, cl = (counted[j * width + off : j * width + off + n_values].T for j in (1, 2))
            seen = cnt > 0
            d = np.where(seen, cl - sp, 0.0)
            ok &= seen.sum(axis=1) >= 2
            kept = cnt >= self.min_count
            rare = seen & ~kept
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

    def _mce(self, counts: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """The multicalibration error, replicate by replicate (its own segment search on
        weighted rows, module docstring)."""
        from ctrcal.metrics._ecce import WeightedMCE, multicalibration_error

        r_count = counts.shape[1]
        for k in MCE_KEYS:
            out[k] = np.full(r_count, np.nan)
        usable = dict(self.segments)
        subsampled = self.mce_rows is not None and self.n > self.mce_rows
        if self.mce is None and not subsampled:
            # (a subsample weights a quarter of the rows or fewer: sorting those is cheaper
            # than passes over all of them)
            self.mce = WeightedMCE(self.p, self.y, usable, **self.mce_options)
        for r in range(r_count):
            weight = counts[:, r].astype(np.int64)
            if subsampled:
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
            for key, value in zip(MCE_KEYS, got, strict=True):
                out[key][r] = value
