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
  resampled rows) and the interval and p-value of the difference; smooth ECE, the calibration
  slope and intercept and the multicalibration error only where the gate names them (a
  search or fit of their own per replicate, from half the cost of all the others to several
  times it);
* with ``std``: risk–coverage (AUC and logloss on the 50/80/100 % most confident rows);
* with ``time``: calibration over consecutive time windows (:mod:`ctrcal.reports.shift.windows`),
  ``windows.csv``, ``windows.png`` and the decay sentence;
* with segments: the worst segments, ranked and tested (``ctrcal.metrics.worst_segments``),
  and ``segments.png``;
* with ``gate``: the deploy gate's rules and verdict (:mod:`ctrcal.reports.calibration.gate`);
* always: Murphy's Brier decomposition and the label-free estimates beside the measured values
  (``ctrcal.metrics.brier_decomposition``, ``label_free_errors``); without labels
  (:func:`label_free_report`) the estimates alone.

It reads top to bottom and calls components; the metrics, bootstrap and windows own their
rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.core.errors import ConfigError
from ctrcal.core.utils import write_json_atomic, write_text_atomic
from ctrcal.metrics import (
    LABEL_FREE_METRICS,
    bootstrap_ci,
    brier_decomposition,
    calibration_slope_intercept,
    label_free_errors,
    label_free_estimates,
    metrics_in,
    paired_bootstrap,
    smooth_ece,
)
from ctrcal.reports.calibration.predictions_file import Predictions
from ctrcal.reports.markdown import definition_lines, markdown_table

__all__ = [
    "CalibrationReportPaths",
    "calibration_report",
    "label_free_report",
    "model_metrics",
    "table_metrics",
]

FLOOR = "perfectly calibrated (simulated)"
SEGMENTS_LISTED = 20  # segments listed at least (all flagged ones when more)
GATE_LEVEL = 0.95  # the paired bootstrap's interval whose ends the gate reads


# test windows of a time column when --windows is not given (fewer when the times allow fewer)
DEFAULT_WINDOWS = 10


@dataclass(frozen=True)
class CalibrationReportPaths:
    """The files one report wrote (None: not written)."""

    out_dir: Path
    markdown: Path
    metrics: Path
    reliability: Path | None
    windows_csv: Path | None = None
    windows_png: Path | None = None
    segments_png: Path | None = None
    gate: Any = None  # the GateDecision when a gate was asked for


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
    """Every metric of the report's table (:func:`table_metrics`) for one model's
    probabilities (on ``rows`` of segments): the families computed together, then every other
    declared metric of the table by its own ``compute``."""
    fields = _usable(segments, rows)
    out = M.calibration_summary(probs, labels, fields or None, n_bins=n_bins, min_count=min_count)
    s = smooth_ece(probs, labels)
    out.update(smooth_ece=float(s), smooth_ece_sigma=s.sigma)
    out.update(calibration_slope_intercept(probs, labels).as_dict())
    out.update(brier_decomposition(probs, labels, n_bins).as_dict())
    for m in metrics_in("calibration", kind="labelled"):
        if m.name not in out and m.compute is not None and not m.segments:
            out[m.name] = float(m.compute(probs, labels))
    return out


def table_metrics() -> list[str]:
    """The rows of the report's metric table: every metric declared for the ``calibration``
    table (:func:`~ctrcal.metrics.metrics_in`), in listing order."""
    return [m.name for m in metrics_in("calibration")]


def _floor_labels(probs: np.ndarray, seed: int) -> np.ndarray:
    """Clicks drawn from the predictions: what a perfectly calibrated model would see."""
    return (np.random.default_rng(seed).random(probs.shape[0]) < probs).astype(np.float64)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}" if abs(v) >= 10**-digits or v == 0 else f"{v:.2e}"


