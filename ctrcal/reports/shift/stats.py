"""Statistics of the shift report: per-seed values, mean ± SE, paired tests, power (numbers only).

Everything here works on the long results table (:data:`RESULT_COLUMNS`: one row per variant,
shift, training seed, noise seed, intensity and metric), so it can be unit-tested on synthetic
tables and reused on results from elsewhere. The clean evaluation (no shift) is stored once per
variant and seed under the shift name :data:`CLEAN` at intensity 0.

Values are first averaged over noise seeds within a training seed; mean and standard error
(sample std / √n) are then taken over training seeds. Each variant is compared with the
baseline by a two-sided paired t-test over training seeds.

**Primary family.** Every (variant vs baseline) × {AUC, ECE} × intensity × shift comparison
(the clean point included once) is one family, Holm-adjusted together: the chance that *any*
of them comes out "significant" when nothing differs stays below ``alpha``, however many
variants, shifts and intensities the report has. Only these comparisons can enter the verdict
(:mod:`ctrcal.reports.shift.verdict` writes it; this module writes no prose).
Every other comparison (logloss, Brier, ...) is **exploratory**: its p-value is shown
unadjusted and never counts as a finding.

**Power.** For each primary comparison :func:`detectable_difference` gives the smallest true
difference the design would detect with probability ``power`` (80 %) at the level the smallest
p-value of the family has to pass under Holm (alpha / m), from the observed between-seed std of
the paired differences: "no significant difference" comes with "and differences smaller than
X could not have been seen".

:func:`summarize_report` gathers all of it in one typed :class:`Summary`, the input of the
rendering (:mod:`ctrcal.reports.shift.render`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ctrcal.metrics import METRICS, holm, metrics_in

__all__ = [
    "CLEAN",
    "PRIMARY_METRICS",
    "RESULT_COLUMNS",
    "Summary",
    "detectable_difference",
    "format_intensity",
    "paired_differences",
    "per_seed_values",
    "seeds_needed",
    "summarize",
    "summarize_report",
    "with_shift",
    "within_range",
]

RESULT_COLUMNS = ["variant", "shift", "seed", "noise_seed", "intensity", "metric", "value"]
CLEAN = "clean"
PRIMARY_METRICS = ("auc", "ece")

# metrics a strictly increasing map of the predictions cannot change
_RANK_METRICS = frozenset({"auc", "auc_retained"})

_KEY = ["variant", "shift", "seed", "intensity", "metric"]


def within_range(metric: str, difference: float) -> bool:
    """Whether ``|difference|`` is a difference ``metric`` can show at all: finite and no
    larger than the width of the values it can take (its declared ``bounds``: a true
    difference can be no larger, so a detectable difference beyond it is no difference at
    all); any finite value for an unbounded metric."""
    if not math.isfinite(difference):
        return False
    found = METRICS.find(metric)
    low, high = found.bounds if found is not None and found.bounds else (-math.inf, math.inf)
    return abs(difference) <= high - low


def format_intensity(s: float, unit: str = "std") -> str:
    """0.0625 -> '6.25 %'; with unit 'p': 'probability 0.2' (a level, so never written as
    'p = ...', which a reader of a table of tests takes for a p-value); 'natural' for a
    natural shift."""
    if unit == "p":
        return f"probability {float(s):g}"
    if unit == "natural":
        return "natural"
    return f"{100.0 * float(s):g} %"


def with_shift(results: pd.DataFrame) -> pd.DataFrame:
    """Tables without a shift column (older results) are one Gaussian shift plus clean."""
    missing = set(RESULT_COLUMNS) - {"shift"} - set(results.columns)
    if missing:
        raise ValueError(f"results lack columns {sorted(missing)}")
    if "shift" in results.columns and results["shift"].notna().all():
        return results
    shift = np.where(results["intensity"].astype(float) == 0.0, CLEAN, "gaussian_numeric")
    if "shift" in results.columns:
        shift = results["shift"].where(results["shift"].notna(), pd.Series(shift, results.index))
    return results.assign(shift=shift)


def per_seed_values(results: pd.DataFrame) -> pd.DataFrame:
    """Average over noise seeds and add derived metrics, one value per (variant, shift, seed, s).

    Adds ``auc_retained`` (AUC at the point / the clean AUC of the same variant and seed) and
    ``pcoc_error`` (|PCOC − 1|).

    Args:
        results: long table with :data:`RESULT_COLUMNS`.

    Returns:
        columns ``variant, shift, seed, intensity, metric, value``.
    """
    results = with_shift(results)
    ps = results.groupby(_KEY, as_index=False, sort=False)["value"].mean()
    extra = []
    auc = ps[ps["metric"] == "auc"]
    clean = auc[auc["shift"] == CLEAN][["variant", "seed", "value"]].rename(
        columns={"value": "clean"}
    )
    if not clean.empty:
        ret = auc.merge(clean, on=["variant", "seed"])
        ret = ret.assign(metric="auc_retained", value=ret["value"] / ret["clean"])
        extra.append(ret[_KEY + ["value"]])
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
        columns ``variant, shift, intensity, metric, mean, se, n`` (se NaN with one seed).
    """
    ps = per_seed_values(results)
    grouped = ps.groupby(["variant", "shift", "intensity", "metric"], sort=False)["value"]
    out = grouped.agg(mean="mean", n="count").reset_index()
    out["se"] = grouped.agg(_se).to_numpy()
    return out[["variant", "shift", "intensity", "metric", "mean", "se", "n"]]


