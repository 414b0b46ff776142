"""The shift-robustness report: variants × training seeds × noise seeds × shift intensities.

The protocol of the MC-LayerNorm paper's Criteo experiment (its Figure 3), on any prepared
data directory:

1. train every variant that owns its runs (``from_variant`` unset) once per training seed
   ``train.seed + k`` (k < ``report.seeds``), reusing finished runs under
   ``OUT/runs/<variant>/seed<k>``; LayerNorm and MC-LayerNorm runs of the same k share the
   seed, so they are compared *paired by seed*;
2. for each variant (a variant with ``from_variant`` reuses that variant's runs and changes only
   how it predicts: MC integration with ``mc_samples`` passes, temperature or Platt scaling fit
   on clean validation predictions), each seed, each noise seed and each intensity, evaluate
   the test split with :class:`~ctrcal.eval.shift.GaussianShift` applied batch by batch
   (intensity 0 is evaluated once per seed: there is no noise to re-draw);
3. write ``results.csv`` (long: variant, seed, noise_seed, intensity, metric, value),
   ``summary.json``, ``report.md`` (tables of mean ± standard error over seeds, AUC retained vs
   clean, paired differences vs the baseline with a t-test, the verdict, metric definitions)
   and PNG figures.

Statistics: values are first averaged over noise seeds within a training seed; mean and
standard error (sample std / √n) are then taken over training seeds. A variant differs
significantly from the baseline at an intensity when the two-sided paired t-test over seeds,
Holm-adjusted over the intensities of that variant and metric (several intensities are tested
at once; unadjusted, one of five tests comes out "significant" by chance far more often than
``alpha``), gives p < ``report.alpha``; the verdict never claims more.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.config import Config, VariantConfig, config_to_dict
from ctrcal.errors import ConfigError, CtrcalError, DataError
from ctrcal.eval import metrics as M
from ctrcal.utils import write_json_atomic, write_text_atomic

__all__ = [
    "ReportPaths",
    "format_intensity",
    "paired_differences",
    "per_seed_values",
    "plan_variants",
    "render_markdown",
    "run_shift_report",
    "summarize",
    "verdict_paragraph",
    "write_report",
]

# direction of "better" for the paired comparison; PCOC is compared through |PCOC − 1|
HIGHER_IS_BETTER: dict[str, bool] = {
    "auc": True,
    "auc_retained": True,
    "ece": False,
    "ece_mass": False,
    "logloss": False,
    "brier": False,
    "ne": False,
    "pcoc_error": False,
}
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
RESULT_COLUMNS = ["variant", "seed", "noise_seed", "intensity", "metric", "value"]


def format_intensity(s: float) -> str:
    """0.0625 -> '6.25 %'."""
    return f"{100.0 * float(s):g} %"


# ---------------------------------------------------------------------------------------------
# Plan


@dataclass(frozen=True)
class VariantPlan:
    """A variant resolved against the config: whose runs it uses and how it predicts."""

    name: str
    run_variant: str  # the variant whose trained runs this one evaluates
    config: VariantConfig
    mc_samples: int
    calibration: str | None  # None | "temperature" | "platt"

    @property
    def trains(self) -> bool:
        return self.run_variant == self.name


def plan_variants(cfg: Config, source: str = "config") -> list[VariantPlan]:
    """Resolve ``cfg.report.variants`` (``from_variant`` chains, calibration) or raise.

    Raises:
        ConfigError: naming ``report.variants[i]`` and what is wrong.
    """
    variants = cfg.report.variants
    if not variants:
        raise ConfigError(f"{source}: report.variants: at least one variant is needed")
    by_name = {v.name: v for v in variants}
    if len(by_name) != len(variants):
        names = [v.name for v in variants]
        raise ConfigError(f"{source}: report.variants: variant names must be unique, got {names}")
    plans = []
    for i, v in enumerate(variants):
        key = f"{source}: report.variants[{i}]"
        if not v.name or "/" in v.name or v.name.startswith("."):
            raise ConfigError(f"{key}.name: {v.name!r} is not usable as a directory name")
        if v.mc_samples < 0 or v.mc_samples == 1:
            raise ConfigError(f"{key}.mc_samples: expected 0 (off) or >= 2, got {v.mc_samples}")
        if v.temperature_scaling and v.platt_scaling:
            raise ConfigError(f"{key}: choose temperature_scaling or platt_scaling, not both")
        root, seen = v, {v.name}
        while root.from_variant is not None:
            if root.from_variant not in by_name:
                raise ConfigError(
                    f"{key}.from_variant: unknown variant {root.from_variant!r} "
                    f"(valid: {', '.join(by_name)})"
                )
            root = by_name[root.from_variant]
            if root.name in seen:
                raise ConfigError(f"{key}.from_variant: variants refer to each other in a cycle")
            seen.add(root.name)
        calibration = (
            "temperature" if v.temperature_scaling else "platt" if v.platt_scaling else None
        )
        plans.append(VariantPlan(v.name, root.name, v, v.mc_samples, calibration))
    baseline = cfg.report.baseline
    if baseline is not None and baseline not in by_name:
        raise ConfigError(
            f"{source}: report.baseline: unknown variant {baseline!r} (valid: {', '.join(by_name)})"
        )
    r = cfg.report
    if r.seeds < 1:
        raise ConfigError(f"{source}: report.seeds: expected >= 1, got {r.seeds}")
    if r.noise_seeds < 1:
        raise ConfigError(f"{source}: report.noise_seeds: expected >= 1, got {r.noise_seeds}")
    if not r.intensities or any((not math.isfinite(s)) or s < 0 for s in r.intensities):
        raise ConfigError(
            f"{source}: report.intensities: expected non-negative numbers, got {r.intensities}"
        )
    if not 0.0 < r.mix_fraction <= 1.0:
        raise ConfigError(f"{source}: report.mix_fraction: expected (0, 1], got {r.mix_fraction}")
    if not 0.0 < r.alpha < 1.0:
        raise ConfigError(f"{source}: report.alpha: expected (0, 1), got {r.alpha}")
    if r.ece_bins < 1:
        raise ConfigError(f"{source}: report.ece_bins: expected >= 1, got {r.ece_bins}")
    return plans


def variant_train_config(cfg: Config, plan: VariantPlan, k: int) -> Config:
    """The training config of variant ``plan`` for seed index ``k``."""
    out = copy.deepcopy(cfg)
    out.model = dataclasses.replace(out.model, net_norm=plan.config.net_norm)
    if plan.config.emb_norm is not None:
        out.model = dataclasses.replace(out.model, emb_norm=plan.config.emb_norm)
    out.train = dataclasses.replace(out.train, seed=cfg.train.seed + k)
    return out


# ---------------------------------------------------------------------------------------------
# Aggregation (pure pandas; unit-testable on synthetic result tables)


def per_seed_values(results: pd.DataFrame) -> pd.DataFrame:
    """Average over noise seeds and add derived metrics, one value per (variant, seed, s, metric).

    Adds ``auc_retained`` (AUC_s / AUC_0 of the same variant and seed) and ``pcoc_error``
    (|PCOC − 1|).

    Args:
        results: long table with :data:`RESULT_COLUMNS`.

    Returns:
        columns ``variant, seed, intensity, metric, value``.
    """
    missing = set(RESULT_COLUMNS) - set(results.columns)
    if missing:
        raise ValueError(f"results lack columns {sorted(missing)}")
    ps = results.groupby(["variant", "seed", "intensity", "metric"], as_index=False, sort=False)[
        "value"
    ].mean()
    extra = []
    auc = ps[ps["metric"] == "auc"]
    clean = auc[auc["intensity"] == 0.0][["variant", "seed", "value"]].rename(
        columns={"value": "clean"}
    )
    if not clean.empty:
        ret = auc.merge(clean, on=["variant", "seed"])
        ret = ret.assign(metric="auc_retained", value=ret["value"] / ret["clean"])
        extra.append(ret[["variant", "seed", "intensity", "metric", "value"]])
    pc = ps[ps["metric"] == "pcoc"]
    if not pc.empty:
        extra.append(pc.assign(metric="pcoc_error", value=(pc["value"] - 1.0).abs()))
    return pd.concat([ps, *extra], ignore_index=True) if extra else ps


def _se(values: pd.Series) -> float:
    n = values.count()
    return float(values.std(ddof=1) / math.sqrt(n)) if n >= 2 else float("nan")


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard error over training seeds.

    Returns:
        columns ``variant, intensity, metric, mean, se, n`` (se NaN with a single seed).
    """
    ps = per_seed_values(results)
    grouped = ps.groupby(["variant", "intensity", "metric"], sort=False)["value"]
    out = grouped.agg(mean="mean", n="count").reset_index()
    out["se"] = grouped.agg(_se).to_numpy()
    return out[["variant", "intensity", "metric", "mean", "se", "n"]]