def calibration_report(
    preds: Predictions,
    out_dir: str | Path,
    *,
    windows: int | None = None,
    calibrator: Any = "platt",
    bootstrap: int = 200,
    seed: int = 0,
    n_bins: int = 15,
    min_count: int = 100,
    segment_pairs: Sequence[tuple[str, str]] = (),
    gate: str | None = None,
    gate_segments: bool = False,
    monitoring: dict[str, Any] | None = None,
) -> CalibrationReportPaths:
    """Write the calibration report of a predictions file into ``out_dir`` (module docstring).

    Args:
        preds: checked predictions
            (:func:`~ctrcal.reports.calibration.predictions_file.read_predictions`).
        out_dir: the report directory (created).
        windows: test windows when ``preds`` has a time column (one more is cut first, to
            fit the stale calibrator on); None: 10, or as many as the distinct times allow.
        calibrator: the calibrator spec compared over time (stale vs fresh).
        bootstrap: row-bootstrap replicates (intervals, paired comparison, windows).
        seed: seed of the bootstrap and of the floor's simulated labels.
        n_bins: ECE bins.
        min_count: Field-RCE/ECE pool segment values with fewer rows; the worst-segment list
            and the per-segment gate skip them.
        segment_pairs: pairs of segment columns whose value combinations are segments too.
        gate: a deploy-gate SPEC (:mod:`ctrcal.reports.calibration.gate`); needs ``preds.compare``.
        gate_segments: decide the gate's rules per segment value as well.
        monitoring: with a reference, :func:`~ctrcal.reports.calibration.monitor.monitor`'s
            keyword arguments (``reference``, ``chunk_rows``, ``alarm_rate``, ``features``):
            drift and label-free estimates with trust flags per chunk.
    """
    from ctrcal.calibration.base import create_calibrator
    from ctrcal.metrics import worst_segments
    from ctrcal.reports.calibration.gate import GateDecision, decide, parse_gate
    from ctrcal.reports.calibration.gate import gate_segments as gate_per_segment
    from ctrcal.reports.calibration.segment_figure import plot_segments
    from ctrcal.reports.figures import plot_reliability

    if preds.label is None:
        raise ConfigError("the calibration report needs labels; without them: label_free_report")
    rules = _check_gate(preds, gate, gate_segments, segment_pairs, parse_gate)
    if not isinstance(bootstrap, int) or bootstrap < 2:
        raise ConfigError(f"bootstrap: expected at least 2 replicates, got {bootstrap!r}")
    if not isinstance(min_count, int) or min_count < 1:
        raise ConfigError(f"min_count: expected at least 1 row, got {min_count!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")
    if preds.time is not None:
        windows = _check_windows(preds, windows)
        create_calibrator(calibrator)  # an unknown name or a missing package, before the work
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    watched = _monitor(preds, out, monitoring, seed)
    p, y, segs = preds.prob, preds.label, preds.segments
    names = preds.names
    opts = {"n_bins": n_bins, "min_count": min_count}
    model = model_metrics(p, y, segs, **opts)
    ci = bootstrap_ci(p, y, n_boot=bootstrap, seed=seed, n_bins=n_bins)
    floor = model_metrics(p, _floor_labels(p, seed), segs, **opts)
    result: dict[str, Any] = {
        "source": preds.source,
        "rows": preds.rows,
        "columns": names,
        "segments": list(segs),
        "clicks": float(y.sum()),
        "seed": seed,
        "replicates": bootstrap,
        "model": model,
        "bootstrap": {k: c.as_dict() for k, c in ci.items()},
        "floor": floor,
        "label_free": label_free_errors(p, y, model),
        **_monitored(watched),
    }
    if watched is not None:
        result["label_free"].update(watched.label_free)
    paths: dict[str, Path] = {}
    if segs:
        scan = worst_segments(
            p, y, segs, pairs=segment_pairs, value_names=preds.segment_values, min_count=min_count
        )
        result["worst_segments"] = scan.as_dict(top=max(SEGMENTS_LISTED, scan.flagged_count))
        paths["segments"] = plot_segments(
            scan, out / "segments.png", title=f"Segments: {Path(preds.source).name}"
        )
    curves: dict[str, dict[str, Any]] = {names["prob"]: _curves(p, y, n_bins)}
    if preds.compare is not None:
        pb = preds.compare

        def fn(probs: np.ndarray, labels: np.ndarray, rows: np.ndarray | None):
            return model_metrics(probs, labels, segs, rows, **opts)

        paired = paired_bootstrap(
            fn,
            p,
            pb,
            y,
            n_boot=bootstrap,
            seed=seed,
            level=GATE_LEVEL,
            # the gate's metrics are paired whatever they cost (paired_bootstrap's `also`)
            weighted={"segments": segs, **opts, "also": [r.metric for r in rules or ()]},
        )
        result["compare"] = {
            k: {
                "a": c.a.as_dict(),
                "b": c.b.as_dict(),
                "diff": c.diff.as_dict(),
                "pvalue": c.pvalue,
                "p_resolution": c.resolution,
            }
            for k, c in paired.items()
        }
        if rules is not None:
            decision = decide(gate, rules, paired, GATE_LEVEL)
            skipped = 0
            if gate_segments:
                more, skipped = gate_per_segment(
                    rules,
                    p,
                    pb,
                    y,
                    segs,
                    preds.segment_values,
                    min_count=min_count,
                    n_boot=bootstrap,
                    seed=seed,
                    n_bins=n_bins,
                )
                decision = GateDecision(gate, GATE_LEVEL, decision.results + more)
            result["gate"] = {**decision.as_dict(), "segments_skipped": skipped}
        curves[names["compare"]] = _curves(pb, y, n_bins)
    curves[FLOOR] = _curves(p, _floor_labels(p, seed), n_bins)
    if preds.std is not None:
        from ctrcal.metrics import risk_coverage

        result["risk_coverage"] = risk_coverage(p, y, preds.std).as_dict()
    paths["reliability"] = plot_reliability(
        curves,
        out / "reliability.png",
        ["uniform", "quantile"],
        title=f"Reliability: {Path(preds.source).name}",
        panel_titles=[f"{n_bins} equal-width bins", f"{n_bins} equal-mass bins"],
    )
    if preds.time is not None:
        paths.update(_windows(preds, out, result, windows, calibrator, bootstrap, seed, min_count))
    write_json_atomic(out / "metrics.json", result)
    write_text_atomic(out / "report.md", render_markdown(result))
    return CalibrationReportPaths(
        out,
        out / "report.md",
        out / "metrics.json",
        paths["reliability"],
        paths.get("windows_csv"),
        paths.get("windows_png"),
        paths.get("segments"),
        decision if rules is not None else None,
    )


