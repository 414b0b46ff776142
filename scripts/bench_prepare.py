"""Benchmark: ``ctrcal prepare`` at 500k to 45M rows against a bare polars parse (and a base).

Usage::

    nice python scripts/bench_prepare.py [--sizes 500000,1000000,5000000,12000000,45000000]
                                         [--workdir /tmp/ctrcal-bench-prepare] [--repeat 3]
                                         [--big-repeat 1] [--base /tmp/base]
                                         [--schema avazu]

Inputs: one synthetic dac file of ``min(largest size, 5M)`` rows is generated once under
``--workdir`` (minutes; never in the repository); a smaller size is its first N lines, a larger
one the file repeated and cut to N lines (45M rows = the 5M-row file 9 times: the same
distributions, generating 45M rows would take an hour on 2 cores).

Every measurement is a whole process (interpreter start-up and imports included), run the
way users run it: ``python -m ctrcal prepare FILE --out DIR`` (default config: random split,
min_count 10), against two floors of any polars pipeline:

- ``parse``: a process that parses the file into string columns, all of it in memory, and
  nothing else. It needs about 3.3 bytes of memory per byte of text; where that would not fit
  (45M rows: about 36 GiB) it is skipped.
- ``stream``: the same parse by polars' streaming engine, batch by batch, each batch dropped
  (bounded memory). It is measured from 5M rows on, so that the sizes where both floors run
  show how the two compare, and it is the floor of the sizes the in-memory parse cannot hold.

``--schema avazu`` measures an Avazu-shaped CSV instead (:func:`_avazu_file`: Avazu's 24
columns and header, ``hour`` in time order over ten days, 21 categoricals spelled as Avazu
spells them, 8-hex ids or small integers, ``device_ip`` and ``device_id`` with about a third
as many distinct values as rows), generated at each size, prepared with the data and features
of ``configs/avazu.yaml`` (string categoricals, split by hour); the floors parse its columns
as strings.

``--base DIR`` adds ``ctrcal prepare`` from another checkout (``git worktree add /tmp/base
<commit>``: the previous release), run the same way. For each size, rounds (``--repeat`` below
5M rows, ``--big-repeat`` from 5M on) alternate the floors, base and this checkout, so that a
change in the machine's load hits them all alike. Printed per size: the median seconds and
peak RSS (``wait4``) of each, and the ratios as the median of the rounds' own ratios (each
round's processes ran side by side in time), with their range when there are several rounds.
The CPU (``lscpu`` model name, family and model) and the load average are printed beside the
figures: on a shared machine compare the ratios measured within one run, not absolute times.
The processes run with Python's bytecode cache on (as after an install), each checkout once
unmeasured first.

``--engine ray`` measures the Ray engine against the local one instead, on ``--days`` day
files (``day_0`` ... ``day_23``) of ``--day-rows`` rows each (default 24 x 2M = 48M rows, split
by time as Criteo 1TB is: ``[22, 1, 1]`` whole days), each day a window of a generated file of
twice a day's rows, starting at another line (generating 48M rows would take an hour on 2
cores). Per round: Ray's fixed start-up (a process that starts Ray on this machine's cores,
runs a task per core and stops: :data:`RAY_START`), ``ctrcal prepare`` on the local engine and
on the Ray engine in its local mode, whole processes. ``--keep`` keeps the generated files
(they take about 12 GB for 48M rows; by default they are deleted at the end).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLOOR = r"""
import sys
import polars as pl
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
df = pl.scan_csv(sys.argv[1], has_header=False, separator="\t", quote_char=None,
                 schema={n: pl.Utf8 for n in names}).collect()
print(df.height)
"""

STREAM = r"""
import sys
import polars as pl
names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
lf = pl.scan_csv(sys.argv[1], has_header=False, separator="\t", quote_char=None,
                 schema={n: pl.Utf8 for n in names})
