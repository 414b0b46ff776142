"""Benchmark: streamed vs in-memory batches -- rows/s of an epoch, and peak RSS.

Usage::

    python scripts/bench_stream.py [--rows 1000000] [--batch-size 4096] [--rounds 2]
                                   [--workdir DIR] [--no-train] [--buffer-rows 1048576]
                                   [--threads N] [--data PREPARED_DIR]

A synthetic dataset of ``--rows`` rows is prepared once (kept in ``--workdir``). Then, for each
``ParquetCTRData`` mode (``memory`` and ``stream``), each in a fresh child process so that its
peak RSS is its own:

* **iterate**: one shuffled epoch of the train split, batches consumed and dropped (the
  loader alone: memory mode's per-batch gather vs stream mode's parquet decoding, block
  shuffle and background prefetch). rows/s of the epoch, and of load + epoch (memory mode
  reads the whole split first; stream mode starts at once);
* **train**: one epoch of a small serial MaskNet through the trainer
  (``ctrcal.train.trainer.train``, ``train.data_mode`` memory or stream, fp32, CPU);
  rows/s is the trainer's own ``train_rows_per_s`` (the training epoch only, not the
  evaluation). If the trainer cannot be used, the same model is stepped here (BCE + Adam) on
  the loader's batches instead, and the output says so.

The modes are measured round-robin ``--rounds`` times, so both see the same machine load; the
stream/memory ratio of each round and their median are what to read (the goal is >= 0.95 for
training); the best of each mode is printed too. On a machine other processes keep busy,
``--threads 1`` avoids torch's thread team stalling on preempted threads, which swamps any
difference between the modes. Peak RSS is VmHWM of the child (reset by exec, unlike
``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEAK = "from ctrcal.core.utils import peak_rss_mib\n"

ITERATE = (
    PEAK
    + r"""
import json, sys, time
import torch
from ctrcal.data.loader import ParquetCTRData
data_dir, mode, batch, buffer_rows, threads = sys.argv[1:6]
if int(threads) > 0:
    torch.set_num_threads(int(threads))
start = time.perf_counter()
data = ParquetCTRData(data_dir, "train", mode=mode, buffer_rows=int(buffer_rows))
loaded = time.perf_counter()
rows = batches = 0
checksum = torch.zeros((), dtype=torch.int64)
for b in data.batches(int(batch), shuffle=True, seed=0):
    rows += len(b)
    batches += 1
    if batches % 64 == 0:  # touch the data now and then, as a consumer would
        checksum += b.categorical[0].sum()
end = time.perf_counter()
print(json.dumps({"rows": rows, "load_s": loaded - start, "epoch_s": end - loaded,
                  "peak_mib": peak_rss_mib()}))
"""
)

BASELINE = (
    PEAK
    + r"""
