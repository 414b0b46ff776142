"""``ctrcal calibration-report FILE``: the calibration half of the report, for any predictions.

Most teams have predictions from their own system (TF, JAX, a GBDT, production logs). This
recipe takes a predictions file (:mod:`ctrcal.reports.calibration.predictions_file`) and writes,
into one
directory:

* ``report.md`` and ``metrics.json``: global, bin-free (ECCE, smooth ECE), field-level
  (Field-RCE / Field-ECE per segment column) and multicalibration metrics, the calibration
  slope and intercepts, row-level bootstrap intervals of ECE, PCOC and AUC, and the **floor**:
  the same metrics for a perfectly calibrated model on the same rows (labels drawn from the
  predictions themselves, fixed seed), i.e. what sampling noise alone scores;
* ``reliability.png``: reliability diagrams (equal-width and equal-mass bins) of the model,
  the compared model and the floor;
* with ``compare``: every metric of both models with a paired row bootstrap (both on the same
  resampled rows) and the interval and p-value of the difference;
* with ``std``: risk–coverage (AUC and logloss on the 50/80/100 % most confident rows);
* with ``time``: calibration over consecutive time windows (:mod:`ctrcal.reports.shift.windows`),
  ``windows.csv``, ``windows.png`` and the decay sentence.

It reads top to bottom and calls components; the metrics, bootstrap and windows own their
rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.core.utils import write_json_atomic, write_text_atomic
from ctrcal.metrics import DEFINITIONS as RECAL_DEFINITIONS
from ctrcal.metrics import DEFINITIONS as SMOOTH_DEFINITIONS
from ctrcal.metrics import bootstrap_ci, calibration_slope_intercept, paired_bootstrap, smooth_ece
from ctrcal.reports.calibration.predictions_file import Predictions

__all__ = ["CalibrationReportPaths", "calibration_report", "model_metrics"]

TABLE = [
    "auc", "logloss", "brier", "ne", "ne_calfree", "ece", "ece_mass", "smooth_ece", "pcoc",
    "cal_slope", "cal_intercept", "cal_intercept_large", "ecce", "ecce_sigmas", "ecce_pvalue",
    "field_rce_mean", "field_rce_max", "field_ece_mean", "field_ece_max", "mce", "mce_sigmas",
    "mce_pvalue",
]  # fmt: skip
DEFINITIONS = {**M.DEFINITIONS, **M.CALIBRATION_DEFINITIONS, **SMOOTH_DEFINITIONS,
               **RECAL_DEFINITIONS}  # fmt: skip
FLOOR = "perfectly calibrated (simulated)"


@dataclass(frozen=True)
class CalibrationReportPaths:
    """The files one report wrote (None: not written)."""

    out_dir: Path
    markdown: Path
    metrics: Path
    reliability: Path
    windows_csv: Path | None = None
    windows_png: Path | None = None


def _usable(segments: Mapping[str, np.ndarray], rows: np.ndarray | None) -> dict[str, np.ndarray]:
    """Segment columns on ``rows`` with at least two values (a constant one says nothing)."""
    out = {}
    for k, v in segments.items():
        col = v if rows is None else v[rows]
        if col.size and col.min() != col.max():
            out[k] = col
    return out


def model_metrics(
    probs: np.ndarray,
    labels: np.ndarray,
    segments: Mapping[str, np.ndarray],
    rows: np.ndarray | None = None,
    *,
    n_bins: int = 15,
    min_count: int = 100,
) -> dict[str, float]:
    """Every metric of the report for one model's probabilities (on ``rows`` of segments)."""
    fields = _usable(segments, rows)
    out = M.calibration_summary(probs, labels, fields or None, n_bins=n_bins, min_count=min_count)
    s = smooth_ece(probs, labels)
    out.update(smooth_ece=float(s), smooth_ece_sigma=s.sigma)
    out.update(calibration_slope_intercept(probs, labels).as_dict())
    return out


