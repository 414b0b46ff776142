"""The figure of calibration over time: metrics per window, stale vs fresh vs uncalibrated.

One panel per metric (ECE, PCOC, Field-RCE, NE; those present), one line per calibration,
and on the ECE panel the band fresh ± the smallest detectable gap, so a stale point above the
band is a detectable decay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrcal.reports.figures import axis_label, new_figure, save_figure
from ctrcal.reports.shift.windows import CALIBRATIONS, WindowMetrics

__all__ = ["plot_windows"]

_PANELS = ("ece", "pcoc", "field_rce_mean", "ne")  # the metrics drawn, when measured
_STYLES = {"uncalibrated": "o:", "stale": "s-", "fresh": "^--"}


def plot_windows(result: WindowMetrics, path: str | Path, title: str | None = None) -> Path:
    """Metrics per time window for the three calibrations (module docstring); returns path."""
    metrics = [k for k in _PANELS if any(v.metric == k for v in result.metrics)]
    fig, axes = new_figure(len(metrics), width=3.8, height=3.2)
    for ax, metric in zip(axes, metrics, strict=True):
        for cal in CALIBRATIONS:
            x, y = _line(result, metric, cal)
            ax.plot(x, y, _STYLES[cal], markersize=4, label=cal)
        if metric == "ece":
            x, fresh = _line(result, "ece", "fresh")
            by_window = sorted(result.windows, key=lambda w: w.window)
            det = np.nan_to_num(np.array([w.detectable for w in by_window], dtype=float))
            ax.fill_between(
                x,
                fresh - det,
                fresh + det,
                alpha=0.15,
                color="C2",
                label="fresh ± detectable",
            )
        if metric == "pcoc":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"time window (stale: fitted on the {result.fitted_on})")
        ax.set_ylabel(axis_label(metric))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))


def _line(result: WindowMetrics, metric: str, calibration: str) -> tuple[np.ndarray, np.ndarray]:
    """([k] windows, [k] values) of one metric of one calibration, in window order."""
    points = sorted(
        (v.window, v.value)
        for v in result.metrics
        if v.metric == metric and v.calibration == calibration
    )
    return (
        np.array([p[0] for p in points], dtype=np.int64),
        np.array([p[1] for p in points], dtype=float),
    )
