"""Benchmark: scoring rows/s of a served model per engine, precision and batch size, and what
reduced precision costs in test AUC.

Usage::

    python scripts/bench_serve.py [--run RUN] [--rows 200000] [--batches 1 64 4096 65536]
                                  [--rounds 3] [--seconds 0.5] [--threads N] [--clock wall|cpu]
                                  [--json out.json]
    python scripts/bench_serve.py --bucketize [--threads 1 --clock cpu]

The model is the graph ``ctrcal export`` writes (:class:`ctrcal.serving.export.ServedModel`:
ids clamped to their vocabulary, the model, the sigmoid) of ``--run``'s best model, scored on
its test split; without ``--run``, a serial MaskNet [400, 400, 400] (embedding dim 16,
reduction ratio 0.2, LayerNorm) trained for one epoch on ``--rows`` synthetic rows in a
temporary directory. Every engine scores the same rows:

* ``torch fp32``: the eager model; ``torch bf16``: the same under bf16 autocast (AMX /
  AVX512-BF16 where the CPU has them; the embeddings and numerics stay float32);
* ``onnxruntime fp32``: the ONNX export; ``onnxruntime int8``: ``ctrcal export --format onnx
  --precision int8``, the dense layers' weights quantized to int8
  (``onnxruntime.quantization.quantize_dynamic``, activations quantized per batch: VNNI /
  AMX-INT8 kernels where the CPU has them);
* ``aoti fp32``: the AOTInductor package (compiled once, a minute or more); ``aoti bf16``:
  the package of ``ctrcal export --format aoti --precision bf16`` (autocast compiled in, the
  dense layers' weights stored in bf16).

Rates: per batch size, the engines are timed round-robin (``--rounds`` rounds of at least
``--seconds`` each) and the median is reported, so all engines see the same load. On a
machine other processes keep busy, ``--threads 1 --clock cpu`` counts the process's CPU time
instead of wall time (rows per CPU-second of one core: threads that wait on a descheduled
sibling inflate wall time at small batches, not CPU time). The CPU
(``lscpu`` model name, family, model, bf16 / AMX / VNNI flags) and the load average are
printed. Accuracy: each engine scores the whole test split at batch 4,096; the table gives
its test AUC, the difference to eager fp32 and the largest |Δp|.

``--bucketize`` times eager bucketizing only: ``searchsorted`` against the comparison-and-gather
search the exported graph holds, at 9, 49 and 255 boundaries per field.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrcal.metrics import auc
from ctrcal.serving.export import ServedModel, example_inputs, export_model
from ctrcal.train.precision import compute_precision

Score = Callable[[torch.Tensor, torch.Tensor], np.ndarray]
CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx_vnni")


def cpu() -> str:
    """``lscpu``'s model name, family and model, and the reduced-precision units it lists."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    info = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("Flags", "").split())
    units = [f for f in CPU_FLAGS if f in flags] or ["none"]
    return (
        f"{info.get('Model name', '?')} (family {info.get('CPU family', '?')}, model "
        f"{info.get('Model', '?')}), {os.cpu_count()} CPUs; units: {', '.join(units)}"
    )


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def setup(args: argparse.Namespace, tmp: Path) -> tuple[torch.nn.Module, Any, Any]:
    """(eager model, feature map, test batch) of ``--run``, or of a model trained here."""
    from ctrcal.train.results import open_run
    from ctrcal.train.splits import open_split

    run_dir = args.run
    if run_dir is None:
        from bench_train import trained_run_overrides  # a sibling script: the same run

        from ctrcal.api import prepare
        from ctrcal.train.trainer import train
        from ctrcal.validate import load_config

        base = trained_run_overrides(args.rows)
        cfg = load_config(None, base)
        data = prepare(None, tmp / "data", cfg).out_dir
        train(cfg, data, tmp / "run")
        run_dir = tmp / "run"
    run = open_run(run_dir, "bench", None, device="cpu")
    test = open_split(run.data_dir, "test", "memory", torch.device("cpu")).all()
    return run.model.eval(), run.data, test


