"""``calibration-report ANALYSIS --reference REF``: input drift and label-free estimates with
trust flags, chunk by chunk.

The reference (labelled: the rows the model is known to work on, e.g. its test split) and the
analysis (labels optional: the rows to monitor) carry the same feature columns next to the
probabilities, as ``ctrcal predict --with-features`` writes them. This module:

* cuts both into chunks of ``chunk_rows`` consecutive rows and scores the drift of every
  analysis chunk per feature and with the domain classifier, each against a threshold from
  the reference's own chunks (:class:`~ctrcal.metrics.DriftMonitor`);
* estimates AUC and logloss per chunk with every label-free estimator
  (:data:`~ctrcal.metrics.LABEL_FREE_ESTIMATORS`: CBPE, importance-weighted CBPE, DoC), each
  flagged ``trusted`` by the drift (:data:`~ctrcal.metrics.TRUST_RULE`), beside the measured
  values where the analysis has labels;
* writes ``drift.csv``, ``estimates.csv``, ``drift.png`` (each feature's drift over its
  threshold, per chunk) and ``estimates.png`` (estimates against measured over the chunks),
  and returns the ``drift`` and ``label_free`` entries of ``metrics.json`` and the report's
  section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError
from ctrcal.core.utils import write_text_atomic
from ctrcal.reports.calibration.predictions_file import Predictions
from ctrcal.reports.markdown import markdown_table

__all__ = ["DEFAULT_CHUNKS", "Monitoring", "monitor", "monitor_lines"]

DEFAULT_CHUNKS = 10  # analysis chunks when --chunk-rows is not given (fewer for a small file)


@dataclass(frozen=True)
class Monitoring:
    """What :func:`monitor` measured: ``drift`` and ``label_free`` (``metrics.json``'s
    entries) and the files it wrote."""

    drift: dict[str, Any]
    label_free: dict[str, Any]
    files: dict[str, Path]


def _check(reference: Predictions, analysis: Predictions) -> None:
    if reference.label is None:
        raise DataError(
            f"{reference.source}: the reference needs labels (its label column) to fit the "
            "estimators and the drift thresholds"
        )
    ref, ana = list(reference.features), list(analysis.features)
    if not ref:
        raise DataError(
            f"{reference.source}: no feature columns beside the probability and the label "
            "(write them with `ctrcal predict --with-features`)"
        )
    if set(ref) != set(ana):
        only_ref = [c for c in ref if c not in analysis.features]
        only_ana = [c for c in ana if c not in reference.features]
        raise DataError(
            f"{analysis.source} and {reference.source} have different feature columns"
            + (f"; only in the analysis: {', '.join(only_ana)}" if only_ana else "")
            + (f"; only in the reference: {', '.join(only_ref)}" if only_ref else "")
        )
    for preds in (reference, analysis):
        for c, v in preds.features.items():
            if _all_missing(v):
                raise DataError(
                    f"{preds.source}: feature column {c!r} has no value (every row missing)"
                )


def _only(preds: Predictions, features: list[str]) -> Predictions:
    import dataclasses

    return dataclasses.replace(preds, features={c: preds.features[c] for c in features})


def _all_missing(v: np.ndarray) -> bool:
    if v.dtype.kind == "f":
        return bool(np.isnan(v).all())
    if v.dtype.kind == "O":
        return all(x is None or (isinstance(x, float) and x != x) for x in v)
    return v.size == 0


def default_chunk_rows(reference_rows: int, analysis_rows: int) -> int:
    """Rows per chunk when none is given: the analysis in :data:`DEFAULT_CHUNKS` chunks, but
    no more rows than leave the reference 20 chunks for its thresholds."""
    return max(1, min(analysis_rows // DEFAULT_CHUNKS, reference_rows // 20))


def monitor(
    reference: Predictions,
    analysis: Predictions,
    out_dir: str | Path,
    *,
    chunk_rows: int | None = None,
    alarm_rate: float = 0.05,
    features: list[str] | None = None,
    seed: int = 0,
) -> Monitoring:
    """Drift and label-free estimates of ``analysis`` against ``reference`` (module
    docstring); writes its tables and figures into ``out_dir``.

    ``features``: the feature columns to compare (default: every column of the reference
    without a role).

    Raises:
        DataError: a reference without labels, different feature columns, a feature with no
            value in one file, or chunks too small (or too large) for their thresholds.
    """
    from threadpoolctl import threadpool_limits

    from ctrcal.metrics import (
        ESTIMATED_METRICS,
        LABEL_FREE_ESTIMATORS,
        TRUST_RULE,
        DriftMonitor,
        auc,
        doc_estimates,
        doc_gap,
        importance_weighted_estimates,
        label_free_estimates,
        logloss,
    )

    if features is not None:
        for preds in (reference, analysis):
            lacking = [c for c in features if c not in preds.features]
            if lacking:
                raise DataError(f"{preds.source}: no feature column {lacking[0]!r} (--features)")
        reference = _only(reference, features)
        analysis = _only(analysis, features)
    _check(reference, analysis)
    features = list(reference.features)
    rows = chunk_rows or default_chunk_rows(reference.rows, analysis.rows)
    try:
        drift = DriftMonitor(rows, alarm_rate=alarm_rate, seed=seed)
        drift.fit(reference.features)
        chunks = drift.transform({c: analysis.features[c] for c in features})
    except ValueError as exc:
        raise DataError(f"--reference {reference.source}: {exc}") from None
    out = Path(out_dir)
    scores = [s.as_dict() for c in chunks for s in c.scores]
    drift_result = {
        "chunk_rows": rows,
        "alarm_rate": alarm_rate,
        "scores_per_chunk": drift.tests_,
        "reference": reference.source,
        "reference_rows": reference.rows,
        "chunks": [
            {"chunk": c.chunk, "start": c.start, "stop": c.stop, "alarm": c.alarm} for c in chunks
        ],
        "univariate": [s for s in scores if s["feature"] is not None],
        "multivariate": [s for s in scores if s["feature"] is None],
    }
    ref_p, ref_y = reference.prob, reference.label
    estimators: dict[str, dict[str, Any]] = {
        e: {"assumption": a, "chunks": []} for e, a in LABEL_FREE_ESTIMATORS.items()
    }
    # one BLAS thread: the estimates' sums are dot products of a chunk's rows, too short for
    # a second thread, which waiting on a busy machine cost 3-4x their CPU time
    with threadpool_limits(1, user_api="blas"):
        gap = doc_gap(ref_p, ref_y)
        for c in chunks:
            p = analysis.prob[c.start : c.stop]
            cbpe = label_free_estimates(p)
            found = {
                "cbpe": cbpe,
                "iw_cbpe": importance_weighted_estimates(
                    ref_p[c.reference_rows], ref_y[c.reference_rows], c.density_ratio, p
                ),
                "doc": doc_estimates(ref_p, ref_y, p, gap, cbpe),
            }
            measured = {}
            if analysis.label is not None:
                y = analysis.label[c.start : c.stop]
                measured = {"auc": auc(p, y), "logloss": logloss(p, y)}
            for e, est in found.items():
                entry: dict[str, Any] = {"chunk": c.chunk, "trusted": c.trusted}
                for m in ESTIMATED_METRICS:
                    entry[m] = est[m]
                    if measured:
                        entry[f"{m}_measured"] = measured[m]
                        entry[f"{m}_error"] = est[m] - measured[m]
                estimators[e]["chunks"].append(entry)
    for e in estimators.values():
        e["trusted"] = all(x["trusted"] for x in e["chunks"])
    label_free = {"trust_rule": TRUST_RULE, "estimators": estimators}
    out.mkdir(parents=True, exist_ok=True)
    files = {"drift_csv": out / "drift.csv", "estimates_csv": out / "estimates.csv"}
    write_text_atomic(files["drift_csv"], _drift_csv(drift_result))
    write_text_atomic(files["estimates_csv"], _estimates_csv(estimators))
    files["drift_png"] = _plot_drift(drift_result, features, out / "drift.png")
    files["estimates_png"] = _plot_estimates(estimators, out / "estimates.png")
    return Monitoring(drift_result, label_free, files)


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def _drift_csv(d: dict[str, Any]) -> str:
    fields = ["chunk", "method", "feature", "value", "threshold", "alarm", "unseen"]
    lines = [",".join(fields)]
    for s in d["univariate"] + d["multivariate"]:
        lines.append(",".join(_cell(s.get(f)) for f in fields))
    return "\n".join(lines) + "\n"


def _estimates_csv(estimators: dict[str, dict[str, Any]]) -> str:
    keys = ["auc", "auc_measured", "auc_error", "logloss", "logloss_measured", "logloss_error"]
    lines = [",".join(["chunk", "estimator", *keys, "trusted"])]
    for name, e in estimators.items():
        for x in e["chunks"]:
            row = [str(x["chunk"]), name, *(_cell(x.get(k)) for k in keys), str(x["trusted"])]
            lines.append(",".join(row))
    return "\n".join(lines) + "\n"


def _plot_drift(d: dict[str, Any], features: list[str], path: Path) -> Path:
    """Each feature's drift over its threshold (rows) per chunk (columns); > 1 alarms."""
    from ctrcal.reports.figures import new_figure, save_figure

    pooled = {"unseen_rate": "unseen values", "domain_classifier": "domain classifier"}
    methods = [m for m in pooled if any(s["method"] == m for s in d["multivariate"])]
    names = [*features, *(pooled[m] for m in methods)]
    chunks = len(d["chunks"])
    ratio = np.full((len(names), chunks), np.nan)
    index = {f: i for i, f in enumerate(features)}
    index.update({m: len(features) + i for i, m in enumerate(methods)})
    for s in d["univariate"]:
        ratio[index[s["feature"]], s["chunk"]] = s["value"] / max(s["threshold"], 1e-12)
    for s in d["multivariate"]:  # the AUC's excess over 0.5 against the threshold's
        base = 0.5 if s["method"] == "domain_classifier" else 0.0
        ratio[index[s["method"]], s["chunk"]] = (s["value"] - base) / max(
            s["threshold"] - base, 1e-12
        )
    fig, (ax,) = new_figure(1, width=max(5.0, 0.5 * chunks + 3), height=0.22 * len(names) + 1.5)
    im = ax.imshow(ratio, aspect="auto", cmap="RdYlGn_r", vmin=0.0, vmax=2.0)
    ys, xs = np.nonzero(ratio > 1.0)
    ax.scatter(xs, ys, marker="x", color="black", s=12, label="alarm")
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set_xlabel("analysis chunk")
    ax.set_title("Drift / threshold (> 1: alarm)")
    fig.colorbar(im, ax=ax)
    return save_figure(fig, path)


