"""The verdict of a shift report: one table of the primary family, then one plain sentence.

The table lists every primary comparison (variant × {AUC, ECE} × shift point against the
baseline) with Δ ± SE, p, p_Holm and the smallest difference the design could detect;
the cells that survive the family-wise (Holm) correction are marked. The sentence says what
survives, and says "no significant difference" when that is the truth. Comparisons outside
the primary family are listed after it as exploratory hints, never as findings.

:func:`summary_lines` is the report's first screen: what differs significantly and in
which direction, and the smallest difference the design detects per metric. A detectable
difference larger than the metric's whole range is written "cannot detect at this design",
never as a number.

Numbers come from a :class:`~ctrcal.reports.shift.stats.Summary`; this module only words them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.metrics import metric_of
from ctrcal.reports.markdown import markdown_table
from ctrcal.reports.shift.stats import CLEAN, Summary, format_intensity, within_range

__all__ = [
    "CANNOT_DETECT",
    "detectable_text",
    "exploratory_lines",
    "summary_lines",
    "verdict_lines",
    "verdict_sentence",
]


def _label(metric: str) -> str:
    """A metric's declared label (``AUC``), or its name when it has none."""
    found = metric_of(metric)
    return metric if found is None else found.label


CANNOT_DETECT = "cannot detect at this design"


def _num(x: Any, fmt: str) -> str:
    x = float(x)
    return format(x, fmt) if math.isfinite(x) else "n/a"


def point_label(row: Any, units: dict[str, str]) -> str:
    """``clean`` or ``<shift> <intensity>`` of a paired-difference row."""
    if row.shift == CLEAN:
        return "clean"
    return f"{row.shift} {format_intensity(row.intensity, units.get(row.shift, 'std'))}"


def detectable_text(metric: str, value: Any) -> str:
    """A detectable difference as the report writes it: four decimals, or
    :data:`CANNOT_DETECT` when it exceeds the metric's range (``n/a`` without one)."""
    value = float(value)
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.4f}" if within_range(metric, value) else CANNOT_DETECT


