"""The text of ``report.md``: a one-screen summary, then the appendix (the design and its
shifts, the verdict table, the tables per shift, the definitions).

:func:`render_markdown` words a :class:`~ctrcal.reports.shift.stats.Summary` and a
:class:`~ctrcal.reports.shift.render.ReportMeta`; the summary, the verdict's table and
sentence are :mod:`ctrcal.reports.shift.verdict`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ctrcal.metrics import metrics_in
from ctrcal.reports.markdown import definition_lines, markdown_table
from ctrcal.reports.shift.stats import CLEAN, Summary, format_intensity
from ctrcal.reports.shift.verdict import exploratory_lines, summary_lines, verdict_lines

if TYPE_CHECKING:
    from ctrcal.reports.shift.render import ReportMeta

__all__ = ["metric_table", "render_markdown", "shift_infos"]

TABLE_METRICS = ["auc", "auc_retained", "ece", "ece_mass", "logloss", "brier", "pcoc", "ne"]
UNCERTAINTY_METRICS = ["pred_std", "std_auroc"]
# ctrcal.metrics.risk_coverage: metrics on the most confident rows by predictive std
RISK_COVERAGE_METRICS = [
    "auc@50%",
    "auc@80%",
    "auc@100%",
    "logloss@50%",
    "logloss@80%",
    "logloss@100%",
]


def _mean_se(mean: float, se: float, digits: int = 4) -> str:
    if not math.isfinite(mean):
        return "n/a"
    if not math.isfinite(se):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def _shift_frame(summary: pd.DataFrame, shift: str | None) -> pd.DataFrame:
    """The clean point plus one shift's points (``shift=None``: every row)."""
    if shift is None or "shift" not in summary.columns:
        return summary
    return summary[summary["shift"].isin([CLEAN, shift])]


def metric_table(
    summary: pd.DataFrame,
    metric: str,
    variants: Sequence[str],
    shift: str | None = None,
    unit: str = "std",
) -> str:
    """Markdown table of one metric: variants × (clean, the shift's intensities), mean ± SE."""
    sub = _shift_frame(summary, shift)
    sub = sub[sub["metric"] == metric]
    points = sorted(set(zip(sub["shift"], sub["intensity"], strict=True)), key=_point_order)
    # (variant, shift, intensity) -> its first row's (mean, se): one pass, not one filter a cell
    found: dict[tuple[Any, Any, Any], tuple[float, float]] = {}
    columns = (sub[c] for c in ("variant", "shift", "intensity", "mean", "se"))
    for v, sh, s, mean, se in zip(*columns, strict=True):
        found.setdefault((v, sh, s), (float(mean), float(se)))
    rows = []
    for v in variants:
        cells = [v]
        for sh, s in points:
            hit = found.get((v, sh, s))
            cells.append("–" if hit is None else _mean_se(*hit))
        if len(cells) > 1 and any(c != "–" for c in cells[1:]):
            rows.append(cells)
    header = ["clean" if sh == CLEAN else format_intensity(s, unit) for sh, s in points]
    return markdown_table(["variant", *header], rows)


def _point_order(point: tuple[str, float]) -> tuple[int, float]:
    return (0 if point[0] == CLEAN else 1, float(point[1]))


def shift_infos(shifts: Sequence[dict[str, Any]], summary: pd.DataFrame) -> list[dict[str, Any]]:
    """One dict per shift (label, unit, ...): as described, or inferred from the table."""
    infos = list(shifts)
    known = {i["label"] for i in infos}
    for label in dict.fromkeys(summary["shift"]):
        if label != CLEAN and label not in known:
            infos.append({"label": label, "name": label, "unit": "std", "description": ""})
    return infos


def _shift_paragraph(info: dict[str, Any]) -> list[str]:
    unit = info.get("unit", "std")
    grid = ", ".join(format_intensity(s, unit) for s in info.get("intensities", []))
    lines = [
        f"- **{info['label']}** ({info.get('name', info['label'])}): "
        f"{info.get('description', '')}; levels {grid or 'n/a'}."
    ]
    if info.get("name") == "gaussian_numeric":
        space = info.get("space", "model")
        where = (
            "the value as it stands in the input file (the stored transform is inverted on "
            "the batch, the noise added, the transform applied again)"
            if space == "original"
            else "the model-input value"
        )
        lines[0] += (
            f" Space: **{space}**: N(0, (s·σ_j)²) is added to {where}; missing values stay missing."
        )
        fields = info.get("numeric_fields") or []
        if fields:
            lines += [
                "",
                f"σ_j per numeric feature (train split) in both spaces ({info['label']}):",
                "",
                markdown_table(
                    ["space", *fields],
                    [
                        [
                            "original" + (" (used)" if space == "original" else ""),
                            *_cells(info.get("original_std"), len(fields)),
                        ],
                        [
                            "model input" + (" (used)" if space == "model" else ""),
                            *_cells(info.get("model_std"), len(fields)),
                        ],
                    ],
                ),
                "",
            ]
    return lines


