"""Calibration over time: a calibrator fitted once against one refitted every window.

On time-ordered data the click rate and the segments drift, and a calibrator fitted once goes
stale. Production teams refit on the latest labelled window; labels arrive late, so the
calibrator serving window w was fitted on window w − 1. This module evaluates the test period
in consecutive windows of (nearly) equal row counts, in time order, and compares per window:

* ``uncalibrated``: the model's own probabilities;
* ``stale``: the calibrator fitted once, on validation (or, for a predictions file without
  one, on the first window, which is then not evaluated);
* ``fresh``: the same calibrator refitted on the previous window (in the first window it is
  the stale one, fitted on the period just before).

Per window and calibration: ECE, PCOC, NE and (with segment fields) Field-RCE (mean over the
fields). The stale-vs-fresh ECE gap of every window is compared with the smallest difference
the window's rows can detect: ``(z_{1−α/2} + z_power) · se``, se the standard deviation of the
gap over a paired row bootstrap (both calibrations on the same resampled rows), the same
approximation as the report's seed-level detectable differences. :func:`decay_sentence` says
after how many windows the stale calibrator's ECE first exceeds the fresh one's by more.

A window's row boundaries never split rows with equal time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.calibration.base import create_calibrator
from ctrcal.metrics import as_numpy, paired_bootstrap

__all__ = [
    "CALIBRATIONS",
    "Window",
    "WindowMetrics",
    "WindowValue",
    "calibration_over_time",
    "decay_sentence",
    "windows",
]

CALIBRATIONS = ("uncalibrated", "stale", "fresh")
WINDOW_METRICS = ("ece", "pcoc", "ne", "field_rce_mean")


@dataclass(frozen=True)
class Window:
    """One test window.

    Attributes:
        window: its number, from 1 = the first window after the stale calibrator's fit.
        rows: how many rows it holds.
        time_start, time_end: its first and last time (the time column's type).
        ece_gap: stale − fresh ECE.
        detectable: the smallest detectable gap (NaN in the first window, where both are the
            same calibrator).
    """

    window: int
    rows: int
    time_start: Any
    time_end: Any
    ece_gap: float
    detectable: float


@dataclass(frozen=True)
class WindowValue:
    """One metric of one calibration in one window."""

    window: int
    calibration: str
    metric: str
    value: float


@dataclass(frozen=True)
class WindowMetrics:
    """Per-window calibration of one model under three calibrations.

    Attributes:
        metrics: every metric of every calibration in every window (window by window, then
            calibration by calibration).
        windows: one :class:`Window` per test window, in time order.
        calibrator: the calibrator spec, as given.
        fitted_on: ``"validation"`` or ``"first window"``.
    """

    metrics: list[WindowValue]
    windows: list[Window]
    calibrator: Any
    fitted_on: str

    def value(self, window: int, calibration: str, metric: str) -> float | None:
        """A metric of one calibration in one window (None: not measured there, such as
        Field-RCE without a segment that varies)."""
        for v in self.metrics:
            if (v.window, v.calibration, v.metric) == (window, calibration, metric):
                return v.value
        return None

    def first_detectable(self) -> int | None:
        """The first window whose stale − fresh ECE gap exceeds the detectable difference."""
        for w in self.windows:
            if math.isfinite(w.detectable) and w.ece_gap > w.detectable:
                return w.window
        return None

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """``{"windows": [...], "metrics": [...]}``: both tables as plain records (JSON)."""
        return {
            "windows": [dataclasses.asdict(w) for w in self.windows],
            "metrics": [dataclasses.asdict(v) for v in self.metrics],
        }


def windows(time: Any, n_windows: int) -> list[np.ndarray]:
    """Row indices of ``n_windows`` consecutive time windows of nearly equal row counts.

    Rows are ordered by time (stably, so equal times keep their file order); a boundary that
    would fall inside a run of equal times moves to the run's start.

    Raises:
        ValueError: fewer distinct times than windows, or a non-finite time.
    """
    t = as_numpy(time, "time")
    if not np.issubdtype(t.dtype, np.number) and not np.issubdtype(t.dtype, np.datetime64):
        raise ValueError(f"time: expected numbers or datetimes, got dtype {t.dtype}")
    if np.issubdtype(t.dtype, np.floating) and not np.isfinite(t).all():
        raise ValueError("time: contains NaN or infinite values")
    if not isinstance(n_windows, (int, np.integer)) or n_windows < 1:
        raise ValueError(f"n_windows: expected an integer >= 1, got {n_windows!r}")
    order = np.argsort(t, kind="stable")
    ts = t[order]
    n = ts.shape[0]
    cuts = [
        int(np.searchsorted(ts, ts[(k * n) // n_windows], side="left")) for k in range(1, n_windows)
    ]
    bounds = [0, *cuts, n]
    parts = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if any(p.size == 0 for p in parts):
        raise ValueError(
            f"time: {np.unique(ts).size} distinct times cannot make {n_windows} windows of "
            "whole time steps; use fewer windows"
        )
    return parts


def _segment_rows(segments: Mapping[str, np.ndarray] | None, rows: np.ndarray):
    return None if segments is None else {k: np.asarray(v)[rows] for k, v in segments.items()}


def _window_metrics(
    p: np.ndarray, y: np.ndarray, segs: Mapping[str, np.ndarray] | None, min_count: int
) -> dict[str, float]:
    out = {"ece": M.ece(p, y), "pcoc": M.pcoc(p, y), "ne": M.normalized_entropy(p, y)}
    usable = {k: v for k, v in (segs or {}).items() if v.min() != v.max()}
    if usable:
        fc = M.field_calibration(p, y, usable, min_count=min_count, top_k=0)
        out["field_rce_mean"] = fc.summary()["field_rce_mean"]
    return out


def _fit(spec: Any, z: np.ndarray, y: np.ndarray, segs: Mapping[str, np.ndarray] | None, what: str):
    if y.min() == y.max():
        raise ValueError(
            f"{what} holds a single class ({int(y[0])} in all {y.size} rows): a calibrator "
            "cannot be fitted on it; use fewer windows"
        )
    return create_calibrator(spec).fit(z, y, segs)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def calibration_over_time(
    logits: Any,
    labels: Any,
    time: Any,
    n_windows: int,
    calibrator: Any = "platt",
    *,
    segments: Mapping[str, Any] | None = None,
    validation: tuple[Any, Any, Mapping[str, Any] | None] | None = None,
    n_boot: int = 200,
    alpha: float = 0.05,
    power: float = 0.8,
    min_count: int = 100,
    seed: int = 0,
) -> WindowMetrics:
    """Stale, fresh and uncalibrated calibration per time window (module docstring).

    Args:
        logits: [n] the model's logits on the test period.
        labels: [n] clicks, 0/1.
        time: [n] numbers or datetimes ordering the rows.
        n_windows: test windows (``report.windows``); without ``validation`` one more window
            is cut and the first serves as the stale calibrator's fitting set.
        calibrator: a calibrator spec (see :func:`ctrcal.calibration.base.create_calibrator`).
        segments: field name -> [n] integer codes: what segment-aware calibrators read, and
            the fields of Field-RCE.
        validation: ``(logits, labels, segments)`` the stale calibrator is fitted on.
        n_boot: paired bootstrap replicates per window for the detectable difference.
        alpha, power: the detectable difference's level and power.
        min_count: Field-RCE pools values with fewer rows.
        seed: the bootstrap's seed.

    Returns:
        A :class:`WindowMetrics`.
    """
    z = as_numpy(logits, "logits").astype(np.float64)
    y = as_numpy(labels, "labels").astype(np.float64)
    if y.shape != z.shape:
        raise ValueError(f"logits and labels differ in length: {z.size} vs {y.size}")
    segs = (
        None
        if segments is None
        else {k: as_numpy(v, f"segments[{k!r}]") for k, v in segments.items()}
    )
    parts = windows(time, n_windows + (validation is None))
    t_all = as_numpy(time, "time")
    if validation is None:
        first = parts.pop(0)
        fit_z, fit_y, fit_s, fitted_on = (
            z[first],
            y[first],
            _segment_rows(segs, first),
            "first window",
        )
    else:
        fit_z, fit_y, fit_s = (
            as_numpy(validation[0], "validation logits").astype(np.float64),
            as_numpy(validation[1], "validation labels").astype(np.float64),
            validation[2],
        )
        fitted_on = "validation"
    stale = _fit(calibrator, fit_z, fit_y, fit_s, f"the {fitted_on}")
    fresh = stale
    z_mult = NormalDist().inv_cdf(1.0 - alpha / 2.0) + NormalDist().inv_cdf(power)
    values: list[WindowValue] = []
    table: list[Window] = []
    for w, rows in enumerate(parts, start=1):
        zw, yw, sw = z[rows], y[rows], _segment_rows(segs, rows)
        probs = {
            "uncalibrated": _sigmoid(zw),
            "stale": np.asarray(stale.predict_proba(zw, sw), dtype=np.float64),
            "fresh": np.asarray(fresh.predict_proba(zw, sw), dtype=np.float64),
        }
        for cal, p in probs.items():
            for metric, value in _window_metrics(p, yw, sw, min_count).items():
                values.append(WindowValue(w, cal, metric, float(value)))
        gap = M.ece(probs["stale"], yw) - M.ece(probs["fresh"], yw)
        detectable = float("nan")
        if fresh is not stale:
            ci = paired_bootstrap(
                lambda p, lab, _rows: {"ece": M.ece(p, lab)},
                probs["fresh"],
                probs["stale"],
                yw,
                n_boot=n_boot,
                seed=seed + w,
            )
            detectable = float(z_mult * ci["ece"].diff.se)
        tw = t_all[rows]
        table.append(Window(w, int(rows.size), tw.min(), tw.max(), float(gap), detectable))
        if w < len(parts):  # refitted on this window's labels, it serves the next one
            fresh = _fit(calibrator, zw, yw, sw, f"window {w}")
    return WindowMetrics(values, table, calibrator, fitted_on)


def decay_sentence(result: WindowMetrics) -> str:
    """One sentence: after how many windows the stale calibrator falls detectably behind."""
    w = result.windows
    n = len(w)
    name = result.calibrator if isinstance(result.calibrator, str) else result.calibrator["name"]
    first = result.first_detectable()
    if first is not None:
        r = next(x for x in w if x.window == first)
        return (
            f"The {name} calibrator fitted once on the {result.fitted_on} falls detectably "
            f"behind one refitted every window after {first} window{'s' * (first != 1)} (of "
            f"{n}): in window {first} its ECE is {result.value(first, 'stale', 'ece'):.4f} "
            f"against {result.value(first, 'fresh', 'ece'):.4f}, a gap of {r.ece_gap:.4f} above "
            f"the smallest detectable difference {r.detectable:.4f} (paired row bootstrap)."
        )
    finite = [x for x in w if math.isfinite(x.detectable)]
    if not finite:
        return (
            f"With {n} window{'s' * (n != 1)} the {name} calibrator fitted once on the "
            f"{result.fitted_on} and one refitted every window are the same calibrator; use "
            "more windows to compare them."
        )
    # the largest gap, the first window holding it (a gap that is NaN is no candidate)
    worst = max((x for x in finite if not math.isnan(x.ece_gap)), key=lambda x: x.ece_gap)
    return (
        f"In none of {n} windows does the {name} calibrator fitted once on the "
        f"{result.fitted_on} fall detectably behind one refitted every window: its largest "
        f"ECE gap, {worst.ece_gap:.4f} in window {int(worst.window)}, stays below the smallest "
        f"detectable difference there ({worst.detectable:.4f}, paired row bootstrap)."
    )
