"""Time :class:`~ctrcal.serving.encoding.RawRowEncoder` per call and per row.

A server encodes the raw rows of each request; the encoder checks them with ``prepare``'s own
row checks (one polars query per call), so a call has a fixed cost whatever its size. This
prints the median time of one ``encode`` call at a few batch sizes, on generated Criteo rows
(dac layout) prepared into a temporary folder, and the CPU (``lscpu`` name), since CPUs differ.

Usage::

    python scripts/bench_encoding.py
    python scripts/bench_encoding.py --batches 1 10 100 1000 --seconds 2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    names = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")]
    return names[0] if names else "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--seconds", type=float, default=1.0, help="per batch size")
    args = parser.parse_args()

    from ctrcal.api import prepare
    from ctrcal.config import Config
    from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
    from ctrcal.preparation.synthetic import generate_frame, write_criteo
    from ctrcal.serving.encoding import RawRowEncoder

    with tempfile.TemporaryDirectory() as tmp:
        frame, _ = generate_frame(max(5_000, max(args.batches)), seed=0)
        path = write_criteo(frame, Path(tmp) / "train.txt", "dac")
        cfg = Config()
        cfg.features.min_count = 2
        out = prepare([path], Path(tmp) / "data", cfg).out_dir
        names = [LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS]
        lines = path.read_text().splitlines()
        rows = [dict(zip(names, line.split("\t"), strict=True)) for line in lines]
        encoder = RawRowEncoder(out)
        print(f"CPU: {_cpu()}")
        print(f"{'rows':>6} {'ms/call':>9} {'us/row':>8}")
        for n in args.batches:
            batch = rows[:n]
            encoder.encode(batch)
            times = []
            stop = time.perf_counter() + args.seconds
            while time.perf_counter() < stop or len(times) < 5:
                t = time.perf_counter()
                encoder.encode(batch)
                times.append(time.perf_counter() - t)
            ms = statistics.median(times) * 1e3
            print(f"{n:>6} {ms:>9.2f} {ms * 1e3 / n:>8.1f}")


if __name__ == "__main__":
    main()