def _check_windows(preds: Predictions, windows: int | None) -> int:
    """The number of test windows, checked against the time column before anything is
    written (a report that stops half-way leaves no figure behind)."""
    from ctrcal.reports.shift.windows import windows as cut_windows

    if windows is not None and (
        isinstance(windows, bool) or not isinstance(windows, int) or windows < 1
    ):
        raise ConfigError(f"windows: expected an integer >= 1, got {windows!r}")
    column = preds.names.get("time", "time")
    distinct = int(np.unique(preds.time).size)
    if distinct < 2:
        raise ConfigError(
            f"{preds.source}: the time column {column!r} holds {distinct} distinct time(s); "
            "calibration over time needs at least 2 (one to fit on, one to test)"
        )
    asked = windows
    windows = min(DEFAULT_WINDOWS, distinct - 1) if windows is None else windows
    try:
        cut_windows(preds.time, windows + 1)  # the first window fits the stale calibrator
    except ValueError:
        raise ConfigError(
            f"{preds.source}: --windows {asked if asked is not None else windows}: the time "
            f"column {column!r} holds {distinct} distinct times, which cannot make "
            f"{windows} test windows after the first (the stale calibrator's); use fewer "
            "windows"
        ) from None
    return windows


def gate_metrics(segments: bool) -> list[str]:
    """The metrics a gate rule may name: the report's table (the field-level ones only with
    segment columns)."""
    return [m.name for m in metrics_in("calibration") if segments or not m.segments]


