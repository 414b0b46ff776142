"""Time every calibration metric of one evaluation against AUC on the same rows.

Goal: all calibration metrics (ECE, ECE by mass, PCOC, logloss, Brier, NE, calibration-free
NE, ECCE with its significance, Field-RCE / Field-ECE of every field, the multicalibration
error) of a 10M-row evaluation with 26 categorical fields in at most 3x the time of AUC.

Rows are generated: Criteo-like vocabularies (Zipf-distributed ids, 26 fields with vocabulary
sizes from 3 to 10^6), a click probability that depends on two fields, predictions that miss
part of it. Each figure is the median of ``--repeats`` runs, measured in this one process, so
the ratio compares like with like. Prints the CPU (``lscpu`` name, family and model), since
CPUs differ.

Second goal: row-level bootstrap intervals of ECE, PCOC and AUC (``report.bootstrap: 200``
replicates) in at most 2x the time of those three metrics themselves, at 1M rows. Timed the
same way, in alternating pairs (``--bootstrap 0`` skips it). smooth ECE and the calibration
slope are timed beside the other metrics.

Third goal (``--report``): the worst segments and the deploy gate add at most 20 % to a
``calibration-report`` of 1M rows with three segment columns and a compared model. The report
is timed end to end (:func:`~ctrcal.reports.calibration.report.calibration_report` with ``--gate``),
and in the same process the parts the segments and the gate add (the ranked, tested segment
list, its figure, the gate's parse and decisions; the gate reuses the paired bootstrap that
``--compare`` runs anyway); the ratio is added / (report − added). ``--report-bootstrap``
sets the replicates: fewer replicates make the report cheaper, so the ratio larger (a
conservative figure). The per-segment gate (``--gate-segments``) is one more paired bootstrap
per segment value, timed separately. Murphy's Brier terms and the label-free estimates are
timed beside them.

Fourth goal (``--monitor``): input drift and the label-free estimates with their trust flags
(``calibration-report ANALYSIS --reference REF``) of a 1M-row analysis file with 39 features
(13 numeric, 26 categorical ids, as ``ctrcal predict --with-features`` writes them) against a
1M-row reference take at most 2x a plain ``calibration-report`` of the analysis. Both are run
end to end through the command line in this process, the plain one first; the ratio is
(report with --reference − plain report) / plain report, i.e. what the monitoring adds.

``--compare-gate``: ``calibration-report --compare COL --gate SPEC`` in at most 3x the time
of the same report without ``--compare`` (three segment columns, ``--report-bootstrap``
replicates, 200 in the report), at 100k and 1M rows. Both reports are timed end to end in
this process, the plain one first, after a small report that does the imports.

Usage::

    python scripts/bench_calibration.py            # 10M rows, 26 fields
    python scripts/bench_calibration.py --monitor --rows 1000000
    python scripts/bench_calibration.py --rows 1000000 --repeats 3
    python scripts/bench_calibration.py --report --rows 1000000 --report-bootstrap 20
    python scripts/bench_calibration.py --compare-gate --rows 100000 --report-bootstrap 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.core.utils import cpu_model_name
from ctrcal.metrics import bootstrap_ci, calibration_slope_intercept, smooth_ece


def make_rows(n: int, n_fields: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = np.unique(np.geomspace(3, 1_000_000, n_fields).astype(np.int64))
    vocab = np.resize(vocab, n_fields)
    # column-major, as the report keeps them (a row-major matrix costs one transposing copy)
    fields = np.empty((n, n_fields), dtype=np.int32, order="F")
    for j, v in enumerate(vocab):
        # heavy-tailed ids (a few values hold most rows), cheaper to draw than Zipf
        u = rng.random(n, dtype=np.float32)
        fields[:, j] = np.minimum(v * u**4, v - 1).astype(np.int32)
    z = rng.normal(-2.5, 1.0, n).astype(np.float32)
    true = z + 0.4 * (fields[:, 1] % 2) - 0.3 * (fields[:, 5] % 3 == 0)
    y = (rng.random(n, dtype=np.float32) < 1.0 / (1.0 + np.exp(-true))).astype(np.float32)
    probs = (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
    return probs, y, fields


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--fields", type=int, default=26)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--mce-max-rows",
        type=int,
        default=None,
        help="rows the multicalibration error evaluates (default: the library's default)",
    )
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates (0: skip)")
    ap.add_argument("--report", action="store_true", help="time segments + gate in a report")
    ap.add_argument("--report-bootstrap", type=int, default=20, help="the report's replicates")
    ap.add_argument(
        "--compare-gate", action="store_true", help="time --compare --gate against a plain report"
    )
    ap.add_argument("--monitor", action="store_true", help="time drift + estimates (--reference)")
    args = ap.parse_args()
    if args.compare_gate:
        print(
            f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        bench_compare(args.rows, args.report_bootstrap, args.seed)
        return
    if args.monitor:
        print(
            f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        bench_monitor(args.rows, args.seed)
        return
    if args.report:
        print(
            f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        bench_report(args.rows, args.report_bootstrap, args.seed)
        return

    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    t = time.perf_counter()
    probs, y, fields = make_rows(args.rows, args.fields, args.seed)
    took = time.perf_counter() - t
    print(f"{args.rows:,} rows, {args.fields} fields (generated in {took:.1f} s)")
    names = [f"C{j + 1}" for j in range(args.fields)]
    M.ece(probs[:1000], y[:1000])  # warm-up: the uniform bins import torch once
    smooth_ece(probs[:1000], y[:1000])  # and smooth ECE's convolution imports scipy.signal

    mce = {} if args.mce_max_rows is None else {"max_rows": args.mce_max_rows}
    summary_mce = {} if args.mce_max_rows is None else {"mce_max_rows": args.mce_max_rows}
    parts = {
        "global (ECE x2, PCOC, logloss, Brier, NE)": lambda: M.compute_all(probs, y),
        "ECCE + significance": lambda: M.ecce_test(probs, y),
        "calibration-free NE": lambda: M.calibration_free_ne(probs, y),
        "Field-RCE/ECE/PCOC, all fields": lambda: M.field_calibration(
            probs, y, fields, names=names
        ),
        "multicalibration error": lambda: M.multicalibration_error(
            probs, y, fields, names=names, **mce
        ),
        "smooth ECE (bandwidth search)": lambda: smooth_ece(probs, y),
        "calibration slope + intercepts": lambda: calibration_slope_intercept(probs, y),
    }
    for label, fn in parts.items():
        print(f"  {label:<45} {timed(fn, 1):7.2f} s")
    # AUC and the calibration metrics alternate, so that a change of load on a shared machine
    # hits both; the ratio is taken per pair, then the median
    pairs = []
    for _ in range(args.repeats):
        t_a = timed(lambda: M.auc(probs, y), 1)
        t_c = timed(
            lambda: M.calibration_summary(
                probs, y, fields, names=names, with_auc=False, **summary_mce
            ),
            1,
        )
        pairs.append((t_a, t_c))
    t_auc = statistics.median(a for a, _ in pairs)
    t_all = statistics.median(c for _, c in pairs)
    ratio = statistics.median(c / a for a, c in pairs)
    mc = M.multicalibration_error(probs, y, fields, names=names, **mce)
    print(
        f"multicalibration: {mc.n_segments} segments on {mc.rows:,} rows, worst "
        f"{mc.worst_segment} at {mc.sigmas:.1f} sigma"
    )
    print(f"AUC:                          {t_auc:7.2f} s (median of {args.repeats})")
    print(f"all calibration metrics:      {t_all:7.2f} s (median of {args.repeats})")
    print(f"ratio calibration / AUC:      {ratio:7.2f} (median over pairs; goal <= 3)")
    print("pairs (AUC s, calibration s): " + ", ".join(f"({a:.2f}, {c:.2f})" for a, c in pairs))
    if args.bootstrap:
        bench_bootstrap(probs, y, args.bootstrap, args.repeats)


def bench_bootstrap(probs: np.ndarray, y: np.ndarray, n_boot: int, repeats: int) -> None:
    """Bootstrap intervals of ECE, PCOC and AUC against computing those three once."""

    def metrics() -> None:
        M.ece(probs, y)
        M.pcoc(probs, y)
        M.auc(probs, y)

    pairs = [
        (timed(metrics, 1), timed(lambda: bootstrap_ci(probs, y, n_boot=n_boot), 1))
        for _ in range(repeats)
    ]
    ci = bootstrap_ci(probs, y, n_boot=n_boot)
    print(f"bootstrap, {n_boot} replicates over {len(y):,} rows:")
    for name, c in ci.items():
        print(f"  {name:<5} {c.estimate:.5f}  95% CI [{c.low:.5f}, {c.high:.5f}]  se {c.se:.5f}")
    t_m = statistics.median(m for m, _ in pairs)
    t_b = statistics.median(b for _, b in pairs)
    ratio = statistics.median(b / m for m, b in pairs)
    print(f"ECE + PCOC + AUC once:        {t_m:7.3f} s (median of {repeats})")
    print(f"bootstrap CIs of the three:   {t_b:7.3f} s (median of {repeats})")
    print(f"ratio bootstrap / metrics:    {ratio:7.2f} (median over pairs; goal <= 2 at 1M rows)")
    print("pairs (metrics s, bootstrap s): " + ", ".join(f"({m:.3f}, {b:.3f})" for m, b in pairs))


def _report_inputs(n: int, seed: int) -> tuple[Any, np.ndarray]:
    """Predictions of ``n`` rows with three segment columns and a second model's column."""
    from ctrcal.reports.calibration.predictions_file import Predictions

    probs, y, fields = make_rows(n, 6, seed)  # fields 0, 1, 2: up to 3, 38 and 479 values
    rng = np.random.default_rng(seed + 1)
    z = np.log(probs) - np.log1p(-probs)
    other = 1.0 / (1.0 + np.exp(-(z + rng.normal(0.0, 0.05, n))))
    cols = {
        "p": probs,
        "y": y,
        "q": other,
        "site": fields[:, 2],
        "dev": fields[:, 0],
        "hour": fields[:, 1] % 24,
    }
    segments = ["site", "dev", "hour"]
    return Predictions.from_columns(cols, "p", "y", segments=segments, compare="q"), fields


