"""Benchmark: the cost of noise-injection training per step (train_shift, weight_noise).

Usage::

    python scripts/bench_noise.py [--batch-size 4096] [--rounds 5] [--steps 8] [--threads N]
                                  [--vocab 100000]

Serial MaskNet [400, 400, 400], embedding dim 16, 13 numeric + 26 categorical fields, the
trainer's own step (:func:`ctrcal.train.step.train_step`) on random in-memory batches, with:
no noise; ``weight_noise`` (perturb the dense weights, restore them); a ``gaussian_numeric``
training shift in model space and in original space (log-standardised numerics); a
``categorical_corruption`` training shift. The configurations run round-robin (``--rounds``
times ``--steps`` steps) and the median step time of each is printed with its ratio to the
step without noise, measured in the same run; the CPU model comes first.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(
            line.split(":", 1)[1].strip()
            for line in out.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = "unknown CPU"
    fam = model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu family"):
                fam = line.split(":")[1].strip()
            elif line.startswith("model\t"):
                model = line.split(":")[1].strip()
            if fam != "?" and model != "?":
                break
    except OSError:
        pass
    return f"{name} (family {fam}, model {model})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=100_000, help="ids per categorical field")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from ctrcal.config import TrainConfig
    from ctrcal.core.batch import Batch
    from ctrcal.data.numeric import NumericTransform
    from ctrcal.models.masknet import MaskNet
    from ctrcal.shifts.builtin import CategoricalCorruption, GaussianNumericShift
    from ctrcal.train import step

    fc, fn, b = 26, 13, args.batch_size
    codec = NumericTransform("log_standardize", (1.0,) * fn, (1.5,) * fn)
    shifts = {
        "none": None,
        "weight_noise": None,
        "gaussian model": GaussianNumericShift([1.0] * fn, 0.25, seed=0, space="model"),
        "gaussian original": GaussianNumericShift(
            [10.0] * fn, 0.25, 0, 1.0, "original", codec.to_original, codec.to_model
        ),
        "categorical": CategoricalCorruption([args.vocab] * fc, 0.2, seed=0),
    }
    g = torch.Generator().manual_seed(0)
    numeric = torch.randn(b, fn, generator=g)
    numeric[torch.rand(b, fn, generator=g) < 0.1] = float("nan")
    batch = Batch(
        torch.randint(3, args.vocab, (b, fc), generator=g),
        numeric,
        (torch.rand(b, generator=g) < 0.25).float(),
    )
    ctxs = {}
    for name in shifts:
        torch.manual_seed(0)
        model = MaskNet(
            [args.vocab] * fc, fn, 16, hidden_units=[400, 400, 400], reduction_ratio=0.2
        )
        cfg = TrainConfig(weight_noise=1e-4 if name == "weight_noise" else 0.0)
        opt = step.make_optimizer(model, cfg)
        ctxs[name] = step.make_step_context(model, opt, cfg, torch.device("cpu"), None)
        ctxs[name].model.train()
    times: dict[str, list[float]] = {k: [] for k in shifts}
    print(f"CPU: {cpu_name()}; torch threads {torch.get_num_threads()}; batch {b}")
    for r in range(args.rounds + 1):  # round 0 warms up
        for name, shift in shifts.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step.train_step(ctxs[name], shift(batch) if shift is not None else batch)
            if r:
                times[name].append((time.perf_counter() - t0) / args.steps)
    base = statistics.median(times["none"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:18s} {med * 1e3:8.1f} ms/step  {b / med:9.0f} rows/s  x{med / base:.3f}")


if __name__ == "__main__":
    main()
