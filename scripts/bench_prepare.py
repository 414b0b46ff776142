"""Benchmark: the scale curve of ``ctrcal prepare`` against a bare polars parse.

Usage::

    python scripts/bench_prepare.py [--sizes 1000000,5000000,20000000,45000000]
                                    [--workdir /tmp/ctrcal-bench-prepare] [--repeat 1]
                                    [--chunk-mb 32] [--keep]

One synthetic dac file of the largest size is generated once (minutes for 45M rows, ~11 GB; kept
in ``--workdir`` for later runs, never in the repository), and each smaller size is its first N
lines. For each size, ``--repeat`` alternating rounds (one above 5M rows) each run, as whole
processes, (1) the floor of any polars pipeline -- parsing the file into string columns and
nothing else -- and (2) ``ctrcal prepare`` of the same file into a fresh directory (default
config: random split, min_count 10). Printed per size: the rows, the text's size, prepare's wall
seconds and rows/s, its peak RSS and per-phase seconds, the bare parse's wall seconds and peak
RSS, and the ratio of the two (goal: <= 1.5x), also of the seconds inside the processes (imports
left out). The bare parse holds the whole file in memory;
where it would not fit in the memory available (about 3.3 bytes per byte of text) it is skipped
and prepare's rows/s is compared with the smaller sizes' instead. The CPU (``lscpu`` model name,
family and model) and the load average are printed beside the figures: ratios measured within
one run depend much less on the load than absolute rows/s.

``CTRCAL_NATIVE_READER=0`` in the environment (passed on to the children) makes every chunk
go through polars instead of the C reader.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PREPARE = r"""
import json, sys, time
from ctrcal.config import Config
from ctrcal.api import prepare
from ctrcal.core.utils import peak_rss_mib
start = time.perf_counter()
res = prepare([sys.argv[1]], sys.argv[2], Config(), force=True,
              chunk_bytes=int(sys.argv[3]) if len(sys.argv) > 3 else None)
print(json.dumps({"rows": res.total_rows, "rss": peak_rss_mib(),
                  "inside": time.perf_counter() - start,
                  "timings": res.summary["timings"], "chunks": res.summary["chunks"],
                  "native_chunks": res.summary["native_chunks"]}))
"""

FLOOR = r"""
import json, sys, time
import polars as pl
from ctrcal.core.utils import peak_rss_mib
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
start = time.perf_counter()
df = pl.scan_csv(sys.argv[1], has_header=False, separator="\t", quote_char=None,
                 schema={n: pl.Utf8 for n in names}).collect()
print(json.dumps({"rows": df.height, "rss": peak_rss_mib(),
                  "inside": time.perf_counter() - start}))
"""

PARSE_BYTES_PER_TEXT_BYTE = 3.3
"""Peak RSS of the bare parse per byte of text (measured: 0.78 GB for 1M rows, 0.24 GB)."""


def _child(code: str, *args: str) -> tuple[float, dict]:
    """Whole-process wall seconds of a child and what it printed (JSON)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    secs = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return secs, json.loads(proc.stdout.strip().splitlines()[-1])


def _available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _inputs(workdir: Path, sizes: list[int]) -> dict[int, Path]:
    """The generated file of the largest size and a prefix of it for each other size."""
    from ctrcal.data.synthetic import generate, prob_path

    workdir.mkdir(parents=True, exist_ok=True)
    largest = max(sizes)
    files = {n: workdir / f"dac_{n}.txt" for n in sizes}
    big = files[largest]
    if not big.exists():
        print(f"generating {largest:,} rows into {big} (once) ...", flush=True)
        res = generate(big, largest, seed=0)
        prob_path(big).unlink()  # raw files as users bring them: no true probabilities
        print(f"  {res.seconds:.0f} s", flush=True)
    for n, path in files.items():
        if n != largest and not path.exists():
            tmp = path.with_suffix(".part")
            with open(big, "rb") as src, open(tmp, "wb") as dst:
                left = n
                while left:
                    lines = src.readlines(64 << 20)[:left]
                    dst.writelines(lines)
                    left -= len(lines)
            tmp.rename(path)
    return files


def main() -> int:
    from ctrcal.core.utils import cpu_model_name

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000000,5000000,20000000,45000000")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/ctrcal-bench-prepare"))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--chunk-mb", type=float, default=None, help="chunk size (default: ctrcal's)")
    p.add_argument("--keep", action="store_true", help="keep the prepared directories")
    args = p.parse_args()
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    files = _inputs(args.workdir, sizes)
    chunk = [str(int(args.chunk_mb * (1 << 20)))] if args.chunk_mb else []
    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'rows':>11} {'text GB':>7} | {'prepare s':>9} {'rows/s':>9} {'RSS GiB':>7} | "
          f"{'parse s':>7} {'RSS GiB':>7} | {'ratio':>5} {'inside':>6}  phases (s)")
    results = []
    for n in sizes:
        path = files[n]
        text = path.stat().st_size
        fits = text * PARSE_BYTES_PER_TEXT_BYTE < 0.8 * _available_bytes()
        prep, floor = [], []
        for _ in range(args.repeat if n <= 5_000_000 else 1):  # big sizes take minutes each
            if fits:
                floor.append(_child(FLOOR, str(path)))
            out = args.workdir / f"prepared_{n}"
            prep.append(_child(PREPARE, str(path), str(out), *chunk))
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
        secs = statistics.median(s for s, _ in prep)
        inside = statistics.median(i["inside"] for _, i in prep)
        info = prep[len(prep) // 2][1]
        row = {"rows": n, "text_gb": text / 1e9, "prepare_s": secs, "rows_per_s": n / secs,
               "prepare_inside_s": inside,
               "prepare_rss_gib": info["rss"] / 1024, "timings": info["timings"],
               "chunks": info["chunks"], "native_chunks": info["native_chunks"]}  # fmt: skip
        line = (f"{n:>11,} {text / 1e9:>7.2f} | {secs:>9.1f} {n / secs:>9,.0f} "
                f"{info['rss'] / 1024:>7.2f} | ")  # fmt: skip
        if floor:
            fsecs = statistics.median(s for s, _ in floor)
            finside = statistics.median(f["inside"] for _, f in floor)
            frss = max(f["rss"] for _, f in floor) / 1024
            row.update(parse_s=fsecs, parse_inside_s=finside, parse_rss_gib=frss,
                       ratio=secs / fsecs, ratio_inside=inside / finside)  # fmt: skip
            line += f"{fsecs:>7.1f} {frss:>7.2f} | {secs / fsecs:>5.2f} {inside / finside:>6.2f}"
        else:
            line += f"{'(does not fit in memory)':>30}"
        phases = ", ".join(f"{k} {v:.1f}" for k, v in info["timings"].items() if v >= 0.05)
        print(f"{line}  {phases}", flush=True)
        results.append(row)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