def _floor_labels(probs: np.ndarray, seed: int) -> np.ndarray:
    """Clicks drawn from the predictions: what a perfectly calibrated model would see."""
    return (np.random.default_rng(seed).random(probs.shape[0]) < probs).astype(np.float64)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}" if abs(v) >= 10**-digits or v == 0 else f"{v:.2e}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def calibration_report(
    preds: Predictions,
    out_dir: str | Path,
    *,
    windows: int = 10,
    calibrator: Any = "platt",
    bootstrap: int = 200,
    seed: int = 0,
    n_bins: int = 15,
    min_count: int = 100,
) -> CalibrationReportPaths:
    """Write the calibration report of a predictions file into ``out_dir`` (module docstring).

    Args:
        preds: checked predictions
            (:func:`~ctrcal.reports.calibration.predictions_file.read_predictions`).
        out_dir: the report directory (created).
        windows: time windows when ``preds`` has a time column.
        calibrator: the calibrator spec compared over time (stale vs fresh).
        bootstrap: row-bootstrap replicates (intervals, paired comparison, windows).
        seed: seed of the bootstrap and of the floor's simulated labels.
        n_bins: ECE bins.
        min_count: Field-RCE/ECE pool segment values with fewer rows.
    """
    from ctrcal.calibration.base import create_calibrator
    from ctrcal.core.errors import ConfigError
    from ctrcal.reports.shift.figures import plot_reliability

    if not isinstance(bootstrap, int) or bootstrap < 2:
        raise ConfigError(f"bootstrap: expected at least 2 replicates, got {bootstrap!r}")
    if preds.time is not None:
        if not isinstance(windows, int) or windows < 1:
            raise ConfigError(f"windows: expected an integer >= 1, got {windows!r}")
        create_calibrator(calibrator)  # an unknown name or a missing package, before the work
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p, y, segs = preds.prob, preds.label, preds.segments
    names = preds.names
    opts = {"n_bins": n_bins, "min_count": min_count}
    model = model_metrics(p, y, segs, **opts)
    ci = bootstrap_ci(p, y, n_boot=bootstrap, seed=seed, n_bins=n_bins)
    floor = model_metrics(p, _floor_labels(p, seed), segs, **opts)
    result: dict[str, Any] = {
        "source": preds.source, "rows": preds.rows, "columns": names,
        "segments": list(segs), "clicks": float(y.sum()), "seed": seed, "replicates": bootstrap,
        "model": model, "bootstrap": {k: c.as_dict() for k, c in ci.items()},
        "floor": floor,
    }  # fmt: skip
    curves: dict[str, dict[str, Any]] = {names["prob"]: _curves(p, y, n_bins)}
    if preds.compare is not None:
        pb = preds.compare

        def fn(probs: np.ndarray, labels: np.ndarray, rows: np.ndarray | None):
            return model_metrics(probs, labels, segs, rows, **opts)

        paired = paired_bootstrap(fn, p, pb, y, n_boot=bootstrap, seed=seed)
        result["compare"] = {
            k: {"a": c.a.as_dict(), "b": c.b.as_dict(), "diff": c.diff.as_dict(),
                "pvalue": c.pvalue} for k, c in paired.items()
        }  # fmt: skip
        curves[names["compare"]] = _curves(pb, y, n_bins)
    curves[FLOOR] = _curves(p, _floor_labels(p, seed), n_bins)
    if preds.std is not None:
        from ctrcal.metrics import risk_coverage

        result["risk_coverage"] = risk_coverage(p, y, preds.std).as_dict()
    paths = {
        "reliability": plot_reliability(
            curves, out / "reliability.png", ["uniform", "quantile"],
            title=f"Reliability: {Path(preds.source).name}",
            panel_titles=[f"{n_bins} equal-width bins", f"{n_bins} equal-mass bins"],
        )
    }  # fmt: skip
    if preds.time is not None:
        paths.update(_windows(preds, out, result, windows, calibrator, bootstrap, seed, min_count))
    write_json_atomic(out / "metrics.json", _jsonable(result))
    write_text_atomic(out / "report.md", render_markdown(result))
    return CalibrationReportPaths(
        out, out / "report.md", out / "metrics.json", paths["reliability"],
        paths.get("windows_csv"), paths.get("windows_png"),
    )  # fmt: skip


def _curves(p: np.ndarray, y: np.ndarray, n_bins: int) -> dict[str, dict[str, list[float]]]:
    out = {}
    for strategy in ("uniform", "quantile"):
        c = M.reliability_curve(p, y, n_bins=n_bins, strategy=strategy)
        out[strategy] = {"mean_prob": c.mean_prob.tolist(), "frac_pos": c.frac_pos.tolist(),
                         "counts": c.counts.tolist()}  # fmt: skip
    return out


