"""Figures of the shift report (PNG, matplotlib's Agg canvas; no pyplot, no global backend).

Every function takes the tidy tables of :mod:`ctrcal.reports.shift.stats` and writes one PNG:

* :func:`plot_metrics_vs_intensity`: metric panels vs shift intensity, mean ± standard error
  over training seeds, one line per variant (with ``["auc", "ece"]`` the paper's Figure 3).
* reliability diagrams (click rate vs mean predicted probability per bin) at chosen
  intensities, pooled over seeds (:func:`ctrcal.reports.figures.plot_reliability`).
* :func:`plot_field_rce`: Field-RCE by field × intensity for the baseline and the best variant.

:func:`write_figures` draws every figure of a report directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.reports.figures import (
    LINE_STYLES,
    axis_label,
    new_figure,
    plot_reliability,
    save_figure,
)
from ctrcal.reports.shift.stats import CLEAN, format_intensity

__all__ = [
    "best_variant",
    "plot_field_rce",
    "plot_metrics_vs_intensity",
    "write_figures",
]


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
    fig, axes = new_figure(len(metrics))
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
                fmt=LINE_STYLES[i % len(LINE_STYLES)],
                capsize=3,
                markersize=4,
                label=variant,
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(axis_label(metric))
        ax.grid(alpha=0.3)
        if metric == "pcoc":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def best_variant(
    summary: pd.DataFrame, baseline: str, metric: str = "field_rce_mean"
) -> str | None:
    """The non-baseline variant with the lowest ``metric`` averaged over shifted points."""
    sub = summary[(summary["metric"] == metric) & (summary["intensity"] > 0)]
    sub = sub[sub["variant"] != baseline]
    if sub.empty:
        return None
    means = sub.groupby("variant", sort=False)["mean"].mean()
    return str(means.idxmin())


def plot_field_rce(
    summary: pd.DataFrame,
    variants: Sequence[str],
    path: str | Path,
    shift: str | None = None,
    unit: str = "std",
) -> Path | None:
    """Heatmaps of Field-RCE (mean over seeds) by field × intensity, one panel per variant.

    Args:
        summary: columns ``variant, [shift,] intensity, metric, mean`` with per-field metrics
            ``field_rce:<field>``.
        variants: the panels, e.g. the baseline and the best variant.
        path: PNG to write.
        shift: keep the clean point and this shift's points (None: all points).
        unit: how the shift's intensities read (see
            :func:`~ctrcal.reports.shift.stats.format_intensity`).

    Returns:
        ``path``, or None when the summary holds no per-field values.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sub = summary[summary["metric"].str.startswith("field_rce:")]
    if shift is not None and "shift" in sub.columns:
        sub = sub[sub["shift"].isin([CLEAN, shift])]
    sub = sub[sub["variant"].isin(variants)]
    if sub.empty:
        return None
    fields = list(dict.fromkeys(sub["metric"].str.slice(len("field_rce:"))))
    levels = sorted(set(sub["intensity"].astype(float)))
    grids = []
    for v in variants:
        g = np.full((len(fields), len(levels)), np.nan)
        for r in sub[sub["variant"] == v].itertuples():
            g[fields.index(r.metric[len("field_rce:") :]), levels.index(float(r.intensity))] = (
                r.mean
            )
        grids.append(g)
    vmax = float(np.nanmax(grids)) if np.isfinite(grids).any() else 1.0
    fig = Figure(
        figsize=(1.2 + 1.1 * len(levels) * len(variants), 0.8 + 0.22 * len(fields)), dpi=120
    )
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(variants), squeeze=False, sharey=True)
    for ax, v, g in zip(axes[0], variants, grids, strict=True):
        im = ax.imshow(g, aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax)
        ax.set_title(v, fontsize=9)
        ticks = ["clean" if s == 0 else format_intensity(s, unit) for s in levels]
        ax.set_xticks(range(len(levels)), ticks, fontsize=7)
        ax.set_yticks(range(len(fields)), fields, fontsize=6)
        ax.set_xlabel("shift intensity", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Field-RCE")
    fig.suptitle(
        "Field-RCE by field and shift intensity" + (f" ({shift})" if shift else ""), fontsize=9
    )
    return save_figure(fig, Path(path), bbox_inches="tight")


_XLABEL = {
    "std": ("shift intensity (% of feature std)", 100.0),
    "p": ("replacement probability p", 1.0),
    "natural": ("clean (0) vs natural shift (1)", 1.0),
}


def _shift_frame(summary: pd.DataFrame, shift: str) -> pd.DataFrame:
    """The clean point plus one shift's points."""
    return summary[summary["shift"].isin([CLEAN, shift])]


def write_figures(
    summary: pd.DataFrame,
    reliability: dict[str, dict[Any, dict[str, Any]]] | None,
    out_dir: Path,
    variants: list[str],
    shifts: list[dict[str, Any]],
    baseline: str | None = None,
) -> dict[str, Path]:
    """Every figure of a report: per shift, then the pooled reliability diagrams.

    Args:
        summary: :func:`~ctrcal.reports.shift.stats.summarize` output.
        reliability: pooled reliability curves ``{variant: {(shift, intensity): {...}}}``.
        out_dir: where the PNGs go.
        variants: the lines, in order.
        shifts: one dict per shift (``label``, ``unit``).
        baseline: the variant of the first Field-RCE panel (default: the first variant).

    Returns:
        ``{"<kind>:<shift>": path}`` (``"reliability"`` without a shift).
    """
    out: dict[str, Path] = {}
    present = set(summary["metric"])
    for info in shifts:
        label = info["label"]
        sub = _shift_frame(summary, label)
        xlabel, scale = _XLABEL.get(info.get("unit", "std"), _XLABEL["std"])
        slug = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)
        axes = {"xlabel": xlabel, "x_scale": scale}
        out[f"auc_ece:{label}"] = plot_metrics_vs_intensity(
            sub,
            ["auc", "ece"],
            out_dir / f"fig_{slug}_auc_ece.png",
            variants,
            title=f"AUC and ECE under {label} (mean ± SE over seeds)",
            **axes,
        )
        if present & {"logloss", "brier", "pcoc", "ne"}:
            out[f"calibration:{label}"] = plot_metrics_vs_intensity(
                sub,
                ["logloss", "brier", "pcoc", "ne"],
                out_dir / f"fig_{slug}_calibration.png",
                variants,
                **axes,
            )
        if present & {"ecce", "field_rce_mean", "mce"}:
            out[f"field_calibration:{label}"] = plot_metrics_vs_intensity(
                sub,
                ["ecce", "field_rce_mean", "field_rce_max", "mce"],
                out_dir / f"fig_{slug}_field_calibration.png",
                variants,
                **axes,
            )
        base = baseline or variants[0]
        best = best_variant(sub, base)
        heat = plot_field_rce(
            sub,
            [base] + ([best] if best else []),
            out_dir / f"fig_{slug}_field_rce.png",
            label,
            info.get("unit", "std"),
        )
        if heat is not None:
            out[f"field_rce:{label}"] = heat
        has_std = set(sub[sub["metric"] == "pred_std"]["variant"])
        std_variants = [v for v in variants if v in has_std]
        if std_variants:
            out[f"uncertainty:{label}"] = plot_metrics_vs_intensity(
                sub,
                ["pred_std", "std_auroc"],
                out_dir / f"fig_{slug}_uncertainty.png",
                std_variants,
                **axes,
            )
    if reliability:
        keys: list[Any] = []
        for by in reliability.values():
            keys += [key for key in by if key not in keys]
        keys.sort(key=lambda k: (k[0] != CLEAN, str(k[0]), float(k[1])))
        units = {i["label"]: i.get("unit", "std") for i in shifts}
        titles = [
            "clean" if k[0] == CLEAN else f"{k[0]} {format_intensity(k[1], units.get(k[0], 'std'))}"
            for k in keys
        ]
        out["reliability"] = plot_reliability(
            reliability, out_dir / "fig_reliability.png", keys, panel_titles=titles
        )
    return out
