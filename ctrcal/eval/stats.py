"""Statistics of the shift report: per-seed values, mean ± SE, paired tests, the verdict.

Everything here works on the long results table (:data:`RESULT_COLUMNS`: one row per variant,
training seed, noise seed, intensity and metric), so it can be unit-tested on synthetic tables
and reused on results from elsewhere.

Values are first averaged over noise seeds within a training seed; mean and standard error
(sample std / √n) are then taken over training seeds. A variant differs significantly from the
baseline at an intensity when the two-sided paired t-test over seeds, Holm-adjusted over the
intensities of that variant and metric (several intensities are tested at once; unadjusted, one
of five tests comes out "significant" by chance far more often than ``alpha``), gives
p < ``alpha``; the verdict never claims more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "HIGHER_IS_BETTER",
    "RESULT_COLUMNS",
    "format_intensity",
    "holm",
    "paired_differences",
    "per_seed_values",
    "summarize",
    "verdict_paragraph",
]

RESULT_COLUMNS = ["variant", "seed", "noise_seed", "intensity", "metric", "value"]

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


def format_intensity(s: float) -> str:
    """0.0625 -> '6.25 %'."""
    return f"{100.0 * float(s):g} %"


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


def _intensities_with_diffs(rows: pd.DataFrame) -> str:
    """"6.25 % (Δ ...), 50 % (Δ ...)" for the comparison rows given."""
    return _join(
        [f"{format_intensity(r.intensity)} ({_fmt_diff(r._asdict())})" for r in rows.itertuples()]
    )


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
                bits.append("better at " + _intensities_with_diffs(better))
                won.append(
                    f"{label} at " + _join([format_intensity(s) for s in better["intensity"]])
                )
            if not worse.empty:
                bits.append("worse at " + _intensities_with_diffs(worse))
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
