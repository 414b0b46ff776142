"""Forward+backward time of MCLayerNorm against F.layer_norm on the current device.

    python scripts/bench_norms.py                      # default shapes, f=0.8, every backend
    python scripts/bench_norms.py --fraction 0.5 --threads 1 --repeats 50
    python scripts/bench_norms.py --compile            # also torch.compile (slow to build)
    python scripts/bench_norms.py --clock cpu --threads 1   # CPU time: robust to other load
    python scripts/bench_norms.py --step               # also the MaskNet training step
    python scripts/bench_norms.py --dtype bf16         # bf16 input and gradient
    python scripts/bench_norms.py --backends c --shapes 0   # the C kernel at (4096, 400) only

Freed memory stays in the process's heap (:func:`ctrcal.train.cpu_memory.retain_freed_memory`,
as the training loop runs): otherwise glibc hands every activation-sized block back to the
system on ``free`` and each timed call pays a page fault per 4 KiB it writes, a cost that
depends on how many blocks a candidate allocates rather than on its arithmetic.
``--release-memory`` keeps glibc's defaults.

``--clock cpu`` measures this process's CPU time (all its threads) instead of wall time, so
other processes on a shared machine barely change the figures. ``--step`` times the training
step of serial MaskNet [400, 400, 400], embedding dim 16, 13 + 26 fields (the trainer's own
step on random batches of 4096 rows) with per-field LayerNorm vs per-field MC-LayerNorm on
the embeddings (``emb_norm``; the MaskBlocks keep LayerNorm), and with MC-LayerNorm in both
places vs LayerNorm in both.

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
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ctrcal.core.utils import cpu_model_name
from ctrcal.layers.kernels.mcln_kernel import kernel_available
from ctrcal.layers.mc_layernorm.functional import grouped_layer_norm, mc_grouped_layer_norm
from ctrcal.layers.mc_layernorm.module import MCLayerNorm

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
    dtype: torch.dtype = torch.float32,
    only: tuple[str, ...] | None = None,
) -> dict[str, tuple[float, float]]:
    torch.manual_seed(0)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(shape, device=device, dtype=dtype)
    backends = ["torch"] + (["c"] if device.type == "cpu" and kernel_available() else [])
    if device.type == "cuda":
        backends.append("triton")
    if only:
        backends = [b for b in backends if b in only]
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


CLOCK: Callable[[], float] = time.perf_counter


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
            start = CLOCK()
            run()
            _sync(device)
            times[name].append(CLOCK() - start)
    return {name: (statistics.median(ts) * 1e3, min(ts) * 1e3) for name, ts in times.items()}


def bench_step(repeats: int, batch: int = 4096) -> None:
    """MaskNet training step: per-field LN vs per-field MC-LN (and MC-LN everywhere)."""
    from ctrcal.core.batch import Batch
    from ctrcal.core.norm_spec import NormSpec
    from ctrcal.models.masknet import MaskNet
    from ctrcal.train import step
    from ctrcal.validate import load_config

    vocab = [1_000_000 // 26] * 26
    g = torch.Generator().manual_seed(0)
    cat = torch.stack([torch.randint(0, v, (batch,), generator=g) for v in vocab], 1)
    num = torch.randn(batch, 13, generator=g)
    data = Batch(cat, num, (torch.rand(batch, generator=g) < 0.25).float())
    cfg = load_config(None, ["train.emb_l2=1e-5"])
    mc = NormSpec("mclayernorm", {"fraction": 0.8})
    ln = NormSpec("layernorm")
    setups = {
        "emb LN, net LN": (ln, ln),
        "emb MC-LN, net LN": (mc, ln),
        "emb MC-LN, net MC-LN": (mc, mc),
    }
    steps = {}
    for name, (emb, net) in setups.items():
        torch.manual_seed(0)
        model = MaskNet(
            vocab,
            13,
            embedding_dim=16,
            hidden_units=[400, 400, 400],
            reduction_ratio=0.2,
            emb_norm=emb,
            net_norm=net,
        )
        opt = step.make_optimizer(model, cfg.train)
        ctx = step.make_step_context(model, opt, cfg.train, torch.device("cpu"), None)
        steps[name] = lambda ctx=ctx: step.train_step(ctx, data)
    result = _time(steps, torch.device("cpu"), repeats)
    base_med, base_min = result["emb LN, net LN"]
    print(f"\nMaskNet training step, batch {batch} (ms; ratio to per-field LayerNorm)")
    for name, (med, low) in result.items():
        print(f"{name:>22} {med:>10.2f} {med / base_med:>6.3f} {low:>10.2f} {low / base_min:>6.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--step", action="store_true", help="also the MaskNet training step")
    parser.add_argument("--no-layers", action="store_true", help="skip the layer timings")
    parser.add_argument(
        "--backends",
        default="",
        help="comma-separated MC-LayerNorm backends to time (default: every one available); "
        "the pure-torch path moves several times the memory of the others, which leaves the "
        "caches cold for the candidate timed after it",
    )
    parser.add_argument(
        "--shapes",
        default="",
        help="comma-separated indices into the shapes below (default: all), e.g. 0 for "
        "(4096, 400) only",
    )
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="the layers' input and output gradient (bf16: as under bf16 training; the "
        "affine parameters stay float32)",
    )
    parser.add_argument(
        "--release-memory",
        action="store_true",
        help="glibc's default of returning freed blocks to the system (not as in training)",
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    memory = "released (glibc defaults)"
    if any(key.startswith("MALLOC_") for key in os.environ):
        memory = "as the MALLOC_* environment sets"
    elif not args.release_memory:
        from ctrcal.train.cpu_memory import retain_freed_memory

        if retain_freed_memory():
            memory = "kept in the heap"
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    print(
        f"device={device} threads={torch.get_num_threads()} fraction={args.fraction} "
        f"repeats={args.repeats} clock={args.clock} dtype={args.dtype} "
        f"torch={torch.__version__} "
        f"load={_load()}\ncpu: {cpu_model_name()}; freed memory: {memory}"
    )
    if args.step and args.no_layers:
        bench_step(args.repeats)
        return
    print(
        f"{'input':>14} {'normalized':>10} {'candidate':>18} "
        f"{'median ms':>10} {'ratio':>6} {'min ms':>8} {'ratio':>6}"
    )
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    only = tuple(b.strip() for b in args.backends.split(",") if b.strip()) or None
    picked = [int(i) for i in args.shapes.split(",") if i.strip()] or range(len(CASES))
    for shape, normalized in (CASES[i] for i in picked):
        try:
            result = bench_case(
                shape, normalized, args.fraction, device, args.repeats, args.compile, dtype, only
            )
        except RuntimeError as exc:  # a layer without a path for this dtype
            print(f"{str(shape):>14} {str(normalized):>10} skipped: {exc}")
            continue
        base_med, base_min = result["layer_norm"]
        for name, (med, low) in result.items():
            print(
                f"{str(shape):>14} {str(normalized):>10} {name:>18} "
                f"{med:>10.3f} {med / base_med:>6.2f} {low:>8.3f} {low / base_min:>6.2f}"
            )
    if args.step:
        bench_step(args.repeats)
    print(f"load average after: {_load()}")


def _load() -> str:
    try:
        return "/".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


if __name__ == "__main__":
    main()