def _t_pvalue(t: float, dof: int) -> float:
    from scipy import special  # scipy comes with scikit-learn

    return float(2.0 * special.stdtr(dof, -abs(t)))  # Student's t survival function


def detectable_difference(sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """Smallest true mean difference a two-sided paired t-test detects with this power.

    The standard approximation ``(t_{1−α/2, n−1} + t_{power, n−1}) · sd / √n`` with ``sd``
    the std of the paired differences (ddof 1) and ``n`` pairs.

    Returns:
        The difference (same unit as the metric); NaN when ``n < 2`` or ``sd`` is not finite.
    """
    from scipy import special

    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    dof = n - 1
    z = special.stdtrit(dof, 1.0 - alpha / 2.0) + special.stdtrit(dof, power)  # t quantiles
    return float(z * sd / math.sqrt(n))


def seeds_needed(
    sd: float, target: float, alpha: float, power: float = 0.8, *, most: int = 1000
) -> int:
    """The fewest pairs n at which :func:`detectable_difference` reaches ``target``.

    The design question of a report, answered by the calculation its verdict table uses:
    with a pilot's std ``sd`` of the paired differences and the family's level ``alpha``
    (Holm's strictest, alpha / m), how many training seeds make a true difference of
    ``target`` detectable with this power.

    Returns:
        n ≥ 2; ``most + 1`` when even ``most`` pairs would not do (or ``sd`` is not finite).
    """
    if not math.isfinite(sd):
        return most + 1
    for n in range(2, most + 1):
        if detectable_difference(sd, n, alpha, power) <= target:
            return n
    return most + 1


def paired_differences(
    results: pd.DataFrame,
    baseline: str,
    alpha: float = 0.05,
    metrics: Sequence[str] | None = None,
    *,
    primary: Sequence[str] = PRIMARY_METRICS,
    power: float = 0.8,
    same_ranking: Collection[str] = (),
) -> pd.DataFrame:
    """Variant − baseline per training seed, a two-sided paired t-test over seeds, Holm, power.

    Args:
        results: long table with :data:`RESULT_COLUMNS`.
        baseline: the variant everything is compared with.
        alpha: family-wise error rate of the primary family.
        metrics: which metrics (default: every metric declared ``compared``, in
            :data:`~ctrcal.metrics.METRICS`; PCOC through ``pcoc_error``).
        primary: the metrics of the primary family (every variant, shift and intensity).
        power: power of the detectable-difference figure.
        same_ranking: variants whose predictions are a strictly increasing map of the
            baseline's own predictions (temperature scaling of the baseline's runs). Their
            AUC equals the baseline's by construction, so any difference is float round-off
            of ties: those rows are reported with ``by_construction`` set and no test, and
            they do not enter the family (a null that holds by construction is not a
            hypothesis, and counting it would only dilute the correction).

    Returns:
        columns ``variant, baseline, shift, metric, intensity, n, diff, se, t, p, primary,
        p_holm, detectable, significant, better, by_construction``: ``diff`` the mean of
        per-seed differences, ``se`` its standard error, ``p`` the paired t-test's; for
        primary rows ``p_holm`` is adjusted over the whole primary family, ``significant``
        means p_holm < alpha (needs n ≥ 2) and ``detectable`` is
        :func:`detectable_difference` at alpha / m. Exploratory rows have NaN ``p_holm`` and
        ``detectable``; their ``significant`` is p < alpha, unadjusted. ``better`` is
        True/False for a significant improvement / deterioration.
    """
    ps = per_seed_values(results)
    if metrics is None:
        metrics = [m.name for m in metrics_in("compared")]
    metrics = list(metrics)
    primary = set(primary)
    base = ps[(ps["variant"] == baseline) & ps["metric"].isin(metrics)]
    rows = []
    for variant in dict.fromkeys(ps["variant"]):
        if variant == baseline:
            continue
        other = ps[(ps["variant"] == variant) & ps["metric"].isin(metrics)]
        on = ["shift", "seed", "intensity", "metric"]
        merged = other.merge(base, on=on, suffixes=("", "_b"))
        for (shift, metric, intensity), grp in merged.groupby(
            ["shift", "metric", "intensity"], sort=False
        ):
            if metric == "auc_retained" and shift == CLEAN:
                continue  # 1 by definition
            d = (grp["value"] - grp["value_b"]).dropna().to_numpy(dtype=float)
            n = d.size
            if n == 0:
                continue
            diff = float(d.mean())
            sd = float(d.std(ddof=1)) if n >= 2 else float("nan")
            se = sd / math.sqrt(n) if n >= 2 else float("nan")
            fixed = variant in same_ranking and metric in _RANK_METRICS
            if n < 2 or fixed:
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
                    "shift": shift,
                    "metric": metric,
                    "intensity": float(intensity),
                    "n": n,
                    "diff": diff,
                    "se": se,
                    "t": t,
                    "p": p,
                    "primary": metric in primary and not fixed,
                    "p_holm": float("nan"),
                    "detectable": float("nan"),
                    "significant": False,
                    "better": None,
                    "by_construction": fixed,
                    "_sd": sd,
                }
            )
    cols = ["variant", "baseline", "shift", "metric", "intensity", "n", "diff", "se", "t", "p"]
    cols += ["primary", "p_holm", "detectable", "significant", "better", "by_construction"]
    out = pd.DataFrame(rows, columns=[*cols, "_sd"])
    if not out.empty:
        fam = out["primary"].to_numpy(dtype=bool)
        out.loc[fam, "p_holm"] = holm(out.loc[fam, "p"].to_numpy(dtype=float))
        m = int(np.isfinite(out.loc[fam, "p"].to_numpy(dtype=float)).sum())
        if m:
            out.loc[fam, "detectable"] = [
                detectable_difference(sd, int(n), alpha / m, power)
                for sd, n in zip(out.loc[fam, "_sd"], out.loc[fam, "n"], strict=True)
            ]
        test_p = np.where(fam, out["p_holm"], out["p"]).astype(float)
        out["significant"] = test_p < alpha
        direction = out["metric"].map(_higher_is_better)
        out["better"] = [
            ((d > 0) == up) if sig else None
            for d, up, sig in zip(out["diff"], direction, out["significant"], strict=True)
        ]
        out["better"] = out["better"].astype(object)
        order = {x: i for i, x in enumerate(metrics)}
        rank = {v: i for i, v in enumerate(dict.fromkeys(ps["variant"]))}
        shifts = {s: i for i, s in enumerate(dict.fromkeys([CLEAN, *ps["shift"]]))}
        keys = {"metric": order, "variant": rank, "shift": shifts}
        out = out.sort_values(
            ["variant", "metric", "shift", "intensity"],
            key=lambda c: c.map(keys[c.name]) if c.name in keys else c,
            kind="stable",
        ).reset_index(drop=True)
    return out.drop(columns="_sd")


