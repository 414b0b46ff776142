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

Usage::

    python scripts/bench_calibration.py            # 10M rows, 26 fields
    python scripts/bench_calibration.py --rows 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

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
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()
