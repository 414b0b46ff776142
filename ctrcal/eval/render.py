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
    "auc_retained": "AUC at this intensity divided by the clean AUC of the same run "
    "(per seed, then averaged); higher means more of the clean ranking quality survives.",
    "pred_std": "MC integration only: mean over rows of the per-row standard deviation of the "
    "click probability across the MC-sampling passes.",
    "std_auroc": "MC integration only: AUROC of the per-row predictive std at telling shifted "
    "rows (positive) from the same rows clean (negative); 0.5 = no signal.",
}


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


def metric_table(summary: pd.DataFrame, metric: str, variants: Sequence[str]) -> str:
    """Markdown table of one metric: variants × intensities, mean ± SE."""
    sub = summary[summary["metric"] == metric]
    intensities = sorted(set(sub["intensity"]))
    rows = []
    for v in variants:
        cells = [v]
        for s in intensities:
            hit = sub[(sub["variant"] == v) & (sub["intensity"] == s)]
            cells.append(
                _mean_se(float(hit["mean"].iloc[0]), float(hit["se"].iloc[0]))
                if not hit.empty
                else "–"
            )
        if len(cells) > 1 and any(c != "–" for c in cells[1:]):
            rows.append(cells)
    return _markdown_table(["variant", *[format_intensity(s) for s in intensities]], rows)


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
        return self.figures.get("auc_ece")


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
    lines = [
        "# Shift-robustness report",
        "",
        f"Gaussian noise N(0, (s·std_j)²) added to every numeric feature j of the "
        f"{meta['split']} split ({meta['rows']:,} rows; std_j = train-split std in model-input "
        f"space; missing values stay missing"
        + (
            f"; only {100 * meta['mix_fraction']:g} % of the rows of each batch shifted, metrics "
            "on those rows"
            if meta["mix_fraction"] < 1
            else ""
        )
        + f"). Variants: {', '.join(meta['variant_descriptions'])}. "
        f"{n} training seed(s) × {meta['noise_seeds']} noise seed(s); tables show mean ± "
        f"standard error over training seeds (after averaging noise seeds). "
        f"Device: {meta['device']}; wall time {meta['elapsed']}.",
        "",
    ]
    oracle = meta.get("oracle") or {}
    if "auc" in oracle and "logloss" in oracle:
        lines += [
            f"Synthetic data: the true click probabilities reach AUC {oracle['auc']:.4f} and "
            f"logloss {oracle['logloss']:.4f} on these rows, the reference no model can beat "
            "in expectation.",
            "",
        ]
    lines += [
        "## Verdict",
        "",
        verdict,
        "",
    ]
    if "auc_ece" in figures:
        lines += [f"![AUC and ECE vs shift intensity]({figures['auc_ece'].name})", ""]
    sections = [
        ("AUC", "auc"),
        ("AUC retained vs clean (AUC_s / AUC_0)", "auc_retained"),
        ("ECE (15 equal-width bins)", "ece"),
        ("ECE (15 equal-mass bins)", "ece_mass"),
        ("Logloss", "logloss"),
        ("Brier score", "brier"),
        ("PCOC (Σp / Σy)", "pcoc"),
        ("Normalized entropy", "ne"),
    ]
    present = set(summary["metric"])
    for title, metric in sections:
        if metric in present:
            lines += [f"## {title}", "", metric_table(summary, metric, variants), ""]
    if not diffs.empty:
        lines += [
            f"## Paired differences vs {meta['baseline']}",
            "",
            f"Δ = variant − {meta['baseline']} per training seed, mean ± SE over seeds; p from a "
            f"two-sided paired t-test (n − 1 degrees of freedom), p_Holm adjusted over the "
            f"intensities of each variant and metric; ✓ better / ✗ worse at p_Holm < "
            f"{meta['alpha']:g}, otherwise n.s. PCOC is compared as |PCOC − 1|.",
            "",
        ]
        rows = []
        for r in diffs.itertuples():
            mark = "✓ better" if r.better is True else "✗ worse" if r.better is False else "n.s."
            se = f"{r.se:.4f}" if math.isfinite(r.se) else "n/a"
            p = f"{r.p:.3g}" if math.isfinite(r.p) else "n/a"
            ph = f"{r.p_holm:.3g}" if math.isfinite(r.p_holm) else "n/a"
            rows.append(
                [
                    r.variant,
                    r.metric,
                    format_intensity(r.intensity),
                    f"{r.diff:+.4f} ± {se}",
                    p,
                    ph,
                    mark,
                ]
            )
        lines += [
            _markdown_table(["variant", "metric", "shift", "Δ ± SE", "p", "p_Holm", ""], rows),
            "",
        ]
    if present & set(UNCERTAINTY_METRICS):
        mc_variants = [
            v
            for v in variants
            if not summary[(summary["variant"] == v) & (summary["metric"] == "pred_std")].empty
        ]
        lines += [
            "## Predictive uncertainty (MC integration)",
            "",
            "Per-row standard deviation of the click probability across MC-sampling passes, "
            "and how well it tells shifted rows from the same rows clean (AUROC; 0.5 = no "
            "signal). The paper did not measure this.",
            "",
            "Mean predictive std:",
            "",
            metric_table(summary, "pred_std", mc_variants),
            "",
        ]
        if "std_auroc" in present:
            lines += [
                "AUROC of the std, shifted vs clean rows:",
                "",
                metric_table(summary, "std_auroc", mc_variants),
                "",
            ]
    if figures:
        lines += ["## Figures", ""]
        captions = {
            "auc_ece": "AUC and ECE vs shift intensity, mean ± SE over seeds (cf. the paper's "
            "Figure 3)",
            "calibration": "Logloss, Brier score, PCOC and normalized entropy vs shift intensity",
            "reliability": "Reliability diagrams, clean and at the strongest shift (pooled "
            "over seeds; bins with < 20 rows not drawn)",
            "uncertainty": "MC-integration predictive std and its AUROC at detecting shift",
        }
        for key, path in figures.items():
            lines += [f"- [{path.name}]({path.name}): {captions.get(key, key)}"]
        lines += [""]
    lines += ["## Metric definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in {**M.DEFINITIONS, **EXTRA_DEFINITIONS}.items()]
    lines += [
        "",
        "Predicted probability p = sigmoid(logit); ECE bins the predicted *click* probability "
        "itself (not max(p, 1 − p)). Standard error = sample std over training seeds / √n.",
        "",
        f"Files: `results.csv` (every value), `summary.json`; runs under `{meta['runs_dir']}`.",
        "",
    ]
    return "\n".join(lines)


def write_report(
    results: pd.DataFrame,
    out_dir: str | Path,
    *,
    baseline: str | None = None,
    alpha: float = 0.05,
    meta: dict[str, Any] | None = None,
    reliability: dict[str, dict[float, dict[str, Any]]] | None = None,
    figures: bool = True,
    variants: Sequence[str] | None = None,
) -> ReportPaths:
    """Aggregate a results table and write results.csv, summary.json, report.md and figures.

    Args:
        results: long table with :data:`RESULT_COLUMNS`.
        out_dir: report directory (created).
        baseline: the reference variant (default: the first variant in ``results``).
        alpha: significance level of the paired t-tests.
        meta: facts about the run shown in the report (split, rows, device, ...).
        reliability: pooled reliability-curve data ``{variant: {intensity: {...}}}``.
        figures: write PNG figures.
        variants: order of the variants in tables, figures and the verdict (default: as they
            first appear in ``results``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = results[RESULT_COLUMNS].copy()
    present = list(dict.fromkeys(results["variant"]))
    variants = [v for v in (variants or present) if v in present]
    variants += [v for v in present if v not in variants]
    rank = {v: i for i, v in enumerate(variants)}
    results = results.sort_values("variant", key=lambda c: c.map(rank), kind="stable")
    baseline = baseline or variants[0]
    intensities = sorted(set(results["intensity"].astype(float)))
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
    }
    summary = summarize(results)
    diffs = paired_differences(results, baseline, alpha)
    verdict = verdict_paragraph(diffs, baseline, intensities, n_seeds, alpha)

    paths = ReportPaths(
        out_dir, out_dir / "results.csv", out_dir / "summary.json", out_dir / "report.md"
    )
    write_text_atomic(paths.results_csv, results.to_csv(index=False))
    if figures:
        paths.figures = _write_figures(summary, reliability, out_dir, variants, intensities)
    text = render_markdown(summary, diffs, verdict, meta, paths.figures, out_dir)
    write_text_atomic(paths.report_md, text)
    payload = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **meta,
        "intensities": intensities,
        "verdict": verdict,
        "summary": _records(summary),
        "paired": _records(diffs),
        "reliability": _jsonable(reliability or {}),
        "files": {
            "results_csv": paths.results_csv.name,
            "report_md": paths.report_md.name,
            "figures": {k: p.name for k, p in paths.figures.items()},
        },
    }
    write_json_atomic(paths.summary_json, _jsonable(payload))
    return paths


def _write_figures(
    summary: pd.DataFrame,
    reliability: dict[str, dict[float, dict[str, Any]]] | None,
    out_dir: Path,
    variants: list[str],
    intensities: list[float],
) -> dict[str, Path]:
    from ctrcal.eval import figures as F

    out: dict[str, Path] = {}
    out["auc_ece"] = F.plot_metrics_vs_intensity(
        summary,
        ["auc", "ece"],
        out_dir / "fig_auc_ece.png",
        variants,
        title="AUC and ECE under Gaussian numeric shift (mean ± SE over seeds)",
    )
    out["calibration"] = F.plot_metrics_vs_intensity(
        summary,
        ["logloss", "brier", "pcoc", "ne"],
        out_dir / "fig_calibration.png",
        variants,
    )
    if reliability:
        shown = [s for s in (0.0, max(intensities)) if s in intensities]
        shown = list(dict.fromkeys(shown))
        out["reliability"] = F.plot_reliability(reliability, out_dir / "fig_reliability.png", shown)
    if "pred_std" in set(summary["metric"]):
        mc = [
            v
            for v in variants
            if not summary[(summary["variant"] == v) & (summary["metric"] == "pred_std")].empty
        ]
        out["uncertainty"] = F.plot_metrics_vs_intensity(
            summary, ["pred_std", "std_auroc"], out_dir / "fig_uncertainty.png", mc
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