def _higher_is_better(metric: str) -> bool:
    """The declared direction of ``metric`` (a metric without one reads as higher-is-better)."""
    found = METRICS.find(metric)
    return True if found is None or found.better is None else found.higher_is_better


@dataclass
class Summary:
    """Every number of a shift report, from the long results table (no prose, no files).

    Attributes:
        results: the results table in report order (variants as listed), the rows of
            ``results.csv``: :data:`RESULT_COLUMNS`.
        table: :func:`summarize`: mean and SE over training seeds per variant, shift,
            intensity and metric.
        paired: :func:`paired_differences` against ``baseline``.
        variants: the variants in report order.
        baseline: the variant every other one is compared with.
        n_seeds: training seeds (pairs) of the variant with the fewest.
        alpha: family-wise error rate of the primary family.
        power: power of the detectable differences.
    """

    results: pd.DataFrame
    table: pd.DataFrame
    paired: pd.DataFrame
    variants: list[str]
    baseline: str
    n_seeds: int
    alpha: float
    power: float

    @property
    def primary(self) -> pd.DataFrame:
        """The primary family: the rows the verdict is made of."""
        if self.paired.empty:
            return self.paired
        return self.paired[self.paired["primary"].astype(bool)]

    @property
    def significant(self) -> pd.DataFrame:
        """The primary comparisons that survive the Holm correction."""
        prim = self.primary
        return prim if prim.empty else prim[prim["significant"].astype(bool)]

    @property
    def tests(self) -> int:
        """The size m of the primary family (comparisons with a p-value)."""
        return int(np.isfinite(self.primary["p"].to_numpy(dtype=float)).sum())

    def detectable_by_metric(self) -> pd.DataFrame:
        """The detectable differences of the primary family, per metric.

        Returns:
            columns ``metric, comparisons, smallest, median, largest, beyond``: over the
            metric's comparisons with a finite detectable difference, its smallest, median
            and largest value, and ``beyond`` how many of them exceed the metric's range
            (:func:`within_range`): those the design cannot detect at all. A comparison
            whose per-seed differences do not vary (a variant whose AUC is the baseline's
            by construction, such as Platt scaling with a positive slope) says nothing about
            the design and is left out: its "detectable difference" would read 0.
        """
        cols = ["metric", "comparisons", "smallest", "median", "largest", "beyond"]
        prim = self.primary
        rows = []
        for metric, grp in prim.groupby("metric", sort=False) if not prim.empty else ():
            d = grp["detectable"].to_numpy(dtype=float)
            d = d[np.isfinite(d) & (grp["se"].to_numpy(dtype=float) > 0)]
            if d.size == 0:
                continue
            beyond = sum(not within_range(str(metric), x) for x in d)
            rows.append([metric, d.size, d.min(), float(np.median(d)), d.max(), beyond])
        return pd.DataFrame(rows, columns=cols)