def _check_gate(
    preds: Predictions, gate: str | None, per_segment: bool, pairs: Sequence[tuple[str, str]], parse
) -> list | None:
    """The gate's rules (None without a gate), and the options that need one, checked before
    any work."""
    from ctrcal.core.errors import ConfigError

    for pair in pairs:
        for c in pair:
            if c not in preds.segments:
                raise ConfigError(f"--segment-pairs: {c!r} is not one of the --segments columns")
    if per_segment and gate is None:
        raise ConfigError("--gate-segments: needs --gate SPEC")
    if per_segment and not preds.segments:
        raise ConfigError("--gate-segments: needs --segments COLS")
    if gate is None:
        return None
    if preds.compare is None:
        raise ConfigError("--gate: needs --compare COL (the candidate's probabilities)")
    return parse(gate, gate_metrics(bool(preds.segments)))


def _monitor(preds: Predictions, out: Path, monitoring: dict[str, Any] | None, seed: int):
    """Drift and estimates against a reference (None without one)."""
    if monitoring is None:
        return None
    from ctrcal.reports.calibration.monitor import monitor

    return monitor(analysis=preds, out_dir=out, seed=seed, **monitoring)


def _monitored(watched: Any) -> dict[str, Any]:
    return {} if watched is None else {"drift": watched.drift}


