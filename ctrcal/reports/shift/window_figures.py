"""The figure of calibration over time: metrics per window, stale vs fresh vs uncalibrated.

One panel per metric (ECE, PCOC, Field-RCE, NE; those present), one line per calibration,
and on the ECE panel the band fresh ± the smallest detectable gap, so a stale point above the
band is a detectable decay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrcal.reports.shift.figures import _figure, _save
from ctrcal.reports.shift.windows import CALIBRATIONS, WindowMetrics

__all__ = ["plot_windows"]

_LABELS = {
    "ece": "ECE, 15 equal-width bins (↓)",
    "pcoc": "PCOC Σp/Σy (1 = calibrated)",
    "field_rce_mean": "Field-RCE, mean over fields (↓)",
    "ne": "normalized entropy (↓)",
}
_STYLES = {"uncalibrated": "o:", "stale": "s-", "fresh": "^--"}


def plot_windows(result: WindowMetrics, path: str | Path, title: str | None = None) -> Path:
    """Metrics per time window for the three calibrations (module docstring); returns path."""
    m = result.metrics
    metrics = [k for k in _LABELS if k in set(m["metric"])]
    fig, axes = _figure(len(metrics), width=3.8, height=3.2)
    for ax, metric in zip(axes, metrics, strict=True):
        for cal in CALIBRATIONS:
            sub = m[(m["metric"] == metric) & (m["calibration"] == cal)].sort_values("window")
            ax.plot(sub["window"], sub["value"], _STYLES[cal], markersize=4, label=cal)
        if metric == "ece":
            fresh = m[(m["metric"] == "ece") & (m["calibration"] == "fresh")].sort_values("window")
            det = np.nan_to_num(result.windows.sort_values("window")["detectable"].to_numpy())
            ax.fill_between(
                fresh["window"],
                fresh["value"] - det,
                fresh["value"] + det,
                alpha=0.15,
                color="C2",
                label="fresh ± detectable",
            )
        if metric == "pcoc":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"time window (stale: fitted on the {result.fitted_on})")
        ax.set_ylabel(_LABELS[metric])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, Path(path))