def bench_compare(n: int, n_boot: int, seed: int) -> None:
    """The report with ``--compare`` and ``--gate`` against the same report without them."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from ctrcal.reports.calibration.report import calibration_report

    preds, _ = _report_inputs(n, seed)
    plain = dataclasses.replace(preds, compare=None)
    spec = "ece:+0.002,auc:-0.001,logloss:+0.001"
    print(f"{n:,} rows, segments site, dev, hour; {n_boot} replicates; gate {spec!r}")
    with tempfile.TemporaryDirectory() as tmp:
        warm, _ = _report_inputs(2000, seed)  # imports (matplotlib, scipy) outside the timing
        calibration_report(warm, Path(tmp) / "warm", bootstrap=n_boot, gate=spec)
        t = time.perf_counter()
        calibration_report(plain, Path(tmp) / "plain", bootstrap=n_boot)
        t_plain = time.perf_counter() - t
        t = time.perf_counter()
        paths = calibration_report(preds, Path(tmp) / "gate", bootstrap=n_boot, gate=spec)
        t_gate = time.perf_counter() - t
    verdict = "pass" if paths.gate.passed else "fail"
    print(f"report without --compare:          {t_plain:7.2f} s")
    print(f"report with --compare and --gate:  {t_gate:7.2f} s (verdict {verdict})")
    print(f"ratio:                             {t_gate / t_plain:7.2f} (goal <= 3)")


def bench_report(n: int, n_boot: int, seed: int) -> None:
    """The report's cost with and without what the worst segments and the gate add."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from ctrcal.metrics import brier_decomposition, label_free_estimates, worst_segments
    from ctrcal.reports.calibration.gate import decide, parse_gate
    from ctrcal.reports.calibration.report import calibration_report, gate_metrics
    from ctrcal.reports.calibration.segment_figure import plot_segments

    preds, fields = _report_inputs(n, seed)
    spec = "ece:+0.002,auc:-0.001,logloss:+0.001"
    print(
        f"{n:,} rows, segments site ({np.unique(fields[:, 2]).size} values), dev, hour; "
        f"{n_boot} replicates"
    )
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        paths = calibration_report(preds, Path(tmp) / "rep", bootstrap=n_boot, gate=spec)
        t_report = time.perf_counter() - t
        plain = dataclasses.replace(preds, compare=None)
        t = time.perf_counter()
        calibration_report(plain, Path(tmp) / "plain", bootstrap=n_boot)
        t_plain = time.perf_counter() - t
        p, segs = preds.prob, preds.segments
        t = time.perf_counter()
        scan = worst_segments(p, preds.label, segs, value_names=preds.segment_values)
        t_list = time.perf_counter() - t
        t = time.perf_counter()
        plot_segments(scan, Path(tmp) / "segments.png")
        t_fig = time.perf_counter() - t
    t = time.perf_counter()
    rules = parse_gate(spec, gate_metrics(True))
    decide(spec, rules, {}, 0.95)
    t_gate = time.perf_counter() - t
    t = time.perf_counter()
    brier_decomposition(p, preds.label)
    label_free_estimates(p)
    t_extra = time.perf_counter() - t
    added = t_list + t_fig + t_gate
    verdict = "pass" if paths.gate.passed else "fail"
    print(f"report with --segments, --compare and --gate: {t_report:7.2f} s (verdict {verdict})")
    print(f"report with --segments only:                  {t_plain:7.2f} s")
    print(f"  worst segments (ranked, tested):            {t_list:7.3f} s")
    print(f"  segments figure:                            {t_fig:7.3f} s")
    print(f"  gate parse + decisions:                     {t_gate:7.4f} s")
    print(f"  Brier terms + label-free estimates (once):  {t_extra:7.3f} s")
    print(
        f"ratio added / report without them, with --compare: {added / (t_report - added):6.3f}; "
        f"segments only: {(t_list + t_fig) / (t_plain - t_list - t_fig):6.3f} (goal <= 0.20)"
    )