print(sum(batch.height for batch in lf.collect_batches()))
"""
STREAM_FROM_ROWS = 5_000_000

CSV_FLOOR = r"""
import sys
import polars as pl
print(pl.scan_csv(sys.argv[1], infer_schema=False).collect().height)
"""

CSV_STREAM = r"""
import sys
import polars as pl
lf = pl.scan_csv(sys.argv[1], infer_schema=False)
print(sum(batch.height for batch in lf.collect_batches()))
"""

# Avazu's categoricals after id, click, hour: distinct values (None: a third of the rows) and
# whether Avazu spells them as 8 hex digits (else small integers)
AVAZU_FIELDS = {
    "C1": (7, False),
    "banner_pos": (7, False),
    "site_id": (4737, True),
    "site_domain": (7745, True),
    "site_category": (26, True),
    "app_id": (8552, True),
    "app_domain": (559, True),
    "app_category": (36, True),
    "device_id": (None, True),
    "device_ip": (None, True),
    "device_model": (8251, True),
    "device_type": (5, False),
    "device_conn_type": (4, False),
    "C14": (2626, False),
    "C15": (8, False),
    "C16": (9, False),
    "C17": (435, False),
    "C18": (4, False),
    "C19": (68, False),
    "C20": (172, False),
    "C21": (60, False),
}

PARSE_BYTES_PER_TEXT_BYTE = 3.3
"""Peak RSS of the bare parse per byte of text (measured: 0.78 GB for 1M rows, 0.24 GB)."""
GENERATED_ROWS = 5_000_000


# Runs a module (``-m``) or code (``-c``) as ``python`` would, then prints the process's peak
# RSS (VmHWM: reset by exec, unlike a child's ru_maxrss, which counts its parent's pages)
WRAP = r"""
import atexit, runpy, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("PEAK_RSS_KIB", line.split()[1], file=sys.stderr, flush=True)
atexit.register(peak)
kind, target, *rest = sys.argv[1:]
sys.argv = [target, *rest]
if kind == "-m":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    exec(compile(target, "<bench>", "exec"), {"__name__": "__main__"})
"""


def _env(root: Path) -> dict[str, str]:
    """The environment of a measured process: ``root`` on the path, and Python's bytecode cache
    on, as in any install (``PYTHONDONTWRITEBYTECODE``, set in some sandboxes, would compile
    every module of the checkout from source in every process; the installed packages were
    compiled when they were installed)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(argv: list[str], root: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, ``wait4``) and peak RSS (GiB) of one whole
    process ``python argv`` run in ``root``."""
    env = _env(root)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAP, *argv],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    secs = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} in {root} exited {code}:\n{stderr[-3000:]}")
    kib = [int(ln.split()[1]) for ln in stderr.splitlines() if ln.startswith("PEAK_RSS")]
    return secs, usage.ru_utime + usage.ru_stime, kib[-1] / (1 << 20)


def _available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _lines(src: Path, dst, n: int) -> int:
    """Copy up to ``n`` lines of ``src`` to the open file ``dst``; the lines copied."""
    left = n
    with open(src, "rb") as fh:
        while left:
            lines = fh.readlines(64 << 20)[:left]
            if not lines:
                break
            dst.writelines(lines)
            left -= len(lines)
    return n - left


def _inputs(workdir: Path, sizes: list[int]) -> dict[int, Path]:
    """The generated file, and a file of each size cut from it or repeating it."""
    from ctrcal.preparation.synthetic import generate, prob_path

    workdir.mkdir(parents=True, exist_ok=True)
    rows = min(max(sizes), GENERATED_ROWS)
    base = workdir / f"dac_{rows}.txt"
    if not base.exists():
        print(f"generating {rows:,} rows into {base} (once) ...", flush=True)
        res = generate(base, rows, seed=0)
        print(f"  {res.seconds:.0f} s", flush=True)
    prob_path(base).unlink(missing_ok=True)  # raw files as users bring them
    files = {}
    for n in sizes:
        path = files[n] = workdir / f"dac_{n}.txt"
        if path.exists():
            continue
        tmp = path.with_suffix(".part")
        with open(tmp, "wb") as dst:
            left = n
            while left:
                left -= _lines(base, dst, left)
        tmp.rename(path)
    return files


def _avazu_file(path: Path, rows: int, seed: int = 0) -> None:
    """An Avazu-shaped ``train.csv`` of ``rows`` rows (module docstring); each field's values
    skewed towards its first ones (rank = distinct * u^3)."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    hours = np.sort(rng.integers(0, 240, rows))
    cols: dict[str, object] = {
        "id": rng.integers(0, 2**63, rows, dtype=np.int64),
        "click": (rng.random(rows) < 0.17).astype(np.int8),
        "hour": 14102100 + (hours // 24) * 100 + hours % 24,
    }
    for k, (name, (distinct, hexed)) in enumerate(AVAZU_FIELDS.items()):
        distinct = distinct or max(1, rows // 3)
        ranks = (distinct * rng.random(rows) ** 3).astype(np.int64)
        if hexed:
            pool = rng.integers(0, 2**32, distinct, dtype=np.int64)
            cols[name] = pl.Series([f"{v:08x}" for v in pool]).gather(ranks)
        else:
            cols[name] = 1000 * (k + 1) + ranks
    pl.DataFrame(cols).write_csv(path)


def _avazu_inputs(workdir: Path, sizes: list[int]) -> dict[int, Path]:
    """An Avazu-shaped file of each size (generated once)."""
    workdir.mkdir(parents=True, exist_ok=True)
    files = {}
    for n in sizes:
        path = files[n] = workdir / f"avazu_{n}.csv"
        if not path.exists():
            print(f"generating {n:,} Avazu-shaped rows into {path} (once) ...", flush=True)
            tmp = path.with_suffix(".part")
            _avazu_file(tmp, n)
            tmp.rename(path)
    return files


def _avazu_config(workdir: Path) -> Path:
    """``configs/avazu.yaml``'s data and features sections without its input file (the
    command line names it)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "avazu.yaml").read_text())
    cfg["data"].pop("inputs")
    path = workdir / "avazu.yaml"
    path.write_text(yaml.safe_dump({"data": cfg["data"], "features": cfg["features"]}))
    return path


RAY_START = r"""
import os
import ray
ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
noop = ray.remote(num_cpus=1)(lambda: os.getpid())
print(len(set(ray.get([noop.remote() for _ in range(os.cpu_count())]))))
ray.shutdown()
"""


def _day_inputs(workdir: Path, days: int, rows: int) -> list[Path]:
    """``days`` files ``day_N.txt`` of ``rows`` rows each: windows of a generated file of
    ``2 * rows`` rows, day ``N`` starting ``N / days`` of the way into it (wrapping)."""
    from ctrcal.preparation.synthetic import generate, prob_path

    workdir.mkdir(parents=True, exist_ok=True)
    base = workdir / f"dac_{2 * rows}.txt"
    if not base.exists():
        print(f"generating {2 * rows:,} rows into {base} (once) ...", flush=True)
        res = generate(base, 2 * rows, seed=0)
        print(f"  {res.seconds:.0f} s", flush=True)
    prob_path(base).unlink(missing_ok=True)
    lines = base.read_bytes().splitlines(keepends=True)
    files = []
    for d in range(days):
        path = workdir / f"day_{d}.txt"
        files.append(path)
        if path.exists():
            continue
        start = d * len(lines) // days
        window = (lines[start:] + lines[:start])[:rows]
        tmp = path.with_suffix(".part")
        with open(tmp, "wb") as fh:
            fh.writelines(window)
        tmp.rename(path)
    return files


def _engines(args: argparse.Namespace) -> int:
    """``--engine ray``: the Ray engine against the local one (module docstring)."""
    from ctrcal.core.utils import cpu_model_name

    files = _day_inputs(args.workdir, args.days, args.day_rows)
    text = sum(f.stat().st_size for f in files)
    rows = args.days * args.day_rows
    configs = {}
    for engine in ("local", "ray"):
        configs[engine] = args.workdir / f"{engine}.yaml"
        configs[engine].write_text(
            f"data:\n  engine: {engine}\n  split_order: time\n  split: [{args.days - 2}, 1, 1]\n"
        )
    print(
        f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; load average "
        f"{os.getloadavg()[0]:.1f} (/proc/loadavg: {Path('/proc/loadavg').read_text().strip()}); "
        f"{args.days} day files, {rows:,} rows, {text / 1e9:.2f} GB; whole processes",
        flush=True,
    )
    warm = args.workdir / "warm.txt"
    with open(files[0], "rb") as src:
        warm.write_bytes(b"".join(src.readline() for _ in range(2_000)))
    for engine, config in configs.items():  # bytecode caches and C kernels, once
        out = args.workdir / f"prepared_{engine}_warm"
        _run(
            ["-m", "ctrcal", "prepare", str(warm), "--out", str(out), "--config", str(config)], ROOT
        )
        shutil.rmtree(out, ignore_errors=True)
    secs: dict[str, list[float]] = {"ray start": [], "local": [], "ray": []}
    cpu: dict[str, list[float]] = {k: [] for k in secs}
    rss: dict[str, list[float]] = {k: [] for k in secs}
    for _ in range(args.big_repeat):
        t, c, r = _run(["-c", RAY_START], ROOT)
        secs["ray start"].append(t)
        cpu["ray start"].append(c)
        rss["ray start"].append(r)
        for engine, config in configs.items():
            out = args.workdir / f"prepared_{engine}"
            shutil.rmtree(out, ignore_errors=True)
            argv = ["-m", "ctrcal", "prepare", *map(str, files), "--out", str(out)]
            t, c, r = _run([*argv, "--config", str(config)], ROOT)
            shutil.rmtree(out, ignore_errors=True)
            secs[engine].append(t)
            cpu[engine].append(c)
            rss[engine].append(r)
            print(f"  {engine}: {t:.1f} s, CPU {c:.1f} s, {r:.2f} GiB", flush=True)
    row: dict[str, object] = {"rows": rows, "days": args.days, "text_gb": text / 1e9}
    for name in secs:
        row[f"{name}_s"] = statistics.median(secs[name])
        row[f"{name}_cpu_s"] = statistics.median(cpu[name])
        row[f"{name}_rss_gib"] = max(rss[name])
    row["ray_vs_local"] = statistics.median(_ratios(secs, "ray", "local"))
    row["ray_vs_local_rounds"] = _ratios(secs, "ray", "local")
    print(
        f"Ray start-up {row['ray start_s']:.1f} s; local {row['local_s']:.1f} s "
        f"({rows / row['local_s']:,.0f} rows/s), ray {row['ray_s']:.1f} s "
        f"({rows / row['ray_s']:,.0f} rows/s): ray/local "
        f"{_ratio_text(row['ray_vs_local_rounds'], 0)}; CPU s local {row['local_cpu_s']:.1f}, "
        f"ray {row['ray_cpu_s']:.1f}; peak RSS of the driver local {row['local_rss_gib']:.2f} "
        f"GiB, ray {row['ray_rss_gib']:.2f} GiB"
    )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(json.dumps(row))
    if not args.keep:
        for path in [*files, args.workdir / f"dac_{2 * args.day_rows}.txt", warm]:
            path.unlink(missing_ok=True)
    return 0


def _ratios(got: dict[str, list[float]], num: str, den: str) -> list[float]:
    """The rounds' own ratios ``num / den`` (rounds where both ran)."""
    return [a / b for a, b in zip(got[num], got[den], strict=False)]


def _ratio_text(ratios: list[float], width: int) -> str:
    if not ratios:
        return f"{'-':>{width}}"
    text = f"{statistics.median(ratios):.2f}"
    if len(ratios) > 1:
        text += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    return f"{text:>{width}}"


def main() -> int:
    from ctrcal.core.utils import cpu_model_name

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="500000,1000000,5000000,12000000,45000000")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/ctrcal-bench-prepare"))
    p.add_argument("--repeat", type=int, default=3, help="rounds below 5M rows")
    p.add_argument("--big-repeat", type=int, default=1, help="rounds from 5M rows on")
    p.add_argument(
        "--base",
        type=Path,
        default=None,
        help="another checkout whose `ctrcal prepare` runs alongside",
    )
    p.add_argument("--now-first", action="store_true", help="run this checkout before the base")
    p.add_argument("--schema", choices=["dac", "avazu"], default="dac", help="the files measured")
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="ray: the Ray engine against the local one on day files (--days, --day-rows)",
    )
    p.add_argument("--days", type=int, default=24, help="--engine ray: day files")
    p.add_argument("--day-rows", type=int, default=2_000_000, help="--engine ray: rows per day")
    p.add_argument("--keep", action="store_true", help="--engine ray: keep the generated files")
    args = p.parse_args()
    if args.engine == "ray":
        return _engines(args)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    avazu = args.schema == "avazu"
    files = (_avazu_inputs if avazu else _inputs)(args.workdir, sizes)
    config = ["--config", str(_avazu_config(args.workdir))] if avazu else []
    print(
        f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; load average "
        f"{os.getloadavg()[0]:.1f}; whole processes; seconds: medians of the rounds; "
        "ratios: the median of the rounds' ratios (their range); CPU s: user + system"
    )
    checkouts = {"now": ROOT}
    if args.base is not None:
        checkouts = {"now": ROOT, "base": args.base}
        if not args.now_first:
            checkouts = {"base": args.base, "now": ROOT}
    floors = (
        {"parse": CSV_FLOOR, "stream": CSV_STREAM} if avazu else {"parse": FLOOR, "stream": STREAM}
    )
    ratios = [("now", "parse"), ("now", "stream")]
    if args.base is not None:
        ratios += [("base", "parse"), ("now", "base")]
    head = f"{'rows':>11} {'GB':>5} |"
    for name in (*floors, *checkouts):
        head += f" {name + ' s':>8} {'GiB':>5} |"
    head += "".join(f" {a + '/' + b:>17}" for a, b in ratios)
    print(head, flush=True)
    # one unmeasured run per checkout first: its bytecode cache and C kernels are built once,
    # as after an install
    warm = args.workdir / "warm.txt"
    if avazu:  # every hour: a time split needs more than the first ones
        _avazu_file(warm, 2_000)
    else:
        with open(files[sizes[0]], "rb") as src:
            warm.write_bytes(b"".join(src.readline() for _ in range(2_000)))
    for name, root in checkouts.items():
        out = args.workdir / f"prepared_{name}_warm"
        _run(["-m", "ctrcal", "prepare", str(warm), "--out", str(out), *config], root)
        shutil.rmtree(out, ignore_errors=True)
    results = []
    for n in sizes:
        path = files[n]
        text = path.stat().st_size
        runs_floor = {
            "parse": text * PARSE_BYTES_PER_TEXT_BYTE < 0.8 * _available_bytes(),
            "stream": n >= STREAM_FROM_ROWS,
        }
        secs: dict[str, list[float]] = {k: [] for k in (*floors, *checkouts)}
        cpu: dict[str, list[float]] = {k: [] for k in secs}
        rss: dict[str, list[float]] = {k: [] for k in secs}
        for _ in range(args.repeat if n < STREAM_FROM_ROWS else args.big_repeat):
            for name, code in floors.items():
                if runs_floor[name]:
                    t, c, r = _run(["-c", code, str(path)], ROOT)
                    secs[name].append(t)
                    cpu[name].append(c)
                    rss[name].append(r)
            for name, root in checkouts.items():
                out = args.workdir / f"prepared_{name}_{n}"
                shutil.rmtree(out, ignore_errors=True)
                argv = ["-m", "ctrcal", "prepare", str(path), "--out", str(out), *config]
                t, c, r = _run(argv, root)
                shutil.rmtree(out, ignore_errors=True)
                secs[name].append(t)
                cpu[name].append(c)
                rss[name].append(r)
        row: dict[str, object] = {"rows": n, "text_gb": text / 1e9}
        line = f"{n:>11,} {text / 1e9:>5.2f} |"
        for name in secs:
            if secs[name]:
                row[f"{name}_s"] = statistics.median(secs[name])
                row[f"{name}_rss_gib"] = max(rss[name])
                line += f" {row[f'{name}_s']:>8.2f} {row[f'{name}_rss_gib']:>5.2f} |"
            else:
                line += f" {'(no room)' if name == 'parse' else '-':>14} |"
        for a, b in ratios:
            got = _ratios(secs, a, b)
            if got:
                row[f"{a}_vs_{b}"] = statistics.median(got)
                row[f"{a}_vs_{b}_rounds"] = got
            line += f" {_ratio_text(got, 17)}"
        print(line, flush=True)
        ran = [k for k in secs if cpu[k]]
        for name in ran:
            row[f"{name}_cpu_s"] = statistics.median(cpu[name])
        cpu_ratios = [
            f"{a}/{b} {_ratio_text(_ratios(cpu, a, b), 0)}"
            for a, b in ratios
            if a in ran and b in ran
        ]
        print(
            f"{'':>11} CPU s: "
            + ", ".join(f"{k} {row[f'{k}_cpu_s']:.2f}" for k in ran)
            + ("; " + ", ".join(cpu_ratios) if cpu_ratios else ""),
            flush=True,
        )
        results.append(row)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
