"""Forward+backward time of MCLayerNorm against F.layer_norm on the current device.

    python scripts/bench_norms.py                      # default shapes, f=0.8, every backend
    python scripts/bench_norms.py --fraction 0.5 --threads 1 --repeats 50
    python scripts/bench_norms.py --compile            # also torch.compile (slow to build)

Shapes: (4096, 400) normalized over 400 (a MaskBlock's hidden layer); (4096, 39, 16)
normalized over the last dim with one affine pair (``per-field`` below: with one affine pair
per field, as FieldNorm runs it: the LayerNorm reference is FieldNorm's fused LayerNorm path
and MC-LN is the grouped per-field call); and (4096, 39, 16) over (39, 16). On CUDA the Triton
kernel is timed too.
All candidates are timed interleaved in one loop, so a busy machine slows them alike; the
ratios are the numbers to read. Times are in milliseconds: the median and the minimum over
the repeats (on a shared, loaded machine the minimum is the steadier of the two).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ctrcal.layers.mc_grouped import grouped_layer_norm
from ctrcal.layers.mc_layernorm import MCLayerNorm, kernel_available, mc_grouped_layer_norm

CASES = [
    ((4096, 400), (400,)),
    ((4096, 39, 16), (16,)),
    ((4096, 39, 16), "per-field"),
    ((4096, 39, 16), (39, 16)),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor):
    def run() -> None:
        x.grad = None
        fn(x).backward(g)

    return run


def bench_case(
    shape: tuple[int, ...],
    normalized: tuple[int, ...] | str,
    fraction: float,
    device: torch.device,
    repeats: int,
    use_compile: bool,
) -> dict[str, tuple[float, float]]:
    torch.manual_seed(0)
    x = torch.randn(shape, device=device, requires_grad=True)
    g = torch.randn(shape, device=device)
    backends = ["torch"] + (["c"] if device.type == "cpu" and kernel_available() else [])
    if device.type == "cuda":
        backends.append("triton")
    if normalized == "per-field":
        fields, dim = shape[-2], shape[-1]
        w = torch.ones(fields, dim, device=device, requires_grad=True)
        b = torch.zeros(fields, dim, device=device, requires_grad=True)
        candidates = {"layer_norm": _step(lambda t: grouped_layer_norm(t, w, b, 1e-5), x, g)}
        for backend in backends:
            candidates[f"mc[{backend}]"] = _step(
                lambda t, backend=backend: mc_grouped_layer_norm(
                    t, w, b, 1e-5, fraction, backend=backend
                ),
                x,
                g,
            )
        return _time(candidates, device, repeats)
    ln = torch.nn.LayerNorm(normalized, device=device)
    candidates: dict[str, Callable[[], None]] = {
        "layer_norm": _step(lambda t: F.layer_norm(t, normalized, ln.weight, ln.bias), x, g)
    }
    for backend in backends:
        mc = MCLayerNorm(normalized, fraction=fraction, backend=backend, device=device).train()
        candidates[f"mc[{backend}]"] = _step(mc, x, g)
    if use_compile:
        mc = MCLayerNorm(normalized, fraction=fraction, backend="torch", device=device).train()
        candidates["mc[torch.compile]"] = _step(torch.compile(mc), x, g)
    return _time(candidates, device, repeats)


def _time(
    candidates: dict[str, Callable[[], None]], device: torch.device, repeats: int
) -> dict[str, tuple[float, float]]:
    for run in candidates.values():  # warm up (and build / compile)
        for _ in range(3):
            run()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            _sync(device)
            start = time.perf_counter()
            run()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(ts) * 1e3, min(ts) * 1e3) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    print(
        f"device={device} threads={torch.get_num_threads()} fraction={args.fraction} "
        f"repeats={args.repeats} torch={torch.__version__}"
    )
    print(
        f"{'input':>14} {'normalized':>10} {'candidate':>18} "
        f"{'median ms':>10} {'ratio':>6} {'min ms':>8} {'ratio':>6}"
    )
    for shape, normalized in CASES:
        result = bench_case(shape, normalized, args.fraction, device, args.repeats, args.compile)
        base_med, base_min = result["layer_norm"]
        for name, (med, low) in result.items():
            print(
                f"{str(shape):>14} {str(normalized):>10} {name:>18} "
                f"{med:>10.3f} {med / base_med:>6.2f} {low:>8.3f} {low / base_min:>6.2f}"
            )


if __name__ == "__main__":
    main()