def monitor_rows(n: int, seed: int, noise: float = 0.0) -> dict[str, np.ndarray]:
    """A predictions file with its 39 inputs: 13 heavy-tailed counts, 26 categorical ids
    (:func:`make_rows`' vocabularies), the click model's probability and a click;
    ``noise``: Gaussian noise (in stds) on the counts the model reads, after the clicks."""
    rng = np.random.default_rng(seed)
    probs, y, fields = make_rows(n, 26, seed)
    counts = np.floor(rng.lognormal(1.0, 1.5, (n, 13))).astype(np.float64)
    z = np.log(probs) - np.log1p(-probs) + 0.2 * (np.log1p(counts[:, :3]).sum(1) - 3.0)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
    if noise:
        counts += rng.normal(0.0, 1.0, counts.shape) * noise * counts.std(axis=0)
    z = np.log(probs) - np.log1p(-probs) + 0.2 * (np.log1p(np.abs(counts[:, :3])).sum(1) - 3.0)
    cols = {"prob": 1.0 / (1.0 + np.exp(-z)), "label": y}
    cols.update({f"I{j + 1}": counts[:, j] for j in range(13)})
    cols.update({f"C{j + 1}": fields[:, j].astype(np.int64) for j in range(26)})
    return cols


def bench_monitor(n: int, seed: int) -> None:
    """A plain calibration-report of a 1M-row analysis against the same with --reference."""
    import json
    import tempfile
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrcal.cli import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        ref, ana = Path(tmp) / "ref.parquet", Path(tmp) / "analysis.parquet"
        pq.write_table(pa.table(monitor_rows(n, seed)), ref)
        pq.write_table(pa.table(monitor_rows(n, seed + 1, noise=0.0625)), ana)
        base = ["calibration-report", str(ana), "--prob", "prob", "--label", "label"]
        # wall and CPU seconds: on a shared machine the CPU time is the steadier figure
        t, c = time.perf_counter(), time.process_time()
        assert cli([*base, "--out", f"{tmp}/plain"]) == 0
        plain, plain_cpu = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        assert cli([*base, "--reference", str(ref), "--out", f"{tmp}/monitored"]) == 0
        monitored, monitored_cpu = time.perf_counter() - t, time.process_time() - c
        got = json.loads(Path(f"{tmp}/monitored/metrics.json").read_text())
    d = got["drift"]
    alarms = sum(c["alarm"] for c in d["chunks"])
    print(f"{n:,} analysis rows, {n:,} reference rows, 39 features (13 numeric, 26 categorical)")
    print(f"{len(d['chunks'])} chunks of {d['chunk_rows']:,} rows, {alarms} alarmed (noise 6.25 %)")
    print(f"plain calibration-report:       {plain:7.1f} s wall, {plain_cpu:7.1f} s CPU")
    print(f"with --reference:               {monitored:7.1f} s wall, {monitored_cpu:7.1f} s CPU")
    added, added_cpu = monitored - plain, monitored_cpu - plain_cpu
    print(
        f"added by drift + estimates:     {added:7.1f} s wall = {added / plain:.2f}x plain, "
        f"{added_cpu:.1f} s CPU = {added_cpu / plain_cpu:.2f}x plain (goal <= 2)"
    )


if __name__ == "__main__":
    main()