import json
import torch, pyarrow.parquet, polars
from ctrcal.data.loader import ParquetCTRData
from ctrcal.train.trainer import train
print(json.dumps({"peak_mib": peak_rss_mib()}))
"""
)

TRAIN = (
    PEAK
    + r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
from ctrcal.config import Config
data_dir, mode, batch, buffer_rows, threads = sys.argv[1:6]
if int(threads) > 0:
    torch.set_num_threads(int(threads))
cfg = Config()
cfg.model.variant = "serial"
cfg.model.embedding_dim = 8
cfg.model.hidden_units = [64, 64]
cfg.train.epochs = 1
cfg.train.batch_size = int(batch)
cfg.train.eval_batch_size = 16384
cfg.train.device = "cpu"
cfg.train.precision = "fp32"
cfg.train.data_mode = mode
cfg.train.progress = False
how = "trainer"
try:
    from ctrcal.train.trainer import train
    with tempfile.TemporaryDirectory() as run_dir:
        res = train(cfg, data_dir, Path(run_dir) / "run")
    rows_per_s, rows = res.train_rows_per_s, None
except Exception as exc:  # an API the trainer no longer has: step the model here
    how = f"own loop ({type(exc).__name__}: {exc})"
    import torch.nn.functional as F
    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.models.build import create_model
    torch.manual_seed(0)
    data = ParquetCTRData(data_dir, "train", mode=mode, buffer_rows=int(buffer_rows))
    model = create_model(cfg.model, data.feature_map)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = 0
    start = time.perf_counter()
    for b in data.batches(int(batch), shuffle=True, seed=0):
        opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(b.inputs()), b.label)
        loss.backward()
        opt.step()
        rows += len(b)
    rows_per_s = rows / (time.perf_counter() - start)
print(json.dumps({"rows_per_s": rows_per_s, "how": how, "peak_mib": peak_rss_mib()}))
"""
)


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _prepare(rows: int, workdir: Path) -> Path:
    from ctrcal.api import prepare
    from ctrcal.config import Config

    cfg = Config()
    cfg.data.synthetic.rows = rows
    cfg.data.synthetic.seed = 0
    cfg.features.min_count = 5
    t = time.perf_counter()
    res = prepare(None, workdir / f"data_{rows}", cfg)
    what = "reused" if res.reused else f"prepared in {time.perf_counter() - t:.1f} s"
    print(f"data: {res.out_dir} ({what}); train {res.rows['train']:,} rows")
    return res.out_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    # smaller than the split, as it is for data larger than memory (the library's default
    # buffer is 1M rows)
    ap.add_argument("--buffer-rows", type=int, default=1 << 18)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctrcal-bench-stream"
    )
    ap.add_argument("--no-train", action="store_true", help="only the loader iteration")
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="an existing prepared directory (e.g. bench_prepare.py --keep's) "
        "instead of --rows of generated data",
    )
    args = ap.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    data_dir = args.data if args.data is not None else _prepare(args.rows, args.workdir)
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; batch "
        f"{args.batch_size}, stream buffer {args.buffer_rows:,} rows"
    )
    base = _child(BASELINE)["peak_mib"]
    print(f"peak RSS of the imports alone (torch, pyarrow, polars, ctrcal): {base:,.0f} MiB")
    common = [str(data_dir), "", str(args.batch_size), str(args.buffer_rows), str(args.threads)]
    modes = ("memory", "stream")
    best: dict[tuple[str, str], dict] = {}
    ratios: dict[str, list[float]] = {"iterate": [], "train": []}

    def keep(kind: str, mode: str, out: dict, key: str) -> None:
        old = best.get((kind, mode))
        if old is None or out[key] > old[key]:
            best[(kind, mode)] = out

    for r in range(args.rounds):
        speed = {}
        for mode in modes:
            common[1] = mode
            out = _child(ITERATE, *common)
            out["rows_per_s"] = out["rows"] / out["epoch_s"]
            out["with_load"] = out["rows"] / (out["epoch_s"] + out["load_s"])
            print(
                f"  round {r + 1} iterate {mode:6s}: {out['rows_per_s']:>12,.0f} rows/s "
                f"(with load {out['with_load']:,.0f}), peak RSS {out['peak_mib']:,.0f} MiB"
            )
            keep("iterate", mode, out, "rows_per_s")
            speed[mode] = out["rows_per_s"]
        ratios["iterate"].append(speed["stream"] / speed["memory"])
        if args.no_train:
            continue
        for mode in modes:
            common[1] = mode
            out = _child(TRAIN, *common)
            print(
                f"  round {r + 1} train   {mode:6s}: {out['rows_per_s']:>12,.0f} rows/s, "
                f"peak RSS {out['peak_mib']:,.0f} MiB  [{out['how']}]"
            )
            keep("train", mode, out, "rows_per_s")
            speed[mode] = out["rows_per_s"]
        ratios["train"].append(speed["stream"] / speed["memory"])

    for kind, values in ratios.items():
        if values:
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(
                f"stream/memory {kind} per round: {shown} (median {statistics.median(values):.2f})"
            )
    print("best of rounds:")
    for kind in ("iterate", "train"):
        if (kind, "memory") not in best:
            continue
        mem, st = best[(kind, "memory")], best[(kind, "stream")]
        extra = ""
        if kind == "iterate":
            extra = f"; with load: stream/memory {st['with_load'] / mem['with_load']:.2f}"
        print(
            f"  {kind:7s}: memory {mem['rows_per_s']:,.0f} rows/s ({mem['peak_mib']:,.0f} MiB), "
            f"stream {st['rows_per_s']:,.0f} rows/s ({st['peak_mib']:,.0f} MiB): "
            f"stream/memory {st['rows_per_s'] / mem['rows_per_s']:.2f}{extra}"
        )
    if ratios["train"]:
        ratio = statistics.median(ratios["train"])
        print(
            f"goal: training stream/memory >= 0.95 (median of rounds): "
            f"{'met' if ratio >= 0.95 else 'NOT met'} ({ratio:.2f})"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