def label_free_report(
    preds: Predictions, out_dir: str | Path, monitoring: dict[str, Any] | None = None
) -> CalibrationReportPaths:
    """``--no-labels``: the label-free estimates alone, for monitoring (no clicks needed);
    with ``monitoring`` (:func:`calibration_report`'s), drift and estimates per chunk too.

    Writes ``report.md`` and ``metrics.json`` into ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    watched = _monitor(preds, out, monitoring, 0)
    est = label_free_estimates(preds.prob)
    result = {
        "source": preds.source,
        "rows": preds.rows,
        "columns": preds.names,
        "label_free": {f"{k}_est": v for k, v in est.items()},
        **_monitored(watched),
    }
    if watched is not None:
        result["label_free"].update(watched.label_free)
    lines = [
        f"# Label-free estimates: {Path(preds.source).name}",
        "",
        f"{preds.rows:,} rows; probability column `{preds.names['prob']}`; no labels.",
        "",
        *_label_free_intro(),
        "",
        markdown_table(["metric", "estimate"], [[k, _fmt(est[k])] for k in LABEL_FREE_METRICS]),
        "",
        *_monitor_lines(result),
    ]
    write_json_atomic(out / "metrics.json", result)
    write_text_atomic(out / "report.md", "\n".join(lines) + "\n")
    return CalibrationReportPaths(out, out / "report.md", out / "metrics.json", None)


def _label_free_intro() -> list[str]:
    return [
        "**Label-free estimates**: the values the model expects of itself if its "
        "probabilities are calibrated (AUC as NannyML's CBPE estimates it; logloss as the mean "
        "entropy of the predictions; click rate as their mean). They are only as good as the "
        "calibration: the error column is what a monitor without labels would get wrong here."
    ]


def _curves(p: np.ndarray, y: np.ndarray, n_bins: int) -> dict[str, dict[str, list[float]]]:
    out = {}
    for strategy in ("uniform", "quantile"):
        c = M.reliability_curve(p, y, n_bins=n_bins, strategy=strategy)
        out[strategy] = {
            "mean_prob": c.mean_prob.tolist(),
            "frac_pos": c.frac_pos.tolist(),
            "counts": c.counts.tolist(),
        }
    return out


def _windows(
    preds: Predictions,
    out: Path,
    result: dict,
    n_windows: int,
    calibrator: Any,
    bootstrap: int,
    seed: int,
    min_count: int,
) -> dict[str, Path]:
    from ctrcal.core.errors import DataError
    from ctrcal.reports.shift.window_figures import plot_windows
    from ctrcal.reports.shift.windows import calibration_over_time, decay_sentence

    pc = np.clip(preds.prob, 1e-7, 1.0 - 1e-7)
    try:
        res = calibration_over_time(
            np.log(pc) - np.log1p(-pc),
            preds.label,
            preds.time,
            n_windows,
            calibrator,
            segments=preds.segments or None,
            n_boot=bootstrap,
            min_count=min_count,
            seed=seed,
        )
    except ValueError as exc:
        raise DataError(f"{preds.source}: column {preds.names['time']!r}: {exc}") from None
    sentence = decay_sentence(res)
    records = res.records()
    result["windows"] = {
        "calibrator": calibrator,
        "fitted_on": res.fitted_on,
        "sentence": sentence,
        "table": records["windows"],
        "metrics": records["metrics"],
    }
    csv = out / "windows.csv"
    write_text_atomic(csv, _windows_csv(res))
    png = plot_windows(res, out / "windows.png", title=sentence.split(":")[0])
    return {"windows_csv": csv, "windows_png": png}


def _windows_csv(res: Any) -> str:
    """``windows.csv``: one line per window, its table's columns and then one column
    ``metric:calibration`` per measured pair (sorted; a pair never measured is left out, a
    missing value is empty). Numbers are written as Python writes them (``0.0123``,
    ``1e-05``)."""
    values: dict[tuple[str, str], dict[int, float]] = {}
    for v in res.metrics:
        if not math.isnan(v.value):
            values.setdefault((v.metric, v.calibration), {})[v.window] = v.value
    pairs = sorted(values)
    fields = ["window", "rows", "time_start", "time_end", "ece_gap", "detectable"]
    columns: list[list[Any]] = [[getattr(w, f) for w in res.windows] for f in fields]
    columns += [[values[p].get(w.window, math.nan) for w in res.windows] for p in pairs]
    text = [_csv_cells(np.asarray(c)) for c in columns]
    lines = [",".join([*fields, *(f"{m}:{c}" for m, c in pairs)])]
    lines += [",".join(row) for row in zip(*text, strict=True)]
    return "\n".join(lines) + "\n"


def _csv_cells(column: np.ndarray) -> list[str]:
    """A column's cells: integers as they are, floating-point numbers in their shortest
    round-trip form, NaN as an empty cell."""
    if column.dtype.kind != "f":
        return [str(v) for v in column.tolist()]
    cells = column.astype(str)
    cells[np.isnan(column)] = ""
    return cells.tolist()


def _fmt_p(p: float | None, resolution: float | None) -> str:
    """A bootstrap p-value; at the replicates' resolution (1/B) it is a bound: ``< 0.005``."""
    if p is not None and resolution is not None and math.isfinite(p) and p <= resolution:
        return f"< {resolution:.3g}"
    return _fmt(p, 3)


