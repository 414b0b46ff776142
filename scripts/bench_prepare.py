"""Benchmark: raw dac TSV -> encoded parquet (fit + transform + write) against a bare parse.

Usage::

    python scripts/bench_prepare.py [--rows 500000] [--repeat 5] [--workdir DIR] [--baseline]
                                    [--stream] [--chunk-mb 64]
    python scripts/bench_prepare.py --rss-sizes 250000,500000,1000000,2000000 [--chunk-mb 64]
                                    [--compare-memory]

A synthetic dac file of ``--rows`` rows is generated once (kept in ``--workdir``). Then
``--repeat`` alternating rounds each time, in a fresh child process each, (1) the floor of any
polars pipeline -- parsing the file into string columns and nothing else -- and (2) ``ctrcal
prepare`` of the same file into a new directory (``force``), so both meet the same load. The
medians are printed: wall and CPU seconds (all threads) of both, their ratios (goal: prepare
<= 1.5x the bare parse in wall time), rows/s, prepare's per-phase wall times and peak RSS,
with the CPU (``lscpu`` model name, family and model) and the load average before, during
and after. Ratios measured within one run depend much less on the load than absolute rows/s.
``--baseline`` also times a straightforward pandas implementation of the same work (read as
strings, per-column ``value_counts`` vocabulary, ``map``) on the same file.

``CTRCAL_NATIVE_READER=0`` in the environment (passed on to the children) times the polars
reader instead of the C reader of clean TSV files (:mod:`ctrcal.data.tsv_reader`).

``--stream`` forces the chunked, bounded-memory path (``in_memory_bytes=0``) whatever the
size. ``--rss-sizes`` instead prepares inputs of each size with the chunked path (one child
process each, the first N lines of one generated file) and prints peak RSS against input size:
it should stay flat once the vocabulary is complete; ``--compare-memory`` adds the in-memory
path at each size, whose peak grows with the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Children report their own peak (ctrcal.utils.peak_rss_mib reads VmHWM, which exec resets,
# where ru_maxrss would keep the high-water mark of the parent that generated the data).
PEAK = "from ctrcal.utils import peak_rss_mib\n"
CPU = (
    "def cpu_seconds():\n"
    "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    return r.ru_utime + r.ru_stime\n"
)

CHILD = r"""
import sys, time, resource
{PEAK}{CPU}
from ctrcal.config import Config
from ctrcal.data.prepare import prepare
cfg = Config()
start, cpu = time.perf_counter(), cpu_seconds()
res = prepare([sys.argv[1]], sys.argv[2], cfg, force=True,
                      in_memory_bytes=None if sys.argv[3] == "auto" else int(sys.argv[3]),
                      chunk_bytes=int(sys.argv[4]) if len(sys.argv) > 4 else None)
secs, cpu = time.perf_counter() - start, cpu_seconds() - cpu
rss = peak_rss_mib()
print(f"{res.total_rows} {secs} {rss} {cpu}")
import json
print(json.dumps({"timings": res.summary["timings"], "reader": res.summary["path"]
                  + (" (fast)" if res.summary.get("fast_path") else "")}), file=sys.stderr)
"""

FLOOR = r"""
import sys, time, resource
{PEAK}{CPU}
import polars as pl
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
start, cpu = time.perf_counter(), cpu_seconds()
df = pl.scan_csv(sys.argv[1], has_header=False, separator="\t", quote_char=None,
                 schema={n: pl.Utf8 for n in names}).collect()
secs, cpu = time.perf_counter() - start, cpu_seconds() - cpu
rss = peak_rss_mib()
print(f"{df.height} {secs} {rss} {cpu}")
"""

BASELINE = r"""
import sys, time, resource
{PEAK}
import numpy as np, pandas as pd
start = time.perf_counter()
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
df = pd.read_csv(sys.argv[1], sep="\t", header=None, names=names, dtype=str)
rng = np.random.default_rng(0)
split = rng.choice(3, size=len(df), p=[0.8, 0.1, 0.1])
train = df[split == 0]
out = pd.DataFrame({"label": df["label"].astype("float32")})
for c in names[1:14]:
    x = df[c].astype(float)
    t = np.sign(x) * np.log1p(np.abs(x))
    tt = t[split == 0]
    out[c] = ((t - tt.mean()) / tt.std()).astype("float32")