def _shift_grid(info: dict[str, Any]) -> str:
    """``gaussian_numeric at 6.25 %, 12.5 %`` (a shift and its levels, in a phrase)."""
    unit = info.get("unit", "std")
    if unit == "natural":
        return info["label"]
    levels = ", ".join(format_intensity(s, unit) for s in info.get("intensities", []))
    return f"{info['label']} at {levels}" if levels else info["label"]


def _cells(values: Sequence[float] | None, n: int) -> list[str]:
    if not values:
        return ["n/a"] * n
    return [f"{float(v):.4g}" for v in values]


def render_markdown(
    summary: Summary,
    meta: ReportMeta,
    figures: dict[str, Path],
    shifts: Sequence[dict[str, Any]] | None = None,
    *,
    extra: Sequence[str] = (),
) -> str:
    """The text of report.md.

    Args:
        summary: the report's numbers.
        meta: how the report was made.
        figures: the figures written, ``{key: path}`` (linked by file name).
        shifts: one dict per shift (default: :func:`shift_infos` of ``meta.shifts``).
        extra: lines of further sections, placed before the figure list.
    """
    table = summary.table
    variants, n = summary.variants, summary.n_seeds
    shifts = list(shifts) if shifts is not None else shift_infos(meta.shifts, table)
    units = {i["label"]: i.get("unit", "std") for i in shifts}
    main = next((p for k, p in figures.items() if k.startswith("auc_ece")), None)
    lines = [
        "# Shift-robustness report",
        "",
        f"{', '.join(variants)} against {summary.baseline}, paired by training seed ({n} "
        f"seed(s)); the {meta.split} split ({meta.rows:,} rows) clean and under "
        + "; ".join(_shift_grid(info) for info in shifts)
        + f"; wall time {meta.elapsed}.",
        "",
        "## Summary",
        "",
        *summary_lines(summary, units),
    ]
    if main is not None:
        lines += [f"![AUC and ECE vs shift intensity]({main.name})", ""]
    lines += [
        "The appendix below holds the design, the full verdict table, every point's mean ± SE "
        "and the exploratory metrics; `results.csv` holds every value of every seed, "
        "`summary.json` the paired tests.",
        "",
        "# Appendix",
        "",
        "## Design",
        "",
        f"The {meta.split} split ({meta.rows:,} rows) evaluated clean and under "
        f"{len(shifts)} shift(s)"
        + (
            f"; only {100 * meta.mix_fraction:g} % of the rows of each batch shifted, metrics "
            "on those rows"
            if meta.mix_fraction < 1
            else ""
        )
        + f". Variants: {', '.join(meta.variant_descriptions or variants)}. "
        f"{n} training seed(s) × {meta.noise_seeds} noise seed(s); tables show mean ± "
        f"standard error over training seeds (after averaging noise seeds). Every variant "
        f"sees the same shifted rows (the noise depends on the shift's seed only). "
        f"Device: {meta.device}.",
        "",
        "## Shifts",
        "",
    ]
    for info in shifts:
        lines += _shift_paragraph(info)
    lines += [""]
    oracle = meta.oracle or {}
    if "auc" in oracle and "logloss" in oracle:
        lines += [
            f"Synthetic data: the true click probabilities reach AUC {oracle['auc']:.4f} and "
            f"logloss {oracle['logloss']:.4f} on the clean rows, the reference no model can "
            "beat in expectation.",
            "",
        ]
    lines += _oracle_calibration_lines(meta.oracle_calibration)
    lines += [f"## Verdict: each variant vs {summary.baseline}", ""]
    lines += verdict_lines(summary, units)
    present = set(table["metric"])
    for info in shifts:
        label, unit = info["label"], info.get("unit", "std")
        lines += [f"## Shift: {label}", ""]
        for m in metrics_in("shift"):
            title, metric = m.label, m.name
            if metric in present:
                lines += [
                    f"### {title}",
                    "",
                    metric_table(table, metric, variants, label, unit),
                    "",
                ]
    lines += exploratory_lines(summary, units)
    if present & set(UNCERTAINTY_METRICS):
        std_variants = [
            v
            for v in variants
            if not table[(table["variant"] == v) & (table["metric"] == "pred_std")].empty
        ]
        lines += [
            "## Uncertainty quality",
            "",
            "For every variant with a per-row predictive std (MC passes, ensembles): how well "
            "the std tells shifted rows from the same rows clean (AUROC; 0.5 = no signal), and "
            "the mean std. The paper did not measure this.",
            "",
        ]
        for info in shifts:
            label, unit = info["label"], info.get("unit", "std")
            if "std_auroc" in present:
                lines += [
                    f"AUROC of the std, shifted vs clean rows — {label}:",
                    "",
                    metric_table(table, "std_auroc", std_variants, label, unit),
                    "",
                ]
            lines += [
                f"Mean predictive std — {label}:",
                "",
                metric_table(table, "pred_std", std_variants, label, unit),
                "",
            ]
        lines += _risk_coverage_lines(table, std_variants, shifts, present)
    lines += list(extra)
    if figures:
        lines += ["## Figures", ""]
        for key, path in figures.items():
            lines += [f"- [{path.name}]({path.name}): {_caption(key)}"]
        lines += [""]
    lines += ["## Metric definitions", ""]
    lines += definition_lines(present)
    lines += [
        "",
        "Predicted probability p = sigmoid(logit); ECE bins the predicted *click* probability "
        "itself (not max(p, 1 − p)). Standard error = sample std over training seeds / √n.",
        "",
        f"Files: `results.csv` (every value), `summary.json`; runs under `{meta.runs_dir}`.",
        "",
    ]
    return "\n".join(lines)


