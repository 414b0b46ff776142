"""The words and figures of the report's row-level analyses (:mod:`ctrcal.reports.shift.row_level`).

:func:`row_level_figures` draws one decay figure per calibrated variant
(:func:`ctrcal.reports.shift.window_figures.plot_windows`); :func:`row_level_lines` is the report.md
section: the bootstrap intervals, and per calibrated variant the decay sentence, its figure
and the per-window table. The risk–coverage metrics are tabled with the other uncertainty
metrics (:mod:`ctrcal.reports.shift.markdown`).
"""

from __future__ import annotations

import math
from pathlib import Path

from ctrcal.reports.markdown import markdown_table
from ctrcal.reports.shift.row_level import BOOTSTRAP_LEVEL, RowLevel

__all__ = ["row_level_figures", "row_level_lines"]


def _key(variant: str) -> str:
    return f"windows:{variant}"


def row_level_figures(row_level: RowLevel, out_dir: Path) -> dict[str, Path]:
    """The decay figure of every calibrated variant: ``{"windows:<variant>": path}``."""
    from ctrcal.reports.shift.window_figures import plot_windows

    out = {}
    for w in row_level.windows:
        path = Path(out_dir) / f"fig_windows_{w.variant}.png"
        title = f"{w.variant}: calibration over {len(w.result.windows)} test windows"
        out[_key(w.variant)] = plot_windows(w.result, path, title=title)
    return out


def _ci(ci) -> str:
    if not math.isfinite(ci.low):
        return f"{ci.estimate:.4f}"
    return f"{ci.estimate:.4f} [{ci.low:.4f}, {ci.high:.4f}]"


def _bootstrap_lines(row_level: RowLevel) -> list[str]:
    if not row_level.bootstrap:
        return []
    lines = [
        "## Row-level confidence intervals",
        "",
        f"ECE, PCOC and AUC of each variant's clean evaluation (training seed 0) with "
        f"{100 * BOOTSTRAP_LEVEL:g} % intervals over the test rows ({row_level.n_boot} Poisson "
        "bootstrap replicates): how much a number moves with the rows alone, beside the "
        "spread over training seeds in the tables above.",
        "",
    ]
    rows = [
        [variant, _ci(cis["ece"]), _ci(cis["pcoc"]), _ci(cis["auc"])]
        for variant, cis in row_level.bootstrap.items()
    ]
    return [*lines, markdown_table(["variant", "ECE", "PCOC", "AUC"], rows), ""]


def _window_table(result, oracle_ece: list[float] | None) -> list[str]:
    floor = oracle_ece is not None
    header = ["window", "rows", "ECE uncalibrated", "ECE stale", "ECE fresh", "stale − fresh"]
    header += ["detectable", "PCOC stale", "PCOC fresh"]
    header += ["ECE true probabilities"] if floor else []
    rows = []
    for i, r in enumerate(result.windows):
        w = int(r.window)

        def v(cal: str, metric: str, w: int = w) -> str:
            value = result.value(w, cal, metric)
            return f"{value:.4f}" if value is not None else "n/a"

        det = f"{r.detectable:.4f}" if math.isfinite(r.detectable) else "—"
        rows.append(
            [f"{w}", f"{int(r.rows):,}", v("uncalibrated", "ece"), v("stale", "ece")]
            + [v("fresh", "ece"), f"{r.ece_gap:+.4f}", det, v("stale", "pcoc")]
            + [v("fresh", "pcoc")]
            + ([f"{oracle_ece[i]:.4f}"] if floor else [])
        )
    return [markdown_table(header, rows)]


def _window_lines(row_level: RowLevel, figures: dict[str, Path]) -> list[str]:
    if not row_level.windows:
        return []
    lines = [
        "## Calibration over time",
        "",
        "The test period in consecutive windows of equal rows, in time order. Per window: the "
        "calibrator fitted once on validation (*stale*), the same calibrator refitted on the "
        "previous window (*fresh*: labels one window late, as in production; in window 1 it "
        "is the stale one), and the uncalibrated model; training seed 0. *Detectable*: the "
        "smallest stale − fresh ECE gap the window's rows can detect (paired row bootstrap, "
        "the report's α and power). On synthetic data the last column is the ECE of the true "
        "probabilities on the window's rows: the floor of that sample. ECE, PCOC, NE and "
        "Field-RCE per window are in `summary.json` (`row_level.windows`).",
        "",
    ]
    for w in row_level.windows:
        lines += [f"### {w.variant}", "", w.sentence, ""]
        fig = figures.get(_key(w.variant))
        if fig is not None:
            lines += [f"![calibration over time: {w.variant}]({fig.name})", ""]
        lines += [*_window_table(w.result, w.oracle_ece), ""]
    return lines


def row_level_lines(row_level: RowLevel | None, figures: dict[str, Path]) -> list[str]:
    """The report.md sections of the row-level analyses (empty when none ran)."""
    if row_level is None:
        return []
    return _bootstrap_lines(row_level) + _window_lines(row_level, figures)
