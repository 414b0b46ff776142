"""Throughput of the shifts on a batch, against the model's own forward pass.

Prints rows/s of every shift of the registry (Gaussian noise in original and model space,
categorical corruption) on Criteo-shaped batches (13 numerics, 26 categoricals), and the
forward pass of a small MaskNet on the same batch, so the cost a shift adds to an evaluation
is a ratio measured in one run. Names the CPU.

    python scripts/bench_shifts.py [--rows 65536] [--repeats 20] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass

import torch

from ctrcal.core.batch import Batch
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, NUMERIC_COLUMNS
from ctrcal.shifts.registry import create_shift


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class _Codec:
    """Sign-log + standardise, the default numeric transform, for a feature map stand-in."""

    has_original_stats = True

    def __init__(self, n: int) -> None:
        self.center = torch.full((n,), 1.5, dtype=torch.float64)
        self.scale = torch.full((n,), 1.2, dtype=torch.float64)
        self.original_std = tuple([25.0] * n)

    def to_original(self, z):
        t = z.double() * self.scale.to(z.device) + self.center.to(z.device)
        return (torch.sign(t) * torch.expm1(t.abs())).to(z.dtype)

    def to_model(self, x):
        t = torch.sign(x.double()) * torch.log1p(x.double().abs())
        return ((t - self.center.to(x.device)) / self.scale.to(x.device)).to(x.dtype)


@dataclass
class _FeatureMap:
    vocab_sizes: list
    numeric_std: list
    numeric_fields: list

    def numeric_codec(self):
        return _Codec(len(self.numeric_fields))


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    fc, fn = len(CATEGORICAL_COLUMNS), len(NUMERIC_COLUMNS)
    vocab = [100_000] * fc
    fm = _FeatureMap(vocab, [1.0] * fn, list(NUMERIC_COLUMNS))
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        torch.randint(0, 100_000, (args.rows, fc), generator=g).to(device),
        torch.randn(args.rows, fn, generator=g).to(device),
        torch.zeros(args.rows).to(device),
    )
    from ctrcal.models.masknet import MaskNet

    model = MaskNet(vocab, fn, 16, hidden_units=[400, 400, 400]).to(device).eval()
    with torch.no_grad():
        fwd = _time(lambda: model(batch.inputs()), args.repeats, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"device: {where}; torch threads {torch.get_num_threads()}; batch {args.rows:,} rows")
    print(f"{'what':44s} {'ms/batch':>9s} {'Mrows/s':>8s} {'vs forward':>10s}")
    print(
        f"{'MaskNet forward (emb 16, [400 x 3])':44s} {1e3 * fwd:9.2f} "
        f"{args.rows / fwd / 1e6:8.2f} {1.0:10.2f}"
    )
    specs = [
        ("gaussian_numeric, space original, s = 0.25", {"name": "gaussian_numeric"}, 0.25),
        (
            "gaussian_numeric, space model, s = 0.25",
            {"name": "gaussian_numeric", "space": "model"},
            0.25,
        ),
        ("categorical_corruption, p = 0.2", {"name": "categorical_corruption"}, 0.2),
    ]
    for label, spec, s in specs:
        shift = create_shift(spec, fm, intensity=s, seed=0)
        t = _time(lambda shift=shift: shift.apply(batch), args.repeats, device)
        print(f"{label:44s} {1e3 * t:9.2f} {args.rows / t / 1e6:8.2f} {t / fwd:10.2f}")


if __name__ == "__main__":
    main()