def _windows(
    preds: Predictions, out: Path, result: dict, n_windows: int, calibrator: Any,
    bootstrap: int, seed: int, min_count: int,
) -> dict[str, Path]:  # fmt: skip
    from ctrcal.core.errors import DataError
    from ctrcal.reports.shift.window_figures import plot_windows
    from ctrcal.reports.shift.windows import calibration_over_time, decay_sentence

    pc = np.clip(preds.prob, 1e-7, 1.0 - 1e-7)
    try:
        res = calibration_over_time(
            np.log(pc) - np.log1p(-pc), preds.label, preds.time, n_windows, calibrator,
            segments=preds.segments or None, n_boot=bootstrap, min_count=min_count, seed=seed,
        )  # fmt: skip
    except ValueError as exc:
        raise DataError(f"{preds.source}: column {preds.names['time']!r}: {exc}") from None
    sentence = decay_sentence(res)
    wide = res.metrics.pivot_table(
        index="window", columns=["metric", "calibration"], values="value"
    )
    result["windows"] = {
        "calibrator": calibrator, "fitted_on": res.fitted_on, "sentence": sentence,
        "table": res.windows.to_dict(orient="records"),
        "metrics": res.metrics.to_dict(orient="records"),
    }  # fmt: skip
    csv = out / "windows.csv"
    wide.columns = [f"{m}:{c}" for m, c in wide.columns]
    res.windows.set_index("window").join(wide).to_csv(csv)
    png = plot_windows(res, out / "windows.png", title=sentence.split(":")[0])
    return {"windows_csv": csv, "windows_png": png}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def render_markdown(r: dict[str, Any]) -> str:
    """The text of ``report.md`` from the result dictionary of :func:`calibration_report`."""
    cols = r["columns"]
    lines = [
        f"# Calibration report: {Path(r['source']).name}", "",
        f"{r['rows']:,} rows, {int(r['clicks']):,} clicks (rate {r['clicks'] / r['rows']:.4f}); "
        f"probability column `{cols['prob']}`, label column `{cols['label']}`"
        + (f", segments {', '.join(f'`{s}`' for s in r['segments'])}" if r["segments"] else "")
        + ".", "",
        f"**Floor**: the same metrics for a perfectly calibrated model on these rows (clicks "
        f"drawn from the predictions, seed {r['seed']}): what sampling noise alone scores. A "
        "calibration metric near its floor is noise.", "",
        "## Metrics", "",
    ]  # fmt: skip
    ci = r["bootstrap"]
    header = ["metric", f"`{cols['prob']}`", "95% CI (row bootstrap)", "floor"]
    rows = []
    for k in TABLE:
        if k not in r["model"]:
            continue
        interval = f"[{_fmt(ci[k]['low'])}, {_fmt(ci[k]['high'])}]" if k in ci else ""
        rows.append([k, _fmt(r["model"][k]), interval, _fmt(r["floor"].get(k))])
    lines += _table(header, rows) + [""]
    per_field = [k for k in r["model"] if k.startswith("field_rce:")]
    if per_field:
        lines += ["## Per segment column", ""]
        rows = []
        for k in per_field:
            name = k.split(":", 1)[1]
            rows.append([name, _fmt(r["model"][k]), _fmt(r["floor"].get(k)),
                         _fmt(r["model"][f"field_ece:{name}"])])  # fmt: skip
        lines += _table(["segment", "Field-RCE", "floor", "Field-ECE"], rows) + [""]
    if "compare" in r:
        lines += [
            f"## `{cols['compare']}` against `{cols['prob']}`", "",
            f"Paired row bootstrap ({r['replicates']} replicates): both models on the same "
            "resampled rows; the difference is compare − model.", "",
        ]  # fmt: skip
        rows = []
        for k in TABLE:
            c = r["compare"].get(k)
            if c is None:
                continue
            d = c["diff"]
            rows.append([k, _fmt(c["a"]["estimate"]), _fmt(c["b"]["estimate"]),
                         f"{_fmt(d['estimate'])} [{_fmt(d['low'])}, {_fmt(d['high'])}]",
                         _fmt(c["pvalue"], 3)])  # fmt: skip
        lines += _table(["metric", f"`{cols['prob']}`", f"`{cols['compare']}`",
                         "difference [95% CI]", "p"], rows) + [""]  # fmt: skip
    if "risk_coverage" in r:
        rc = r["risk_coverage"]
        lines += [
            "## Risk–coverage",
            "",
            f"Metrics on the most confident rows by `{cols['std']}` (smallest first).",
            "",
        ]
        covs = [k.split("@")[1] for k in rc if k.startswith("auc@")]
        rows = [[c, _fmt(rc[f"auc@{c}"]), _fmt(rc[f"logloss@{c}"])] for c in covs]
        lines += _table(["coverage", "AUC", "logloss"], rows) + [""]
    if "windows" in r:
        w = r["windows"]
        lines += ["## Calibration over time", "", w["sentence"], "", "![windows](windows.png)", ""]
        ece = {(m["window"], m["calibration"]): m["value"] for m in w["metrics"]
               if m["metric"] == "ece"}  # fmt: skip
        rows = [[str(t["window"]), f"{t['rows']:,}",
                 *(_fmt(ece[t["window"], c]) for c in ("uncalibrated", "stale", "fresh")),
                 _fmt(t["ece_gap"]), _fmt(t["detectable"])] for t in w["table"]]  # fmt: skip
        lines += _table(["window", "rows", "ECE uncalibrated", "ECE stale", "ECE fresh",
                         "stale − fresh", "detectable"], rows)  # fmt: skip
        lines += ["", "Per-window PCOC, NE and Field-RCE as well: `windows.csv`.", ""]
    lines += ["## Reliability", "", "![reliability](reliability.png)", "", "## Definitions", ""]
    lines += [f"- **{k}**: {DEFINITIONS[k]}" for k in TABLE if k in DEFINITIONS]
    return "\n".join(lines) + "\n"
