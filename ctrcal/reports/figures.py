"""What both reports draw with: the figure canvas, the PNG writer and reliability diagrams.

matplotlib's Agg canvas, without pyplot and its global backend; a PNG is written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.utils import atomic_path

__all__ = ["LINE_STYLES", "axis_label", "new_figure", "plot_reliability", "save_figure"]

# one marker and dash pattern per line of a panel, in order (cycled)
LINE_STYLES = ["o-", "s--", "^-.", "D:", "v-", "P--", "X-.", "*:"]


def axis_label(metric: str) -> str:
    """A metric's axis label: its declared label and which way is better (``AUC (↑)``,
    ``ECE (↓)``); PCOC, best at 1, says so; an undeclared metric is its name."""
    from ctrcal.metrics import metric_of

    m = metric_of(metric)
    if m is None:
        return metric
    if m.better is not None:
        return f"{m.label} ({'↑' if m.better == 'higher' else '↓'})"
    return f"{m.label} (1 = calibrated)" if m.name == "pcoc" else m.label


def new_figure(n_panels: int, width: float = 4.2, height: float = 3.4):
    """A figure of ``n_panels`` panels side by side (``width`` × ``height`` inches each) on
    matplotlib's Agg canvas, and the panels' axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * n_panels, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, n_panels, i + 1) for i in range(n_panels)]
    return fig, axes


def save_figure(fig: Any, path: Path, **kwargs: Any) -> Path:
    """Write ``fig`` to ``path`` as a PNG, atomically (``kwargs``: ``savefig``'s); returns
    ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", **kwargs)
    return path


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
    fig, axes = new_figure(len(intensities), width=4.0, height=3.8)
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
            ax.plot(mp, fp, LINE_STYLES[i % len(LINE_STYLES)], markersize=4, label=variant)
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
    return save_figure(fig, path)