def engines(served: ServedModel, fmap: Any, tmp: Path, names: list[str]) -> dict[str, Score]:
    """Each engine's ``score(cat, num) -> probabilities``."""
    out: dict[str, Score] = {}
    example = example_inputs(fmap.vocab_sizes, fmap.num_numeric, rows=2)

    def eager(precision: torch.dtype | None) -> Score:
        def score(cat: torch.Tensor, num: torch.Tensor) -> np.ndarray:
            with torch.no_grad(), compute_precision(precision, "cpu"):
                return served(cat, num).float().numpy()

        return score

    if "torch fp32" in names:
        out["torch fp32"] = eager(None)
    if "torch bf16" in names:
        out["torch bf16"] = eager(torch.bfloat16)
    if any(n.startswith("onnxruntime") for n in names):
        import onnxruntime as ort

        path = tmp / "model.onnx"
        export_model(served, path, "onnx", example)
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()

        def session(file: Path) -> Score:
            s = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
            return lambda cat, num: s.run(
                None, {"categorical": cat.numpy(), "numeric": num.numpy()}
            )[0]

        if "onnxruntime fp32" in names:
            out["onnxruntime fp32"] = session(path)
        if "onnxruntime int8" in names:
            quantized = tmp / "model.int8.onnx"
            export_model(served, quantized, "onnx", example, precision="int8")
            out["onnxruntime int8"] = session(quantized)
    for precision in ("fp32", "bf16"):
        if f"aoti {precision}" not in names:
            continue
        path = tmp / f"model.{precision}.pt2"
        start = time.perf_counter()
        export_model(served, path, "aoti", example, precision=precision)
        print(f"  AOTInductor {precision} compile: {time.perf_counter() - start:.0f} s", flush=True)
        out[f"aoti {precision}"] = aoti(torch._inductor.aoti_load_package(str(path)))
    return out