def render_markdown(r: dict[str, Any]) -> str:
    """The text of ``report.md`` from the result dictionary of :func:`calibration_report`."""
    cols = r["columns"]
    lines = [
        f"# Calibration report: {Path(r['source']).name}",
        "",
        f"{r['rows']:,} rows, {int(r['clicks']):,} clicks (rate {r['clicks'] / r['rows']:.4f}); "
        f"probability column `{cols['prob']}`, label column `{cols['label']}`"
        + (f", segments {', '.join(f'`{s}`' for s in r['segments'])}" if r["segments"] else "")
        + ".",
        "",
        f"**Floor**: the same metrics for a perfectly calibrated model on these rows (clicks "
        f"drawn from the predictions, seed {r['seed']}): what sampling noise alone scores. A "
        "calibration metric near its floor is noise.",
        "",
        "## Metrics",
        "",
    ]
    ci = r["bootstrap"]
    header = ["metric", f"`{cols['prob']}`", "95% CI (row bootstrap)", "floor"]
    rows = []
    table = table_metrics()
    for k in table:
        if k not in r["model"]:
            continue
        interval = f"[{_fmt(ci[k]['low'])}, {_fmt(ci[k]['high'])}]" if k in ci else ""
        rows.append([k, _fmt(r["model"][k]), interval, _fmt(r["floor"].get(k))])
    lines += [markdown_table(header, rows), ""]
    per_field = [k for k in r["model"] if k.startswith("field_rce:")]
    if per_field:
        lines += ["## Per segment column", ""]
        rows = []
        for k in per_field:
            name = k.split(":", 1)[1]
            rows.append(
                [
                    name,
                    _fmt(r["model"][k]),
                    _fmt(r["floor"].get(k)),
                    _fmt(r["model"][f"field_ece:{name}"]),
                ]
            )
        lines += [markdown_table(["segment", "Field-RCE", "floor", "Field-ECE"], rows), ""]
    if "compare" in r:
        lines += [
            f"## `{cols['compare']}` against `{cols['prob']}`",
            "",
            f"Paired row bootstrap ({r['replicates']} replicates): both models on the same "
            "resampled rows; the difference is compare − model.",
            "",
        ]
        rows = []
        for k in table:
            c = r["compare"].get(k)
            if c is None:
                continue
            d = c["diff"]
            rows.append(
                [
                    k,
                    _fmt(c["a"]["estimate"]),
                    _fmt(c["b"]["estimate"]),
                    f"{_fmt(d['estimate'])} [{_fmt(d['low'])}, {_fmt(d['high'])}]",
                    _fmt_p(c["pvalue"], c.get("p_resolution")),
                ]
            )
        header = ["metric", f"`{cols['prob']}`", f"`{cols['compare']}`"]
        header += ["difference [95% CI]", "p"]
        lines += [markdown_table(header, rows), ""]
        unpaired = [k for k in table if k in r["model"] and k not in r["compare"]]
        if unpaired:
            lines += [
                "Not paired: " + ", ".join(f"`{k}`" for k in unpaired) + " (a fit or a "
                "search of their own per replicate; a `--gate` rule that names one pairs it).",
                "",
            ]
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
        lines += [markdown_table(["coverage", "AUC", "logloss"], rows), ""]
    if "windows" in r:
        w = r["windows"]
        lines += ["## Calibration over time", "", w["sentence"], "", "![windows](windows.png)", ""]
        ece = {
            (m["window"], m["calibration"]): m["value"]
            for m in w["metrics"]
            if m["metric"] == "ece"
        }
        rows = [
            [
                str(t["window"]),
                f"{t['rows']:,}",
                *(_fmt(ece[t["window"], c]) for c in ("uncalibrated", "stale", "fresh")),
                _fmt(t["ece_gap"]),
                _fmt(t["detectable"]),
            ]
            for t in w["table"]
        ]
        header = [
            "window",
            "rows",
            "ECE uncalibrated",
            "ECE stale",
            "ECE fresh",
            "stale − fresh",
            "detectable",
        ]
        lines += [markdown_table(header, rows)]
        lines += ["", "Per-window PCOC, NE and Field-RCE as well: `windows.csv`.", ""]
    lines += _brier_lines(r["model"]) + _label_free_lines(r["label_free"]) + _monitor_lines(r)
    if "worst_segments" in r:
        lines += _segment_lines(r["worst_segments"])
    if "gate" in r:
        lines += _gate_lines(r["gate"], cols)
    lines += ["## Reliability", "", "![reliability](reliability.png)", "", "## Definitions", ""]
    lines += definition_lines(k for k in table if k in r["model"])
    return "\n".join(lines) + "\n"


