"""Figures of the shift report (PNG, matplotlib's Agg canvas; no pyplot, no global backend).

Every function takes the tidy tables of :mod:`ctrcal.eval.report` and writes one PNG:

* :func:`plot_metrics_vs_intensity`: metric panels vs shift intensity, mean ± standard error
  over training seeds, one line per variant (with ``["auc", "ece"]`` the paper's Figure 3).
* :func:`plot_reliability`: reliability diagrams (click rate vs mean predicted probability
  per bin) at chosen intensities, pooled over seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.utils import atomic_path

__all__ = ["METRIC_LABELS", "plot_metrics_vs_intensity", "plot_reliability"]

METRIC_LABELS: dict[str, str] = {
    "auc": "AUC (↑)",
    "auc_retained": "AUC retained vs clean (↑)",
    "ece": "ECE, 15 equal-width bins (↓)",
    "ece_mass": "ECE, 15 equal-mass bins (↓)",
    "logloss": "logloss (↓)",
    "brier": "Brier score (↓)",
    "pcoc": "PCOC Σp/Σy (1 = calibrated)",
    "ne": "normalized entropy (↓)",
    "pred_std": "mean predictive std (MC)",
    "std_auroc": "AUROC of std: shifted vs clean",
}

_STYLES = ["o-", "s--", "^-.", "D:", "v-", "P--", "X-.", "*:"]


def _figure(n_panels: int, width: float = 4.2, height: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n_panels, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, n_panels, i + 1) for i in range(n_panels)]
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def plot_metrics_vs_intensity(
    summary: pd.DataFrame,
    metrics: Sequence[str],
    path: str | Path,
    variants: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str = "shift intensity (% of feature std)",
    x_scale: float = 100.0,
) -> Path:
    """Panels of metric vs shift intensity with standard-error bars.

    Args:
        summary: columns ``variant, intensity, metric, mean, se, n`` (se may be NaN).
        metrics: one panel per metric present in ``summary``.
        path: PNG to write.
        variants: order and subset of lines (default: as they appear).
        title: figure title.
        xlabel: the x axis label (the shift's unit).
        x_scale: intensities are drawn as ``x_scale · intensity`` (100 for percent).

    Returns:
        ``path``.
    """
    metrics = [m for m in metrics if m in set(summary["metric"])]
    if not metrics:
        raise ValueError("none of the requested metrics is in the summary")
    variants = list(variants) if variants is not None else list(dict.fromkeys(summary["variant"]))
    fig, axes = _figure(len(metrics))
    levels = np.unique(x_scale * summary["intensity"].to_numpy(dtype=float))
    gap = float(np.min(np.diff(levels))) if levels.size > 1 else 1.0
    # dodge the lines sideways a little so overlapping error bars stay readable
    offsets = (np.arange(len(variants)) - (len(variants) - 1) / 2) * min(0.6, 0.12 * gap)
    for ax, metric in zip(axes, metrics, strict=True):
        rows = summary[summary["metric"] == metric]
        for i, variant in enumerate(variants):
            sub = rows[rows["variant"] == variant].sort_values("intensity")
            if sub.empty:
                continue
            x = x_scale * sub["intensity"].to_numpy() + offsets[i]
            err = np.nan_to_num(sub["se"].to_numpy(dtype=float))
            ax.errorbar(
                x,
                sub["mean"].to_numpy(dtype=float),
                yerr=err,
                fmt=_STYLES[i % len(_STYLES)],
                capsize=3,
                markersize=4,
                label=variant,
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(METRIC_LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
        if metric == "pcoc":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_reliability(
    curves: dict[str, dict[float, dict[str, Any]]],
    path: str | Path,
    intensities: Sequence[Any],
    title: str | None = None,
    min_count: int = 20,
    panel_titles: Sequence[str] | None = None,
) -> Path:
    """Reliability diagrams, one panel per intensity, one line per variant.

    Bins holding fewer than ``min_count`` rows are not drawn (their click rate is noise).

    Args:
        curves: ``{variant: {intensity: {"mean_prob": [...], "frac_pos": [...],
            "counts": [...]}}}`` (bins with no rows are skipped).
        path: PNG to write.
        intensities: the keys of ``curves[variant]`` to draw, one panel each.
        title: figure title.
        min_count: smallest bin drawn.
        panel_titles: one title per panel (default: "shift <intensity> %").

    Returns:
        ``path``.
    """
    fig, axes = _figure(len(intensities), width=4.0, height=3.8)
    titles = (
        list(panel_titles)
        if panel_titles is not None
        else [f"shift {100 * float(s):g} %" for s in intensities]
    )
    for ax, intensity, panel in zip(axes, intensities, titles, strict=True):
        top = 0.0
        for i, (variant, by_intensity) in enumerate(curves.items()):
            curve = by_intensity.get(intensity)
            if curve is None:
                continue
            counts = np.asarray(curve["counts"], dtype=float)
            keep = counts >= min_count
            mp = np.asarray(curve["mean_prob"], dtype=float)[keep]
            fp = np.asarray(curve["frac_pos"], dtype=float)[keep]
            top = max(top, float(np.max(mp, initial=0)), float(np.max(fp, initial=0)))
            ax.plot(mp, fp, _STYLES[i % len(_STYLES)], markersize=4, label=variant)
        top = min(1.0, top * 1.05 + 0.02)
        ax.plot([0, top], [0, top], color="grey", lw=0.8, ls=":", label="calibrated")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("mean predicted click probability")
        ax.set_ylabel("observed click rate")
        ax.set_title(panel, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)