def _risk_coverage_lines(
    table: pd.DataFrame, variants: Sequence[str], shifts: Sequence[dict[str, Any]], present: set
) -> list[str]:
    """AUC and logloss on the most confident rows, per coverage, clean and per shift."""
    if not present & set(RISK_COVERAGE_METRICS):
        return []
    lines = [
        "### Risk–coverage",
        "",
        "AUC and logloss on the 50 / 80 / 100 % of rows with the smallest predictive std "
        "(Geifman and El-Yaniv 2017): if the std says which rows to trust, AUC rises and "
        "logloss falls as the coverage shrinks.",
        "",
    ]
    for info in shifts:
        label, unit = info["label"], info.get("unit", "std")
        for metric in RISK_COVERAGE_METRICS:
            if metric in present and not metric.endswith("@100%"):
                lines += [
                    f"{metric} — {label}:",
                    "",
                    metric_table(table, metric, variants, label, unit),
                    "",
                ]
    return lines


def _oracle_calibration_lines(oracle: dict[str, float] | None) -> list[str]:
    """The calibration floor of the generator's true probabilities (synthetic data)."""
    if not oracle or "ecce" not in oracle:
        return []
    bits = [f"ECCE {oracle['ecce']:.4f} ({oracle['ecce_sigmas']:.1f} σ)"]
    if "field_rce_mean" in oracle:
        bits += [
            f"Field-RCE {oracle['field_rce_mean']:.4f} mean / {oracle['field_rce_max']:.4f} "
            "worst field",
            f"multicalibration error {oracle['mce']:.4f} (p = {oracle['mce_pvalue']:.2g}, "
            "Bonferroni-adjusted)",
        ]
    return [
        "The true probabilities, on the clean rows, have " + ", ".join(bits) + ": the "
        "calibration floor of this sample (finite-sample noise), which no model beats in "
        "expectation.",
        "",
    ]


def _caption(key: str) -> str:
    kind, _, shift = key.partition(":")
    text = {
        "auc_ece": "AUC and ECE vs shift intensity, mean ± SE over seeds (cf. the paper's "
        "Figure 3)",
        "calibration": "Logloss, Brier score, PCOC and normalized entropy vs shift intensity",
        "reliability": "Reliability diagrams, clean and at the strongest level of each shift "
        "(pooled over seeds; bins with < 20 rows not drawn)",
        "uncertainty": "Predictive std and its AUROC at detecting shifted rows",
        "field_calibration": "ECCE, Field-RCE (mean and worst field) and the multicalibration "
        "error vs shift intensity",
        "field_rce": "Field-RCE by field and shift intensity for the baseline and the variant "
        "with the lowest mean Field-RCE under the shift",
        "windows": "Calibration over time: ECE, PCOC, Field-RCE and NE per test window, stale "
        "vs fresh vs uncalibrated",
    }.get(kind, kind)
    return f"{text} — {shift}" if shift else text