def _monitor_lines(r: dict[str, Any]) -> list[str]:
    if "drift" not in r:
        return []
    from ctrcal.reports.calibration.monitor import monitor_lines

    return monitor_lines(r["drift"], r["label_free"])


def _brier_lines(m: dict[str, Any]) -> list[str]:
    keys = ("brier_reliability", "brier_resolution", "brier_uncertainty", "brier_remainder")
    if not all(k in m for k in keys):
        return []
    rel, res, unc, rem = (m[k] for k in keys)
    return [
        "## Brier decomposition",
        "",
        f"Murphy (1973) on the ECE bins: Brier {_fmt(m['brier'])} = reliability {_fmt(rel)} − "
        f"resolution {_fmt(res)} + uncertainty {_fmt(unc)} + remainder {_fmt(rem)} (the "
        "remainder is what the bins leave out: the within-bin variance of p minus twice its "
        "within-bin covariance with the clicks).",
        "",
    ]


def _label_free_lines(lf: dict[str, float]) -> list[str]:
    rows = [
        [m, _fmt(lf[f"{m}_est"]), _fmt(lf[f"{m}_measured"]), _fmt(lf[f"{m}_est_err"])]
        for m in LABEL_FREE_METRICS
    ]
    return [
        "## Label-free estimates",
        "",
        *_label_free_intro(),
        "",
        markdown_table(["metric", "estimate", "measured", "error (estimate − measured)"], rows),
        "",
    ]


def _segment_lines(ws: dict[str, Any]) -> list[str]:
    lines = [
        "## Worst segments",
        "",
        f"{ws['tested']:,} segments tested, {ws['skipped']:,} with fewer than "
        f"{ws['min_count']:,} rows skipped; {ws['flagged']:,} flagged at a family-wise "
        f"α = {ws['alpha']:g} (p-values adjusted by Holm's method over every segment tested). "
        "Ranked by σ = (observed − predicted clicks) / sqrt(Σp(1−p)); ratio = observed / "
        f"predicted with its exact Poisson {100 * ws['level']:g} % interval; *detectable*: the "
        "smallest relative error this segment would reveal (50 % power).",
        "",
    ]
    rows = [
        [
            s["name"],
            f"{s['rows']:,}",
            f"{s['observed']:.0f}",
            f"{s['predicted']:.1f}",
            f"{s['ratio']:.3f} [{s['low']:.3f}, {s['high']:.3f}]",
            f"{s['sigma']:+.1f}",
            f"{s['pvalue_adjusted']:.2g}",
            f"{s['detectable']:.3f}",
        ]
        for s in ws["segments"]
    ]
    header = ["segment", "rows", "observed", "predicted", "ratio [CI]", "σ", "p (Holm)"]
    lines.append(markdown_table([*header, "detectable"], rows))
    return lines + ["", "![segments](segments.png)", ""]


def _gate_lines(g: dict[str, Any], cols: dict[str, str]) -> list[str]:
    lines = [
        f"## Deploy gate: {g['verdict'].upper()}",
        "",
        f"Candidate `{cols['compare']}` against baseline `{cols['prob']}`, rules `{g['spec']}`, "
        f"each decided on the bound of the paired bootstrap's {100 * g['level']:g} % interval "
        "of candidate − baseline (a `+` rule on its upper end, a `-` rule on its lower end)."
        + (
            f" {g['segments_skipped']:,} segment values below the minimum count not gated."
            if g["segments_skipped"]
            else ""
        ),
        "",
    ]
    rows = [
        [
            r["rule"],
            r["scope"],
            _fmt(r["diff"]),
            _fmt(r["bound"]),
            "pass" if r["pass"] else "**fail**",
        ]
        for r in g["rules"]
    ]
    return [*lines, markdown_table(["rule", "rows", "difference", "bound", "result"], rows), ""]
