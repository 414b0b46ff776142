"""Writing a shift report: results.csv, summary.json, report.md and the figures.

:func:`write_report` takes the long results table (see :mod:`ctrcal.eval.stats`) and writes
every file of a report directory; :func:`render_markdown` is the text of ``report.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.eval import metrics as M
from ctrcal.eval.stats import (
    CLEAN,
    RESULT_COLUMNS,
    format_intensity,
    paired_differences,
    summarize,
    verdict_paragraph,
)
from ctrcal.utils import write_json_atomic, write_text_atomic

__all__ = ["ReportPaths", "finish_message", "metric_table", "render_markdown", "write_report"]

TABLE_METRICS = ["auc", "auc_retained", "ece", "ece_mass", "logloss", "brier", "pcoc", "ne"]
UNCERTAINTY_METRICS = ["pred_std", "std_auroc"]
EXTRA_DEFINITIONS = {
    "auc_retained": "AUC under the shift divided by the clean AUC of the same run "
    "(per seed, then averaged); higher means more of the clean ranking quality survives.",
    "pred_std": "variants with several samples per row (MC passes or ensemble members): mean "
    "over rows of the per-row standard deviation of the click probability across samples.",
    "std_auroc": "AUROC of the per-row predictive std at telling shifted rows (positive) from "
    "the same rows clean (negative); 0.5 = no signal.",
}
SECTIONS = [
    ("AUC", "auc"),
    ("AUC retained vs clean (AUC_s / AUC_0)", "auc_retained"),
    ("ECE (15 equal-width bins)", "ece"),
    ("ECE (15 equal-mass bins)", "ece_mass"),
    ("Logloss", "logloss"),
    ("Brier score", "brier"),
    ("PCOC (Σp / Σy)", "pcoc"),
    ("Normalized entropy", "ne"),
    # field-level and bin-free calibration (ctrcal.eval.report_calibration)
    ("ECCE (bin-free cumulative calibration error)", "ecce"),
    ("ECCE / σ (its significance: > 2.5 is detectable at p < 0.05)", "ecce_sigmas"),
    ("Field-RCE, mean over fields", "field_rce_mean"),
    ("Field-RCE, worst field", "field_rce_max"),
    ("Multicalibration error (noise-weighted worst segment)", "mce"),
    ("Multicalibration error: p-value, Bonferroni-adjusted over the segments", "mce_pvalue"),
]


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


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
    rows = []
    for v in variants:
        cells = [v]
        for sh, s in points:
            hit = sub[(sub["variant"] == v) & (sub["shift"] == sh) & (sub["intensity"] == s)]
            cells.append(
                _mean_se(float(hit["mean"].iloc[0]), float(hit["se"].iloc[0]))
                if not hit.empty
                else "–"
            )
        if len(cells) > 1 and any(c != "–" for c in cells[1:]):
            rows.append(cells)
    header = ["clean" if sh == CLEAN else format_intensity(s, unit) for sh, s in points]
    return _markdown_table(["variant", *header], rows)


def _point_order(point: tuple[str, float]) -> tuple[int, float]:
    return (0 if point[0] == CLEAN else 1, float(point[1]))


@dataclass
class ReportPaths:
    """Where a report was written."""

    out_dir: Path
    results_csv: Path
    summary_json: Path
    report_md: Path
    figures: dict[str, Path] = field(default_factory=dict)

    @property
    def main_figure(self) -> Path | None:
        return next((p for k, p in self.figures.items() if k.startswith("auc_ece")), None)


def _shift_infos(meta: dict[str, Any], summary: pd.DataFrame) -> list[dict[str, Any]]:
    """One dict per shift (label, unit, ...): from meta, or inferred from the table."""
    infos = list(meta.get("shifts") or [])
    known = {i["label"] for i in infos}
    for label in dict.fromkeys(summary["shift"]):
        if label != CLEAN and label not in known:
            infos.append({"label": label, "name": label, "unit": "std", "description": ""})
    return infos


def _fmt_stds(values: Sequence[float] | None) -> str:
    if not values:
        return "n/a"
    return ", ".join(f"{float(v):.4g}" for v in values)


def _shift_paragraph(info: dict[str, Any], meta: dict[str, Any]) -> list[str]:
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
                _markdown_table(
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


def _cells(values: Sequence[float] | None, n: int) -> list[str]:
    if not values:
        return ["n/a"] * n
    return [f"{float(v):.4g}" for v in values]


def render_markdown(
    summary: pd.DataFrame,
    diffs: pd.DataFrame,
    verdict: str,
    meta: dict[str, Any],
    figures: dict[str, Path],
    out_dir: Path,
) -> str:
    """The text of report.md."""
    variants = meta["variant_names"]
    n = meta["n_seeds"]
    shifts = _shift_infos(meta, summary)
    lines = [
        "# Shift-robustness report",
        "",
        f"The {meta['split']} split ({meta['rows']:,} rows) evaluated clean and under "
        f"{len(shifts)} shift(s)"
        + (
            f"; only {100 * meta['mix_fraction']:g} % of the rows of each batch shifted, metrics "
            "on those rows"
            if meta["mix_fraction"] < 1
            else ""
        )
        + f". Variants: {', '.join(meta['variant_descriptions'])}. "
        f"{n} training seed(s) × {meta['noise_seeds']} noise seed(s); tables show mean ± "
        f"standard error over training seeds (after averaging noise seeds). Every variant "
        f"sees the same shifted rows (the noise depends on the shift's seed only). "
        f"Device: {meta['device']}; wall time {meta['elapsed']}.",
        "",
        "## Shifts",
        "",
    ]
    for info in shifts:
        lines += _shift_paragraph(info, meta)
    lines += [""]
    oracle = meta.get("oracle") or {}
    if "auc" in oracle and "logloss" in oracle:
        lines += [
            f"Synthetic data: the true click probabilities reach AUC {oracle['auc']:.4f} and "
            f"logloss {oracle['logloss']:.4f} on the clean rows, the reference no model can "
            "beat in expectation.",
            "",
        ]
    lines += _oracle_calibration_lines(meta.get("oracle_calibration"))
    lines += ["## Verdict", "", verdict, ""]
    main = next((p for k, p in figures.items() if k.startswith("auc_ece")), None)
    if main is not None:
        lines += [f"![AUC and ECE vs shift intensity]({main.name})", ""]
    present = set(summary["metric"])
    for info in shifts:
        label, unit = info["label"], info.get("unit", "std")
        lines += [f"## Shift: {label}", ""]
        for title, metric in SECTIONS:
            if metric in present:
                lines += [
                    f"### {title}",
                    "",
                    metric_table(summary, metric, variants, label, unit),
                    "",
                ]
    units = {i["label"]: i.get("unit", "std") for i in shifts}
    if not diffs.empty:
        lines += _difference_tables(diffs, meta, units)
    if present & set(UNCERTAINTY_METRICS):
        std_variants = [
            v
            for v in variants
            if not summary[(summary["variant"] == v) & (summary["metric"] == "pred_std")].empty
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
                    metric_table(summary, "std_auroc", std_variants, label, unit),
                    "",
                ]
            lines += [
                f"Mean predictive std — {label}:",
                "",
                metric_table(summary, "pred_std", std_variants, label, unit),
                "",
            ]
    if figures:
        lines += ["## Figures", ""]
        for key, path in figures.items():
            lines += [f"- [{path.name}]({path.name}): {_caption(key)}"]
        lines += [""]
    lines += ["## Metric definitions", ""]
    definitions = {**M.DEFINITIONS, **M.CALIBRATION_DEFINITIONS, **EXTRA_DEFINITIONS}
    lines += [f"- **{k}**: {v}" for k, v in definitions.items()]
    lines += [
        "- per field: `results.csv` holds `field_rce:<field>` and `field_ece:<field>` of every "
        "categorical field and bucketised numeric (report.field_numeric_buckets equal-mass "
        "buckets) at every point; segments use the clean field values of each row.",
    ]
    lines += [
        "",
        "Predicted probability p = sigmoid(logit); ECE bins the predicted *click* probability "
        "itself (not max(p, 1 − p)). Standard error = sample std over training seeds / √n.",
        "",
        f"Files: `results.csv` (every value), `summary.json`; runs under `{meta['runs_dir']}`.",
        "",
    ]
    return "\n".join(lines)


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
    }.get(kind, kind)
    return f"{text} — {shift}" if shift else text


def _difference_tables(diffs: pd.DataFrame, meta: dict[str, Any], units: dict) -> list[str]:
    base = meta["baseline"]
    alpha = meta["alpha"]
    power = meta.get("power", 0.8)

    def point(r) -> str:
        if r.shift == CLEAN:
            return "clean"
        return f"{r.shift} {format_intensity(r.intensity, units.get(r.shift, 'std'))}"

    def num(x: float, fmt: str) -> str:
        return format(x, fmt) if math.isfinite(x) else "n/a"

    fixed = (
        diffs["by_construction"].astype(bool)
        if "by_construction" in diffs
        else pd.Series(False, index=diffs.index)
    )
    prim = diffs[diffs["primary"] == True]  # noqa: E712
    expl = diffs[(diffs["primary"] != True) & ~fixed]  # noqa: E712
    m = int(np.isfinite(prim["p"].to_numpy(dtype=float)).sum())
    lines = [
        f"## Paired differences vs {base}",
        "",
        f"Δ = variant − {base} per training seed, mean ± SE over seeds; p from a two-sided "
        f"paired t-test (n − 1 degrees of freedom).",
        "",
        f"### Primary family ({m} tests, Holm-adjusted together)",
        "",
        f"✓ better / ✗ worse at p_Holm < {alpha:g}, otherwise n.s. *Detectable* is the "
        f"smallest true |Δ| this design detects with {100 * power:g} % power at α/m = "
        f"{alpha / max(m, 1):.2g} (the level the smallest p must pass under Holm), from the "
        "observed between-seed std of the paired differences.",
        "",
    ]
    rows = []
    for r in prim.itertuples():
        mark = "✓ better" if r.better is True else "✗ worse" if r.better is False else "n.s."
        rows.append(
            [
                r.variant,
                r.metric,
                point(r),
                f"{r.diff:+.4f} ± {num(r.se, '.4f')}",
                num(r.p, ".3g"),
                num(r.p_holm, ".3g"),
                num(r.detectable, ".4f"),
                mark,
            ]
        )
    header = ["variant", "metric", "point", "Δ ± SE", "p", "p_Holm", "detectable", ""]
    lines += [_markdown_table(header, rows), ""]
    if fixed.any():
        names = ", ".join(dict.fromkeys(diffs.loc[fixed, "variant"]))
        lines += [
            f"Not tested: the AUC of {names} equals {base}'s by construction (a strictly "
            "increasing recalibration of the same predictions); differences there are float "
            "round-off of ties.",
            "",
        ]
    if not expl.empty:
        hints = expl[expl["p"].astype(float) < alpha]
        lines += [
            "### Exploratory (not corrected; not findings)",
            "",
            f"{len(expl)} further comparisons (other metrics; PCOC as |PCOC − 1|), each with an "
            f"unadjusted p; {len(hints)} of them have p < {alpha:g}, listed here — about "
            f"{alpha * len(expl):.0f} would by chance alone. A hint for a new experiment, not a "
            "result; every value is in `summary.json`.",
            "",
        ]
        if not hints.empty:
            rows = [
                [
                    r.variant,
                    r.metric,
                    point(r),
                    f"{r.diff:+.4f} ± {num(r.se, '.4f')}",
                    num(r.p, ".3g"),
                ]
                for r in hints.itertuples()
            ]
            lines += [_markdown_table(["variant", "metric", "point", "Δ ± SE", "p"], rows), ""]
    return lines


# what write_report writes into a report directory (glob patterns of the names)
REPORT_OUTPUTS = ("results.csv", "summary.json", "report.md", "fig_*.png")


def write_report(
    results: pd.DataFrame,
    out_dir: str | Path,
    *,
    baseline: str | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    meta: dict[str, Any] | None = None,
    reliability: dict[str, dict[Any, dict[str, Any]]] | None = None,
    figures: bool = True,
    variants: Sequence[str] | None = None,
    same_ranking: Sequence[str] = (),
) -> ReportPaths:
    """Aggregate a results table and write results.csv, summary.json, report.md and figures.

    Args:
        results: long table with :data:`RESULT_COLUMNS` (a table without ``shift`` is read as
            one Gaussian shift plus the clean point).
        out_dir: report directory (created).
        baseline: the reference variant (default: the first variant in ``results``).
        alpha: family-wise error rate of the primary comparisons.
        power: power of the detectable-difference figures.
        meta: facts about the run shown in the report (split, rows, device, shifts, ...).
        reliability: pooled reliability-curve data ``{variant: {(shift, intensity): {...}}}``.
        figures: write PNG figures.
        variants: order of the variants in tables, figures and the verdict (default: as they
            first appear in ``results``).
        same_ranking: variants whose AUC equals the baseline's by construction (see
            :func:`~ctrcal.eval.stats.paired_differences`).
    """
    from ctrcal.eval.stats import _with_shift

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = _with_shift(results)[RESULT_COLUMNS].copy()
    present = list(dict.fromkeys(results["variant"]))
    variants = [v for v in (variants or present) if v in present]
    variants += [v for v in present if v not in variants]
    rank = {v: i for i, v in enumerate(variants)}
    results = results.sort_values("variant", key=lambda c: c.map(rank), kind="stable")
    baseline = baseline or variants[0]
    n_seeds = int(results.groupby("variant")["seed"].nunique().min())
    meta = {
        "split": "test",
        "rows": 0,
        "mix_fraction": 1.0,
        "noise_seeds": int(results["noise_seed"].nunique()),
        "device": "cpu",
        "elapsed": "n/a",
        "variant_descriptions": variants,
        "runs_dir": "runs/",
        **(meta or {}),
        "variant_names": variants,
        "n_seeds": n_seeds,
        "baseline": baseline,
        "alpha": alpha,
        "power": power,
    }
    summary = summarize(results)
    shifts = _shift_infos(meta, summary)
    units = {i["label"]: i.get("unit", "std") for i in shifts}
    diffs = paired_differences(results, baseline, alpha, power=power, same_ranking=same_ranking)
    verdict = verdict_paragraph(diffs, baseline, n_seeds, alpha, units=units, power=power)

    paths = ReportPaths(
        out_dir, out_dir / "results.csv", out_dir / "summary.json", out_dir / "report.md"
    )
    write_text_atomic(paths.results_csv, results.to_csv(index=False))
    if figures:
        paths.figures = _write_figures(summary, reliability, out_dir, variants, shifts, baseline)
    text = render_markdown(summary, diffs, verdict, meta, paths.figures, out_dir)
    write_text_atomic(paths.report_md, text)
    payload = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **meta,
        "shifts": shifts,
        "verdict": verdict,
        "summary": _records(summary),
        "paired": _records(diffs),
        "reliability": _jsonable(
            {
                v: {f"{k[0]}@{k[1]:g}" if isinstance(k, tuple) else k: c for k, c in by.items()}
                for v, by in (reliability or {}).items()
            }
        ),
        "files": {
            "results_csv": paths.results_csv.name,
            "report_md": paths.report_md.name,
            "figures": {k: p.name for k, p in paths.figures.items()},
        },
    }
    write_json_atomic(paths.summary_json, _jsonable(payload))
    return paths


_XLABEL = {
    "std": ("shift intensity (% of feature std)", 100.0),
    "p": ("replacement probability p", 1.0),
    "natural": ("clean (0) vs natural shift (1)", 1.0),
}


def _write_figures(
    summary: pd.DataFrame,
    reliability: dict[str, dict[Any, dict[str, Any]]] | None,
    out_dir: Path,
    variants: list[str],
    shifts: list[dict[str, Any]],
    baseline: str | None = None,
) -> dict[str, Path]:
    from ctrcal.eval import figures as F
    from ctrcal.eval.report_calibration import best_variant, plot_field_rce

    out: dict[str, Path] = {}
    present = set(summary["metric"])
    for info in shifts:
        label = info["label"]
        sub = _shift_frame(summary, label)
        xlabel, scale = _XLABEL.get(info.get("unit", "std"), _XLABEL["std"])
        slug = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)
        out[f"auc_ece:{label}"] = F.plot_metrics_vs_intensity(
            sub,
            ["auc", "ece"],
            out_dir / f"fig_{slug}_auc_ece.png",
            variants,
            title=f"AUC and ECE under {label} (mean ± SE over seeds)",
            xlabel=xlabel,
            x_scale=scale,
        )
        if present & {"logloss", "brier", "pcoc", "ne"}:
            out[f"calibration:{label}"] = F.plot_metrics_vs_intensity(
                sub,
                ["logloss", "brier", "pcoc", "ne"],
                out_dir / f"fig_{slug}_calibration.png",
                variants,
                xlabel=xlabel,
                x_scale=scale,
            )
        if present & {"ecce", "field_rce_mean", "mce"}:
            out[f"field_calibration:{label}"] = F.plot_metrics_vs_intensity(
                sub,
                ["ecce", "field_rce_mean", "field_rce_max", "mce"],
                out_dir / f"fig_{slug}_field_calibration.png",
                variants,
                xlabel=xlabel,
                x_scale=scale,
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
            out[f"uncertainty:{label}"] = F.plot_metrics_vs_intensity(
                sub,
                ["pred_std", "std_auroc"],
                out_dir / f"fig_{slug}_uncertainty.png",
                std_variants,
                xlabel=xlabel,
                x_scale=scale,
            )
    if reliability:
        keys: list[Any] = []
        titles: list[str] = []
        for by in reliability.values():
            for key in by:
                if key not in keys:
                    keys.append(key)
        keys.sort(key=lambda k: (k[0] != CLEAN, str(k[0]), float(k[1])))
        units = {i["label"]: i.get("unit", "std") for i in shifts}
        titles = [
            "clean" if k[0] == CLEAN else f"{k[0]} {format_intensity(k[1], units.get(k[0], 'std'))}"
            for k in keys
        ]
        out["reliability"] = F.plot_reliability(
            reliability, out_dir / "fig_reliability.png", keys, panel_titles=titles
        )
    return out


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in df.to_dict(orient="records")
    ]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return (
        f"{s // 3600}h{(s % 3600) // 60:02d}m{s % 60:02d}s"
        if s >= 3600
        else (f"{s // 60}m{s % 60:02d}s")
    )


def finish_message(paths: ReportPaths, elapsed_s: float) -> str:
    """What the CLI prints at the end: the verdict, total time, report and figure paths."""
    summary = json.loads(paths.summary_json.read_text())
    lines = ["", summary.get("verdict", ""), "", f"total time: {_fmt_seconds(elapsed_s)}"]
    lines.append(f"report: {paths.report_md}")
    if paths.main_figure is not None:
        lines.append(f"figure: {paths.main_figure}")
    return "\n".join(lines)
