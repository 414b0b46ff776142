"""The figure of the worst segments: observed against predicted clicks, and their ratio, one
point per segment."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrcal.metrics import SegmentScan
from ctrcal.reports.figures import new_figure, save_figure

__all__ = ["plot_segments"]


def plot_segments(
    scan: SegmentScan, path: str | Path, title: str | None = None, label_top: int = 5
) -> Path:
    """Two panels per tested segment: observed vs predicted clicks (log-log, the diagonal is
    calibration) and the ratio observed / predicted with its interval against the segment's
    predicted clicks (a funnel: small segments scatter widely, so a ratio far from 1 on a large
    segment is the one to read). Flagged segments (Holm-adjusted p below ``scan.alpha``) are
    red; those among the ``label_top`` worst are named on the ratio panel.

    Args:
        scan: :func:`~ctrcal.metrics.worst_segments`'s result.
        path: PNG to write.
        title: figure title.
        label_top: flagged segments named on the figure, at most.

    Returns:
        ``path``.
    """
    fig, (ax, rax) = new_figure(2, width=4.8, height=4.4)
    segs = [s for s in scan.segments if s.predicted > 0]
    flagged = np.array([s.pvalue_adjusted < scan.alpha for s in segs], dtype=bool)
    pred = np.array([s.predicted for s in segs])
    obs = np.array([max(s.observed, 0.5) for s in segs])  # 0 clicks drawn at 0.5 on a log axis
    ratio = np.array([s.ratio for s in segs])
    r_err = np.array([[s.ratio - s.low for s in segs], [s.high - s.ratio for s in segs]])
    groups = (
        (~flagged, "tab:blue", "not significant"),
        (flagged, "tab:red", f"flagged (Holm, α = {scan.alpha:g})"),
    )
    for mask, colour, name in groups:
        if mask.any():
            ax.plot(pred[mask], obs[mask], "o", ms=3, color=colour, label=name)
            rax.errorbar(
                pred[mask],
                ratio[mask],
                yerr=r_err[:, mask].reshape(2, -1),
                fmt="o",
                ms=3,
                lw=0.7,
                color=colour,
            )
    if segs:
        lo = float(min(pred.min(), obs.min())) * 0.8
        hi = float(max(pred.max(), obs.max())) * 1.25
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls=":", label="calibrated")
        rax.axhline(1.0, color="grey", lw=0.8, ls=":")
        for a in (ax, rax):
            a.set_xscale("log")
        ax.set_yscale("log")
        for a in (ax, rax):
            a.minorticks_off()  # log minor ticks cost most of the drawing, and say little here
        named = [s for s in segs[:label_top] if s.pvalue_adjusted < scan.alpha]
        for i, s in enumerate(named):
            rax.annotate(
                s.name,
                (s.predicted, s.ratio),
                fontsize=7,
                xytext=(6, 10 * i - 10),
                textcoords="offset points",
            )
        ax.legend(fontsize=8)
    ax.set_xlabel("predicted clicks (Σp)")
    ax.set_ylabel("observed clicks (Σy)")
    rax.set_xlabel("predicted clicks (Σp)")
    rax.set_ylabel(f"observed / predicted, {100 * scan.level:g} % interval")
    ax.set_title(
        f"{scan.tested} segments tested, {scan.skipped} below {scan.min_count} rows skipped",
        fontsize=9,
    )
    rax.set_title("1 = calibrated; < 1 over-predicted", fontsize=9)
    for a in (ax, rax):
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))