def summarize_report(
    results: pd.DataFrame,
    *,
    baseline: str | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    variants: Sequence[str] | None = None,
    same_ranking: Collection[str] = (),
) -> Summary:
    """The statistics of a results table: per-point summary and paired tests vs the baseline.

    Args:
        results: long table with :data:`RESULT_COLUMNS` (a table without ``shift`` is read as
            one Gaussian shift plus the clean point).
        baseline: the reference variant (default: the first variant).
        alpha: family-wise error rate of the primary comparisons.
        power: power of the detectable-difference figures.
        variants: the order of the variants (default: as they first appear in ``results``);
            variants absent from ``results`` are dropped, unlisted ones appended.
        same_ranking: variants whose AUC equals the baseline's by construction (see
            :func:`paired_differences`).
    """
    results = with_shift(results)[RESULT_COLUMNS].copy()
    present = list(dict.fromkeys(results["variant"]))
    order = [v for v in (variants or present) if v in present]
    order += [v for v in present if v not in order]
    rank = {v: i for i, v in enumerate(order)}
    results = results.sort_values("variant", key=lambda c: c.map(rank), kind="stable")
    baseline = baseline or order[0]
    return Summary(
        results=results,
        table=summarize(results),
        paired=paired_differences(results, baseline, alpha, power=power, same_ranking=same_ranking),
        variants=order,
        baseline=baseline,
        n_seeds=int(results.groupby("variant")["seed"].nunique().min()),
        alpha=alpha,
        power=power,
    )