def aoti(compiled: Any) -> Score:
    def score(cat: torch.Tensor, num: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return compiled(cat, num).numpy()

    return score


def rates(
    scores: dict[str, Score], cat: torch.Tensor, num: torch.Tensor, batch: int, args: Any
) -> dict[str, float]:
    """Median rows/s per engine at ``batch`` over ``--rounds`` round-robin rounds."""
    reps = (batch + len(cat) - 1) // len(cat)
    cat_b, num_b = cat.repeat(reps, 1)[:batch], num.repeat(reps, 1)[:batch]
    starts = list(range(0, len(cat) - batch + 1, batch)) if batch <= len(cat) else [0]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    samples: dict[str, list[float]] = {name: [] for name in scores}
    for score in scores.values():  # warm up: first calls allocate, ORT plans
        score(cat_b, num_b)
    for _ in range(args.rounds):
        for name, score in scores.items():
            rows, calls, begin = 0, 0, clock()
            while clock() - begin < args.seconds or calls < 1:
                lo = starts[calls % len(starts)]
                if batch <= len(cat):
                    score(cat[lo : lo + batch], num[lo : lo + batch])
                else:
                    score(cat_b, num_b)
                rows, calls = rows + batch, calls + 1
            samples[name].append(rows / (clock() - begin))
    return {name: statistics.median(v) for name, v in samples.items()}


def accuracy(scores: dict[str, Score], test: Any) -> dict[str, dict[str, float]]:
    """Test AUC per engine (batch 4,096), its difference to eager fp32 and the max |Δp|."""
    probs = {}
    for name, score in scores.items():
        parts = [
            score(test.categorical[i : i + 4096], test.numeric[i : i + 4096])
            for i in range(0, len(test), 4096)
        ]
        probs[name] = np.concatenate(parts).astype(np.float64)
    labels = test.label.double().numpy()
    ref = probs.get("torch fp32")
    ref_auc = float(auc(ref, labels)) if ref is not None else float("nan")
    out = {}
    for name, p in probs.items():
        a = float(auc(p, labels))
        out[name] = {
            "auc": a,
            "auc_delta": a - ref_auc,
            "max_abs_dp": float(np.abs(p - ref).max()) if ref is not None else float("nan"),
        }
    return out


def bench_bucketize(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Eager bucketizing of 13 numeric fields: ``searchsorted`` (what eager runs) against the
    graph's comparison-and-gather search (:func:`ctrcal.layers.embedding.count_below`),
    microseconds per batch (median of ``--rounds``), per boundary count and batch size."""
    from ctrcal.layers.embedding import count_below

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    out: dict[str, dict[str, float]] = {}
    print("\nbucketizing 13 fields: us per batch, searchsorted | count_below | ratio")
    for width in (9, 49, 255):
        bounds = torch.sort(torch.randn(13, width, generator=torch.Generator().manual_seed(0)))[0]
        for batch in (64, 4096, 65536):
            values = torch.randn(batch, 13)
            ways = {
                "searchsorted": lambda b=bounds, v=values: torch.searchsorted(
                    b, v.t().contiguous()
                ).t(),
                "count_below": lambda b=bounds, v=values: count_below(b, v),
            }
            timing: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    way()
                    calls, begin = 0, clock()
                    while clock() - begin < args.seconds / 4 or calls < 1:
                        way()
                        calls += 1
                    timing[name].append((clock() - begin) / calls * 1e6)
            row = {k: statistics.median(v) for k, v in timing.items()}
            out[f"{width}x{batch}"] = row
            print(
                f"  {width:>3} boundaries, batch {batch:>6,}: {row['searchsorted']:>9,.0f} | "
                f"{row['count_below']:>9,.0f} | {row['count_below'] / row['searchsorted']:.2f}x",
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", type=Path, default=None, help="a finished run (default: train one)"
    )
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows without --run")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 4096, 65536])
    parser.add_argument(
        "--engines",
        nargs="+",
        default=[
            "torch fp32",
            "torch bf16",
            "onnxruntime fp32",
            "onnxruntime int8",
            "aoti fp32",
            "aoti bf16",
        ],
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per engine and round")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: rows per CPU-second of the process (with --threads 1: of one core), which "
        "other processes' load barely changes",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--bucketize", action="store_true", help="only time eager bucketizing (see bench_bucketize)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import onnxruntime

    print(f"CPU: {cpu()}")
    print(
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"{torch.get_num_threads()} threads; load {load()}",
        flush=True,
    )
    if args.bucketize:
        result = bench_bucketize(args)
        print(f"load {load()}")
        if args.json:
            args.json.write_text(json.dumps({"cpu": cpu(), "bucketize": result}, indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as td:
        model, fmap, test = setup(args, Path(td))
        served = ServedModel(model, fmap).eval()
        scores = engines(served, fmap, Path(td), args.engines)
        acc = accuracy(scores, test)
        table = {b: rates(scores, test.categorical, test.numeric, b, args) for b in args.batches}
    unit = "rows per CPU-second" if args.clock == "cpu" else "rows/s"
    print(f"\n{unit} (median of {args.rounds} rounds; load {load()})")
    head = "| engine | " + " | ".join(f"batch {b:,}" for b in args.batches)
    print(head + " | test AUC | ΔAUC vs torch fp32 | max abs Δp |")
    print("|---" * (len(args.batches) + 4) + "|")
    for name in scores:
        cells = " | ".join(f"{table[b][name]:,.0f}" for b in args.batches)
        a = acc[name]
        print(
            f"| {name} | {cells} | {a['auc']:.5f} | {a['auc_delta']:+.5f} | {a['max_abs_dp']:.1e} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"cpu": cpu(), "rates": table, "accuracy": acc, "test_rows": len(test)}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