def _join(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _by_construction(diffs: pd.DataFrame) -> pd.Series:
    if "by_construction" not in diffs:
        return pd.Series(False, index=diffs.index)
    return diffs["by_construction"].astype(bool)


def verdict_sentence(summary: Summary, units: dict[str, str] | None = None) -> str:
    """One plain sentence: which primary comparisons survive the Holm correction, if any."""
    units = units or {}
    base, m, n = summary.baseline, summary.tests, summary.n_seeds
    if n < 2 or m == 0:
        return (
            f"With {n} training seed(s) there is no standard error, so no variant can be said "
            f"to differ from {base}."
        )
    how = f"{m} paired tests on AUC and ECE, Holm-adjusted at α = {summary.alpha:g}, {n} seeds"
    sig = summary.significant
    if sig.empty:
        return (
            f"No variant differs significantly from {base} at any shift point ({how}); "
            "differences below the detectable column could not have been seen."
        )
    parts = []
    for (variant, metric, better), grp in sig.groupby(["variant", "metric", "better"], sort=False):
        word = "better" if better else "worse"
        parts.append(f"{variant} has {word} {_label(metric)} at {_where(grp, units)}")
    return f"Only these differ from {base} ({how}): " + "; ".join(parts) + "."


def _where(grp: pd.DataFrame, units: dict[str, str]) -> str:
    """The points of some paired-difference rows, one group per shift: "clean and
    gaussian_numeric 25 %, 50 %"."""
    by_shift: dict[str, list[str]] = {}
    for r in grp.itertuples():
        level = format_intensity(r.intensity, units.get(r.shift, "std"))
        by_shift.setdefault(r.shift, []).append("" if r.shift == CLEAN else level)
    return _join(
        [
            "clean" if shift == CLEAN else f"{shift} {', '.join(levels)}"
            for shift, levels in by_shift.items()
        ]
    )


def summary_lines(summary: Summary, units: dict[str, str]) -> list[str]:
    """The first screen of the report: what differs significantly from the baseline and in
    which direction (Δ range over the points), then the detectable difference per metric."""
    base, m, n = summary.baseline, summary.tests, summary.n_seeds
    if n < 2 or m == 0:
        return [verdict_sentence(summary, units), ""]
    how = (
        f"{m} paired tests on AUC and ECE over {n} training seeds, Holm-adjusted at "
        f"α = {summary.alpha:g}"
    )
    sig = summary.significant
    if sig.empty:
        lines = [f"**Nothing differs significantly from {base}** at any point ({how}).", ""]
    else:
        lines = [f"**What differs from {base}** ({how}; Δ = variant − {base}):", ""]
        groups = sig.groupby(["variant", "metric", "better"], sort=False)
        for (variant, metric, better), grp in groups:
            word = "better" if better else "worse"
            lo, hi = float(grp["diff"].min()), float(grp["diff"].max())
            delta = f"Δ {lo:+.4f}" if lo == hi else f"Δ {lo:+.4f} to {hi:+.4f}"
            lines.append(
                f"- **{variant}**: {word} {_label(metric)} at {_where(grp, units)} ({delta})"
            )
        lines += ["", "Every other comparison of the family: no significant difference.", ""]
    by_metric = summary.detectable_by_metric()
    if by_metric.empty:
        return lines
    lines += [
        f"**The smallest difference this design detects** with {100 * summary.power:g} % "
        f"power, per metric (paired t-test over {n} seeds at Holm's strictest level α/m = "
        f"{summary.alpha / m:.2g}): a difference smaller than these could have been missed.",
        "",
    ]
    rows = []
    for r in by_metric.itertuples():
        metric = str(r.metric)
        worst = detectable_text(metric, r.largest)
        if r.beyond:
            worst += f" ({r.beyond} of {r.comparisons})"
        rows.append(
            [
                _label(metric),
                str(r.comparisons),
                worst,
                detectable_text(metric, r.median),
                detectable_text(metric, r.smallest),
            ]
        )
    header = ["metric", "comparisons", "at every point", "median point", "best point"]
    return lines + [markdown_table(header, rows), ""]


def verdict_lines(summary: Summary, units: dict[str, str]) -> list[str]:
    """The verdict section: the table of the primary family and the sentence below it."""
    prim = summary.primary
    base, alpha, power = summary.baseline, summary.alpha, summary.power
    m = summary.tests
    lines = [
        f"Δ = variant − {base} per training seed, mean ± SE over {summary.n_seeds} seed(s); p "
        f"from a two-sided paired t-test; p_Holm adjusted over all {m} comparisons of the "
        f"table (every variant × {{AUC, ECE}} × shift point). *Detectable*: the smallest true "
        f"|Δ| this design detects with {100 * power:g} % power at α/m = "
        f"{alpha / max(m, 1):.2g} (*{CANNOT_DETECT}*: larger than the metric's whole "
        f"range). **Bold ✓ / ✗**: better / worse at p_Holm < {alpha:g}.",
        "",
    ]
    fixed = _by_construction(summary.paired)
    if fixed.any():
        names = ", ".join(dict.fromkeys(summary.paired.loc[fixed, "variant"]))
        lines += [
            f"Not in the table: the AUC of {names} equals {base}'s by construction (a strictly "
            "increasing recalibration of the same predictions); differences there are float "
            "round-off of ties.",
            "",
        ]
    if not prim.empty:
        rows = []
        for r in prim.itertuples():
            sig = bool(r.significant)
            mark = "✓" if r.better is True else "✗" if r.better is False else ""
            cell = f"{r.diff:+.4f} ± {_num(r.se, '.4f')}"
            rows.append(
                [
                    r.variant,
                    _label(r.metric),
                    point_label(r, units),
                    f"**{cell} {mark}**" if sig else cell,
                    _num(r.p, ".3g"),
                    _num(r.p_holm, ".3g"),
                    detectable_text(r.metric, r.detectable),
                ]
            )
        header = ["variant", "metric", "point", "Δ ± SE", "p", "p_Holm", "detectable"]
        lines += [markdown_table(header, rows), ""]
    lines += [verdict_sentence(summary, units), ""]
    return lines


def exploratory_lines(summary: Summary, units: dict[str, str]) -> list[str]:
    """The comparisons outside the primary family: unadjusted hints, never findings."""
    diffs, base, alpha = summary.paired, summary.baseline, summary.alpha
    if diffs.empty:
        return []
    expl = diffs[~diffs["primary"].astype(bool) & ~_by_construction(diffs)]
    lines: list[str] = []
    if expl.empty:
        return lines
    p = expl["p"].to_numpy(dtype=float)
    hints = expl[np.isfinite(p) & (p < alpha)]
    lines += [
        f"## Exploratory differences vs {base} (not corrected; not findings)",
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
                point_label(r, units),
                f"{r.diff:+.4f} ± {_num(r.se, '.4f')}",
                _num(r.p, ".3g"),
            ]
            for r in hints.itertuples()
        ]
        lines += [markdown_table(["variant", "metric", "point", "Δ ± SE", "p"], rows), ""]
    return lines