def _t_pvalue(t: float, dof: int) -> float:
    from scipy import stats  # scipy comes with scikit-learn

    return float(2.0 * stats.t.sf(abs(t), dof))


def paired_differences(
    results: pd.DataFrame,
    baseline: str,
    alpha: float = 0.05,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Variant − baseline per training seed, with a two-sided paired t-test over seeds.

    Args:
        results: long table with :data:`RESULT_COLUMNS`.
        baseline: the variant everything is compared with.
        alpha: significance level of the test.
        metrics: which metrics (default: every one in :data:`HIGHER_IS_BETTER`).

    Returns:
        columns ``variant, baseline, metric, intensity, n, diff, se, t, p, p_holm,
        significant, better`` where ``diff`` is the mean of per-seed differences, ``se`` its
        standard error, ``p`` the paired t-test's, ``p_holm`` that p Holm-adjusted over the
        intensities of the same variant and metric, ``significant`` means p_holm < alpha
        (needs n ≥ 2), and ``better`` is True/False for a significant improvement /
        deterioration of the variant and None otherwise.
    """
    ps = per_seed_values(results)
    metrics = list(metrics) if metrics is not None else list(HIGHER_IS_BETTER)
    base = ps[(ps["variant"] == baseline) & ps["metric"].isin(metrics)]
    rows = []
    for variant in dict.fromkeys(ps["variant"]):
        if variant == baseline:
            continue
        other = ps[(ps["variant"] == variant) & ps["metric"].isin(metrics)]
        merged = other.merge(base, on=["seed", "intensity", "metric"], suffixes=("", "_b"))
        for (metric, intensity), grp in merged.groupby(["metric", "intensity"], sort=False):
            if metric == "auc_retained" and intensity == 0.0:
                continue  # 1 by definition
            d = (grp["value"] - grp["value_b"]).dropna().to_numpy(dtype=float)
            n = d.size
            if n == 0:
                continue
            diff = float(d.mean())
            se = float(d.std(ddof=1) / math.sqrt(n)) if n >= 2 else float("nan")
            if n < 2:
                t, p = float("nan"), float("nan")
            elif se == 0.0:
                t = math.copysign(math.inf, diff) if diff != 0 else float("nan")
                p = 0.0 if diff != 0 else 1.0
            else:
                t = diff / se
                p = _t_pvalue(t, n - 1)
            rows.append(
                {
                    "variant": variant,
                    "baseline": baseline,
                    "metric": metric,
                    "intensity": float(intensity),
                    "n": n,
                    "diff": diff,
                    "se": se,
                    "t": t,
                    "p": p,
                    "p_holm": float("nan"),
                    "significant": False,
                    "better": None,
                }
            )
    cols = ["variant", "baseline", "metric", "intensity", "n", "diff", "se", "t", "p", "p_holm"]
    out = pd.DataFrame(rows, columns=[*cols, "significant", "better"])
    if not out.empty:
        # Holm-adjust within each (variant, metric) family: one test per intensity
        for _, idx in out.groupby(["variant", "metric"], sort=False).groups.items():
            out.loc[idx, "p_holm"] = holm(out.loc[idx, "p"].to_numpy(dtype=float))
        out["significant"] = out["p_holm"] < alpha
        direction = out["metric"].map(lambda m: HIGHER_IS_BETTER.get(m, True))
        out["better"] = [
            ((d > 0) == up) if sig else None
            for d, up, sig in zip(out["diff"], direction, out["significant"], strict=True)
        ]
    if not out.empty:
        order = {m: i for i, m in enumerate(metrics)}
        rank = {v: i for i, v in enumerate(dict.fromkeys(ps["variant"]))}
        keys = {"metric": order, "variant": rank}
        out = out.sort_values(
            ["variant", "metric", "intensity"],
            key=lambda c: c.map(keys[c.name]) if c.name in keys else c,
            kind="stable",
        ).reset_index(drop=True)
    return out


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN), controlling the family-wise error."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adj
    return out


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _fmt_diff(row: Any, digits: int = 4) -> str:
    se = "n/a" if not math.isfinite(row["se"]) else f"{row['se']:.{digits}f}"
    p = "n/a" if not math.isfinite(row["p"]) else f"{row['p']:.2g}"
    ph = row.get("p_holm", float("nan"))
    ph = "n/a" if not math.isfinite(ph) else f"{ph:.2g}"
    return f"Δ {row['diff']:+.{digits}f} ± {se}, p = {p}, p_Holm = {ph}"


def verdict_paragraph(
    diffs: pd.DataFrame,
    baseline: str,
    intensities: Sequence[float],
    n_seeds: int,
    alpha: float = 0.05,
    metrics: Sequence[str] = ("auc", "ece"),
) -> str:
    """One paragraph that says, per variant and intensity, whether it beat the baseline.

    A statement of "better" or "worse" is made only for significant paired differences
    (Holm-adjusted p < alpha); everything else is reported as no significant difference.
    """
    names = {"auc": "AUC", "ece": "ECE", "logloss": "logloss", "brier": "Brier"}
    head = (
        f"Compared with {baseline}, paired by training seed (n = {n_seeds} seeds; Δ = variant − "
        f"{baseline}, mean ± standard error over seeds; a difference counts only when a "
        f"two-sided paired t-test, Holm-adjusted over the {len(intensities)} intensities, gives "
        f"p < {alpha:g}):"
    )
    if n_seeds < 2:
        return (
            f"{head} with a single training seed there is no standard error, so no variant can "
            "be said to beat the baseline at any intensity."
        )
    sentences = [head]
    summary_bits = []
    all_s = [float(s) for s in intensities]
    for variant in dict.fromkeys(diffs["variant"]):
        parts = []
        won: list[str] = []
        for metric in metrics:
            sub = diffs[(diffs["variant"] == variant) & (diffs["metric"] == metric)]
            if sub.empty:
                continue
            better = sub[sub["better"] == True]  # noqa: E712 - object column with None
            worse = sub[sub["better"] == False]  # noqa: E712
            label = names.get(metric, metric)
            if bool((sub["diff"] == 0).all() & (sub["se"].fillna(0) == 0).all()):
                parts.append(f"{label}: identical at every intensity")
                continue
            bits = []
            if not better.empty:
                bits.append(
                    "better at "
                    + _join(
                        [
                            f"{format_intensity(r.intensity)} ({_fmt_diff(r._asdict())})"
                            for r in better.itertuples()
                        ]
                    )
                )
                won.append(
                    f"{label} at " + _join([format_intensity(s) for s in better["intensity"]])
                )
            if not worse.empty:
                bits.append(
                    "worse at "
                    + _join(
                        [
                            f"{format_intensity(r.intensity)} ({_fmt_diff(r._asdict())})"
                            for r in worse.itertuples()
                        ]
                    )
                )
            rest = [s for s in all_s if s not in set(better["intensity"]) | set(worse["intensity"])]
            rest = [s for s in rest if s in set(sub["intensity"])]
            if rest:
                where = (
                    "at any intensity"
                    if len(rest) == len(sub) and len(rest) > 1
                    else "at " + _join([format_intensity(s) for s in rest])
                )
                largest = sub[sub["intensity"].isin(rest)].iloc[
                    int(np.argmax(np.abs(sub[sub["intensity"].isin(rest)]["diff"].to_numpy())))
                ]
                bits.append(
                    f"no significant difference {where} (largest: {_fmt_diff(largest)} at "
                    f"{format_intensity(largest['intensity'])})"
                )
            parts.append(f"{label}: " + "; ".join(bits))
        if parts:
            sentences.append(f"**{variant}** — " + ". ".join(parts) + ".")
            summary_bits.append(
                f"{variant} beat {baseline} on " + _join(won)
                if won
                else f"{variant} did not significantly beat {baseline} on "
                + " or ".join(names.get(m, m) for m in metrics)
                + " at any intensity"
            )
    if summary_bits:
        sentences.append("In short: " + "; ".join(summary_bits) + ".")
    if n_seeds < 5:
        sentences.append(
            f"With {n_seeds} seeds the test detects only large, consistent differences; "
            "'no significant difference' is not evidence that the variants are equal."
        )
    return " ".join(sentences)


# ---------------------------------------------------------------------------------------------
# Rendering


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


# ---------------------------------------------------------------------------------------------
# Running the protocol


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return (
        f"{s // 3600}h{(s % 3600) // 60:02d}m{s % 60:02d}s"
        if s >= 3600
        else (f"{s // 60}m{s % 60:02d}s")
    )


# keys of the train section that do not change what a run learns
_RUNTIME_KEYS = {"progress", "device", "num_threads", "data_mode", "compile", "eval_batch_size"}


def _run_signature(cfg: Config | dict[str, Any]) -> dict[str, Any]:
    d = cfg if isinstance(cfg, dict) else config_to_dict(cfg)
    data = {k: v for k, v in (d.get("data") or {}).items() if k != "prepared_dir"}
    train = {k: v for k, v in (d.get("train") or {}).items() if k not in _RUNTIME_KEYS}
    return {"data": data, "features": d.get("features"), "model": d.get("model"), "train": train}


def _saved_signature(run_dir: Path) -> dict[str, Any] | None:
    import yaml

    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    try:
        from ctrcal.config import config_from_dict

        saved = yaml.safe_load(path.read_text()) or {}
        # through the dataclasses, so defaults added since the run was written compare equal
        return _run_signature(config_from_dict(saved, str(path)))
    except (CtrcalError, yaml.YAMLError, TypeError):
        return None


def _data_identity(data_dir: Path) -> Any:
    try:
        fm = json.loads((data_dir / "feature_map.json").read_text())
    except (OSError, ValueError):
        return None
    return fm.get("source_hash")


def _run_data_identity(run_dir: Path) -> Any:
    try:
        return json.loads((run_dir / "data.json").read_text()).get("source_hash")
    except (OSError, ValueError, AttributeError):
        return None


def ensure_run(cfg: Config, data_dir: Path, run_dir: Path, log: Callable[[str], None] = _log):
    """Train ``cfg`` into ``run_dir`` unless a run with the same config and data is there.

    A finished run is reused, an interrupted one resumed; a run with a different config or
    trained on different data is deleted and trained again (``run_dir`` belongs to the
    report).

    Returns:
        ``"reused"``, ``"resumed"`` or ``"trained"``.
    """
    from ctrcal.train.trainer import train

    finished = (run_dir / "result.json").exists()
    started = (run_dir / "checkpoints" / "last.pt").exists()
    same = (
        _saved_signature(run_dir) == _run_signature(cfg)
        and _run_data_identity(run_dir) == _data_identity(data_dir)
    )
    if finished and same:
        return "reused"
    if started and same:
        train(cfg, data_dir, run_dir, resume=True)
        return "resumed"
    if run_dir.exists():
        if finished or started:
            log(f"{run_dir}: trained with another config or data; training it again")
        shutil.rmtree(run_dir)
    train(cfg, data_dir, run_dir)
    return "trained"


@dataclass
class _Prediction:
    probs: np.ndarray  # [n] float64
    logits: np.ndarray | None  # [n] float64 (None for MC integration)
    std: np.ndarray | None  # [n] per-row predictive std (MC integration)
    rows: np.ndarray  # [n] bool, True = shifted


def _predict(model, data, *, batch_size, device, shift, mc_samples) -> _Prediction:
    """Predictions on a split, the shift applied per batch where the batch lives."""
    import torch

    from ctrcal.train.predict import iter_batches, predict_logits

    masks: list[torch.Tensor] = []

    def transform(numeric: torch.Tensor) -> torch.Tensor:
        out, rows = shift.apply(numeric)
        masks.append(rows.cpu())
        return out

    hook = transform if shift is not None else None
    if mc_samples > 0:
        from ctrcal.layers.mc_layernorm import mc_predict

        means, stds = [], []
        with torch.no_grad():
            for batch in iter_batches(data, batch_size):
                numeric = batch.numeric if hook is None else hook(batch.numeric)
                mean, std = mc_predict(
                    model,
                    batch.categorical.to(device),
                    numeric.to(device),
                    n_samples=mc_samples,
                    max_rows=4 * batch_size,
                )
                means.append(mean.double().cpu())
                stds.append(std.double().cpu())
        probs = torch.cat(means).numpy()
        std = torch.cat(stds).numpy()
        logits = None
    else:
        z = predict_logits(model, data, batch_size, device, transform=hook)
        logits = z.detach().double().cpu().numpy()
        probs = 1.0 / (1.0 + np.exp(-logits))
        std = None
    n = probs.shape[0]
    rows = torch.cat(masks).numpy() if masks else np.ones(n, dtype=bool)
    if rows.shape[0] != n:
        raise RuntimeError(f"shift saw {rows.shape[0]} rows but {n} predictions came back")
    return _Prediction(probs, logits, std, rows)


def _labels(data, batch_size: int) -> np.ndarray:
    import torch

    from ctrcal.train.predict import iter_batches

    parts = [b.label.detach().double().cpu() for b in iter_batches(data, batch_size)]
    return torch.cat(parts).numpy()


def _calibrated(pred: _Prediction, scaler) -> np.ndarray:
    from ctrcal.eval.calibration import logit

    z = pred.logits if pred.logits is not None else logit(pred.probs)
    return np.asarray(scaler.predict_proba(z), dtype=np.float64)


def _data_mode(cfg: Config, device) -> str:
    mode = cfg.train.data_mode
    if mode == "auto":
        return "device" if getattr(device, "type", "cpu") == "cuda" else "memory"
    return mode


def _describe_variant(plan: VariantPlan) -> str:
    spec = plan.config.net_norm
    norm = spec.name + (
        "(" + ", ".join(f"{k}={v}" for k, v in spec.kwargs.items()) + ")" if spec.kwargs else ""
    )
    bits = [norm if plan.trains else f"runs of {plan.run_variant}"]
    if plan.mc_samples:
        bits.append(f"MC integration, {plan.mc_samples} passes")
    elif plan.trains:
        bits.append("one-shot")
    if plan.calibration:
        bits.append(f"{plan.calibration} scaling on clean validation")
    return f"{plan.name} ({'; '.join(bits)})"


def run_shift_report(
    cfg: Config,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    *,
    seeds: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = _log,
    source: str = "config",
) -> ReportPaths:
    """Train what is missing, evaluate the grid and write the report.

    Args:
        cfg: the whole config (``report`` section drives the protocol).
        out_dir: report directory; runs go to ``out_dir/runs/<variant>/seed<k>``.
        data_dir: prepared data; default ``cfg.data.prepared_dir`` or, with neither, data
            prepared from ``cfg.data`` into ``out_dir/data``.
        seeds: override ``cfg.report.seeds``.
        progress: show a progress bar over the evaluation grid.
        log: where progress lines go (stderr by default).
        source: the config's file name, for error messages.

    Returns:
        The paths written (report.md, results.csv, summary.json, figures).
    """
    import torch
    from tqdm.auto import tqdm

    from ctrcal.eval.calibration import PlattScaling, TemperatureScaling, logit
    from ctrcal.eval.shift import GaussianShift
    from ctrcal.utils import resolve_device, seed_everything

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    if seeds is not None:
        cfg = copy.deepcopy(cfg)
        cfg.report.seeds = int(seeds)
    plans = plan_variants(cfg, source)
    r = cfg.report
    if data_dir is None and cfg.data.prepared_dir:
        data_dir = Path(cfg.data.prepared_dir)
    if data_dir is None:
        from ctrcal.data.prepare import prepare_from_config

        data_dir = prepare_from_config(cfg, out_dir / "data")
    data_dir = Path(data_dir)
    if not (data_dir / "feature_map.json").is_file():
        raise DataError(
            f"{data_dir}: not a prepared data directory (no feature_map.json); "
            "prepare it with 'ctrcal prepare' or leave out --data"
        )
    runs_dir = out_dir / "runs"

    # 1. training (reusing finished runs)
    t_train = time.perf_counter()
    trained = [p for p in plans if p.trains]
    for plan in trained:
        for k in range(r.seeds):
            run_dir = runs_dir / plan.name / f"seed{k}"
            vcfg = variant_train_config(cfg, plan, k)
            log(f"[{plan.name} seed {k} (train.seed={vcfg.train.seed})] {run_dir}")
            status = ensure_run(vcfg, data_dir, run_dir, log)
            log(f"[{plan.name} seed {k}] {status}")
    train_s = time.perf_counter() - t_train

    # 2. evaluation grid
    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.train.trainer import load_run

    device = resolve_device(cfg.train.device)
    mode = _data_mode(cfg, device)
    test = ParquetCTRData(data_dir, r.split, mode=mode, device=device if mode == "device" else None)
    bs = cfg.train.eval_batch_size
    labels = _labels(test, bs)
    needs_valid = any(p.calibration for p in plans)
    valid = valid_labels = None
    if needs_valid:
        valid = ParquetCTRData(
            data_dir, "valid", mode=mode, device=device if mode == "device" else None
        )
        valid_labels = _labels(valid, bs)
    std = np.asarray(test.feature_map.numeric_std, dtype=np.float64)
    shifted_levels = [float(s) for s in r.intensities if s > 0]
    has_clean = any(s == 0 for s in r.intensities)
    max_s = max(float(s) for s in r.intensities)
    per_seed = (1 if has_clean else 0) + len(shifted_levels) * r.noise_seeds
    total = len(plans) * r.seeds * per_seed
    rows: list[dict[str, Any]] = []
    reliability: dict[str, dict[float, dict[str, Any]]] = {p.name: {} for p in plans}
    bar = tqdm(total=total, desc="shift report", unit="eval", disable=not progress, file=sys.stderr)
    t_eval = time.perf_counter()

    def record(variant, k, noise_seed, s, values):
        for metric, value in values.items():
            rows.append(
                {
                    "variant": variant,
                    "seed": k,
                    "noise_seed": noise_seed,
                    "intensity": s,
                    "metric": metric,
                    "value": float(value),
                }
            )

    def accumulate(variant, s, probs, y):
        curve = M.reliability_curve(probs, y, n_bins=r.ece_bins)
        acc = reliability[variant].setdefault(
            s,
            {
                "counts": np.zeros_like(curve.counts),
                "sum_p": np.zeros_like(curve.counts),
                "sum_y": np.zeros_like(curve.counts),
                "edges": curve.edges,
            },
        )
        acc["counts"] += curve.counts
        acc["sum_p"] += np.nan_to_num(curve.mean_prob) * curve.counts
        acc["sum_y"] += np.nan_to_num(curve.frac_pos) * curve.counts

    by_run: dict[str, list[VariantPlan]] = {}
    for plan in plans:
        by_run.setdefault(plan.run_variant, []).append(plan)
    for run_variant, group in by_run.items():
        for k in range(r.seeds):
            run_dir = runs_dir / run_variant / f"seed{k}"
            model, _, _ = load_run(run_dir)
            model = model.to(device).eval()
            for plan in group:
                bar.set_postfix_str(f"{plan.name} seed {k}")
                scaler = None
                if plan.calibration:
                    seed_everything(7919 * (k + 1))
                    vpred = _predict(
                        model,
                        valid,
                        batch_size=bs,
                        device=device,
                        shift=None,
                        mc_samples=plan.mc_samples,
                    )
                    z = vpred.logits if vpred.logits is not None else logit(vpred.probs)
                    scaler = (
                        TemperatureScaling()
                        if plan.calibration == "temperature"
                        else PlattScaling()
                    ).fit(z, valid_labels)
                clean_std = None
                grid = ([(0, 0.0)] if has_clean else []) + [
                    (ns, s) for ns in range(r.noise_seeds) for s in shifted_levels
                ]
                for noise_seed, s in grid:
                    seed_everything(1_000_003 * (k + 1) + 1009 * noise_seed + int(s * 1e6))
                    shift = (
                        GaussianShift(std, s, seed=noise_seed, mix_fraction=r.mix_fraction)
                        if s > 0
                        else None
                    )
                    if s > 0 and r.mix_fraction >= 1.0 and plan.mc_samples and clean_std is None:
                        # the AUROC of std pools shifted rows with the same rows clean
                        clean_std = _predict(
                            model,
                            test,
                            batch_size=bs,
                            device=device,
                            shift=None,
                            mc_samples=plan.mc_samples,
                        ).std
                    pred = _predict(
                        model,
                        test,
                        batch_size=bs,
                        device=device,
                        shift=shift,
                        mc_samples=plan.mc_samples,
                    )
                    probs = _calibrated(pred, scaler) if scaler is not None else pred.probs
                    sel = pred.rows if s > 0 else np.ones_like(pred.rows)
                    values = M.compute_all(probs[sel], labels[sel], n_bins=r.ece_bins)
                    if pred.std is not None:
                        values["pred_std"] = float(pred.std[sel].mean())
                        if s == 0:
                            clean_std = pred.std
                        elif r.mix_fraction < 1.0:
                            values["std_auroc"] = M.auc(pred.std, pred.rows.astype(np.float64))
                        elif clean_std is not None:
                            values["std_auroc"] = M.auc(
                                np.concatenate([clean_std, pred.std]),
                                np.concatenate([np.zeros(len(clean_std)), np.ones(len(pred.std))]),
                            )
                    record(plan.name, k, noise_seed, s, values)
                    if noise_seed == 0 and s in (0.0, max_s):
                        accumulate(plan.name, s, probs[sel], labels[sel])
                    bar.update(1)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    bar.close()
    eval_s = time.perf_counter() - t_eval

    results = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    curves = {
        v: {
            s: {
                "edges": a["edges"],
                "counts": a["counts"],
                "mean_prob": np.where(
                    a["counts"] > 0, a["sum_p"] / np.maximum(a["counts"], 1), np.nan
                ),
                "frac_pos": np.where(
                    a["counts"] > 0, a["sum_y"] / np.maximum(a["counts"], 1), np.nan
                ),
            }
            for s, a in by_s.items()
        }
        for v, by_s in reliability.items()
    }
    total_s = time.perf_counter() - t_start
    meta = {
        "split": r.split,
        "rows": int(labels.shape[0]),
        "mix_fraction": r.mix_fraction,
        "noise_seeds": r.noise_seeds,
        "device": str(device),
        "elapsed": f"{_fmt_seconds(total_s)} (training {_fmt_seconds(train_s)}, evaluation "
        f"{_fmt_seconds(eval_s)})",
        "variant_descriptions": [_describe_variant(p) for p in plans],
        "runs_dir": str(runs_dir),
        "data_dir": str(data_dir),
        "train_seeds": [cfg.train.seed + k for k in range(r.seeds)],
        "timing_s": {"train": train_s, "eval": eval_s, "total": total_s},
        "config": config_to_dict(cfg),
    }
    paths = write_report(
        results,
        out_dir,
        baseline=r.baseline or plans[0].name,
        alpha=r.alpha,
        meta=meta,
        reliability=curves,
        figures=r.figures,
        variants=[p.name for p in plans],
    )
    log(f"shift report: {total} evaluations, total time {_fmt_seconds(total_s)}")
    return paths


def finish_message(paths: ReportPaths, elapsed_s: float) -> str:
    """What the CLI prints at the end: the verdict, total time, report and figure paths."""
    summary = json.loads(paths.summary_json.read_text())
    lines = ["", summary.get("verdict", ""), "", f"total time: {_fmt_seconds(elapsed_s)}"]
    lines.append(f"report: {paths.report_md}")
    if paths.main_figure is not None:
        lines.append(f"figure: {paths.main_figure}")
    return "\n".join(lines)