for c in names[14:]:
    vc = train[c].value_counts()
    vc = vc[vc >= 10]
    mapping = pd.Series(np.arange(3, 3 + len(vc), dtype="int32"), index=vc.index)
    out[c] = df[c].map(mapping).fillna(2).astype("int32")
    out.loc[df[c].isna(), c] = 1
for k, name in enumerate(["train", "valid", "test"]):
    out[split == k].to_parquet(f"{sys.argv[2]}_{name}.parquet")
secs = time.perf_counter() - start
rss = peak_rss_mib()
print(f"{len(df)} {secs} {rss}")
"""


def _run(code: str, *args: str) -> tuple[int, float, float, str]:
    """rows, seconds, peak RSS MiB, stderr of a child; its CPU seconds go to ``_LAST_CPU``."""
    code = code.replace("{PEAK}", PEAK).replace("{CPU}", CPU)
    proc = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True,
                          text=True)  # fmt: skip
    out = proc.stdout.split()
    _LAST_CPU[0] = float(out[3]) if len(out) > 3 else float("nan")
    return int(out[0]), float(out[1]), float(out[2]), proc.stderr.strip()


_LAST_CPU = [float("nan")]


def _chunk_arg(args: argparse.Namespace) -> list[str]:
    return [str(int(args.chunk_mb * 2**20))] if args.chunk_mb else []


def rss_scan(args: argparse.Namespace) -> int:
    """Peak RSS of preparing the first N rows of one generated file, for each N."""
    from ctrcal.data.synthetic import generate, prob_path

    sizes = sorted(int(float(x)) for x in args.rss_sizes.split(","))
    args.workdir.mkdir(parents=True, exist_ok=True)
    big = args.workdir / f"dac_{sizes[-1]}.txt"
    if not big.exists():
        t = time.perf_counter()
        generate(big, sizes[-1], seed=0)
        print(f"generated {sizes[-1]:,} rows in {time.perf_counter() - t:.1f} s")
    prob_path(big).unlink(missing_ok=True)  # like real data: no true probabilities
    from ctrcal.utils import cpu_model_name

    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, load average {_load()}; chunk "
          f"{args.chunk_mb or 'default'} MiB")  # fmt: skip
    print(f"{'rows':>10} {'MiB text':>9} {'path':>8} {'seconds':>8} {'rows/s':>9} "
          f"{'peak RSS MiB':>13}")  # fmt: skip
    paths = [("chunked", "0")] + ([("memory", str(1 << 62))] if args.compare_memory else [])
    for n in sizes:
        raw = args.workdir / f"dac_{n}.txt"
        if not raw.exists():
            with open(big, "rb") as src, open(raw, "wb") as dst:
                for _, line in zip(range(n), src, strict=False):
                    dst.write(line)
        mib = raw.stat().st_size / 2**20
        for name, limit in paths:
            out = args.workdir / f"rss_{name}_{n}"
            rows, secs, rss, _ = _run(CHILD, str(raw), str(out), limit, *_chunk_arg(args))
            print(f"{rows:>10,} {mib:>9,.0f} {name:>8} {secs:>8.2f} {rows / secs:>9,.0f} "
                  f"{rss:>13,.0f}")  # fmt: skip
            shutil.rmtree(out, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=5,
                    help="alternating rounds (bare parse, then prepare); medians are reported")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctrcal-bench")
    ap.add_argument("--baseline", action="store_true", help="also time a pandas baseline")
    ap.add_argument(
        "--stream", action="store_true",
        help="force the bounded-memory path (typed intermediate parquet) whatever the size",
    )
    ap.add_argument("--chunk-mb", type=float, default=None,
                    help="text MiB per chunk of the chunked path (default: the library's)")
    ap.add_argument("--rss-sizes", default=None,
                    help="comma-separated row counts: peak RSS of the chunked path per size")
    ap.add_argument("--compare-memory", action="store_true",
                    help="with --rss-sizes: also run the in-memory path at each size")
    args = ap.parse_args()
    if args.rss_sizes:
        return rss_scan(args)

    from ctrcal.data.synthetic import generate, prob_path
    from ctrcal.utils import cpu_model_name

    args.workdir.mkdir(parents=True, exist_ok=True)
    raw = args.workdir / f"dac_{args.rows}.txt"
    if not raw.exists():
        t = time.perf_counter()
        generate(raw, args.rows, seed=0)
        secs = time.perf_counter() - t
        print(f"generated {args.rows:,} rows in {secs:.1f} s ({args.rows / secs * 60:,.0f}/min)")
    # real data has no true probabilities: measure the pipeline without the oracle's extra work
    prob_path(raw).unlink(missing_ok=True)
    size_mb = raw.stat().st_size / 2**20
    print(f"input: {raw} ({size_mb:,.0f} MiB, {args.rows:,} rows), "
          f"{'chunked' if args.stream else 'default'} path")  # fmt: skip
    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; load average before "
          f"{_load()}")  # fmt: skip
    floor_w, floor_c, prep_w, prep_c, rss_all = [], [], [], [], []
    phases: dict[str, list[float]] = {}
    readers: set[str] = set()
    for r in range(args.repeat):
        rows, secs, _, _ = _run(FLOOR, str(raw))
        floor_w.append(secs)
        floor_c.append(_LAST_CPU[0])
        out = args.workdir / f"prepared_{r}"
        rows, secs, rss, laps = _run(CHILD, str(raw), str(out), "0" if args.stream else "auto",
                                     *_chunk_arg(args))  # fmt: skip
        shutil.rmtree(out, ignore_errors=True)
        prep_w.append(secs)
        prep_c.append(_LAST_CPU[0])
        rss_all.append(rss)
        report = json.loads(laps)
        readers.add(report["reader"])
        for name, s in report["timings"].items():
            phases.setdefault(name, []).append(s)
        print(f"round {r + 1}: bare parse {floor_w[-1]:.3f} s ({floor_c[-1]:.2f} CPU s), "
              f"prepare {secs:.3f} s ({prep_c[-1]:.2f} CPU s) = {secs / floor_w[-1]:.2f}x; "
              f"load {_load()}")  # fmt: skip
    fw, fc, pw, pc = (_median(x) for x in (floor_w, floor_c, prep_w, prep_c))
    print(f"medians of {args.repeat} alternating rounds:")
    print(f"  bare polars parse (every field a string): {fw:.3f} s wall, {fc:.2f} CPU s "
          f"({rows / fw:,.0f} rows/s)")  # fmt: skip
    print(f"  ctrcal prepare:                           {pw:.3f} s wall, {pc:.2f} CPU s "
          f"({rows / pw:,.0f} rows/s), peak RSS {_median(rss_all):,.0f} MiB")  # fmt: skip
    per_round = ", ".join(f"{p / f:.2f}" for p, f in zip(prep_w, floor_w, strict=True))
    print(f"  prepare / bare parse: {pw / fw:.2f}x wall (goal <= 1.5x), {pc / fc:.2f}x CPU "
          f"time; per-round wall ratios {per_round}")
    print(f"  prepare path: {', '.join(sorted(readers))}")
    print("  prepare phases (s, wall): " + ", ".join(
        f"{name} {_median(v):.3f}" for name, v in phases.items()))  # fmt: skip
    if args.baseline:
        rows, secs, rss, _ = _run(BASELINE, str(raw), str(args.workdir / "pandas"))
        print(f"pandas baseline: {rows:,} rows in {secs:.2f} s = {rows / secs:,.0f} rows/s, "
              f"peak RSS {rss:,.0f} MiB; ctrcal is {secs / pw:.1f}x faster")  # fmt: skip
    print(f"load average after: {_load()}")
    return 0


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min)"


if __name__ == "__main__":
    sys.exit(main())