def _plot_estimates(estimators: dict[str, dict[str, Any]], path: Path) -> Path:
    """AUC estimates over the chunks, measured where known; untrusted chunks shaded."""
    from ctrcal.reports.figures import LINE_STYLES, axis_label, new_figure, save_figure

    fig, (ax,) = new_figure(1, width=6.0)
    first = next(iter(estimators.values()))["chunks"]
    x = [c["chunk"] for c in first]
    for c in first:
        if not c["trusted"]:
            ax.axvspan(c["chunk"] - 0.5, c["chunk"] + 0.5, color="0.9", lw=0)
    for style, (name, e) in zip(LINE_STYLES, estimators.items(), strict=False):
        ax.plot(x, [c["auc"] for c in e["chunks"]], style, ms=3, label=name)
    if "auc_measured" in first[0]:
        ax.plot(x, [c["auc_measured"] for c in first], "k-", lw=2, label="measured")
    ax.set_xlabel("analysis chunk (shaded: not trusted)")
    ax.set_ylabel(axis_label("auc"))
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _f(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}"


def monitor_lines(d: dict[str, Any], lf: dict[str, Any]) -> list[str]:
    """The report's section on monitoring, from ``metrics.json``'s ``drift`` and
    ``label_free`` entries."""
    from ctrcal.metrics import TRUST_RULE

    chunks = d["chunks"]
    alarmed = sum(c["alarm"] for c in chunks)
    lines = [
        "## Monitoring: drift and label-free estimates",
        "",
        f"Against the reference `{Path(d['reference']).name}` ({d['reference_rows']:,} rows), "
        f"in {len(chunks)} chunk(s) of {d['chunk_rows']:,}+ consecutive rows. Each chunk's "
        f"{d['scores_per_chunk']} drift scores (a Jensen–Shannon distance per feature, the "
        "rate of values the reference never saw over the categorical features, a domain "
        "classifier's AUC) are compared with thresholds from the reference's own "
        f"chunks at a false-alarm rate of {d['alarm_rate']:g} per clean chunk, all scores "
        f"together. **{alarmed} of {len(chunks)} chunk(s) alarm.** Trust: {TRUST_RULE}.",
        "",
    ]
    by_chunk: dict[int, list[str]] = {}
    for s in d["univariate"]:
        if s["alarm"]:
            by_chunk.setdefault(s["chunk"], []).append(s["feature"])
    mv = {s["chunk"]: s for s in d["multivariate"] if s["method"] == "domain_classifier"}
    unseen = {s["chunk"]: s for s in d["multivariate"] if s["method"] == "unseen_rate"}
    est = lf["estimators"]
    header = ["chunk", "rows", "features alarmed", "domain AUC (threshold)"]
    header += ["unseen rate (threshold)"] if unseen else []
    header += [f"AUC {e}" for e in est]
    measured = "auc_measured" in next(iter(est.values()))["chunks"][0]
    header += ["AUC measured"] if measured else []
    header += ["trusted"]
    rows = []
    for i, c in enumerate(chunks):
        feats = by_chunk.get(c["chunk"], [])
        row = [
            str(c["chunk"]),
            f"{c['stop'] - c['start']:,}",
            ", ".join(feats[:6]) + (f" (+{len(feats) - 6})" if len(feats) > 6 else "") or "–",
            f"{_f(mv[c['chunk']]['value'], 3)} ({_f(mv[c['chunk']]['threshold'], 3)})",
        ]
        if unseen:
            u = unseen[c["chunk"]]
            row.append(f"{_f(u['value'], 4)} ({_f(u['threshold'], 4)})")
        row += [_f(e["chunks"][i]["auc"]) for e in est.values()]
        if measured:
            row.append(_f(next(iter(est.values()))["chunks"][i]["auc_measured"]))
        row.append("yes" if next(iter(est.values()))["chunks"][i]["trusted"] else "**no**")
        rows.append(row)
    lines += [markdown_table(header, rows), ""]
    lines += ["Each estimator and what it assumes:", ""]
    lines += [f"- **{e}**: {v['assumption']}" for e, v in est.items()]
    lines += [
        "",
        "![drift](drift.png)",
        "",
        "![estimates](estimates.png)",
        "",
        "Every score with its threshold: `drift.csv`; every estimate: `estimates.csv`.",
        "",
    ]
    return lines
