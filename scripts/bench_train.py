"""Benchmark: training rows/s of serial MaskNet, LayerNorm vs MC-LayerNorm, fp32 vs bf16.

Usage::

    python scripts/bench_train.py [--batch-sizes 4096 10000] [--precisions fp32 bf16]
                                  [--dropout 0 0.2] [--rounds 5] [--steps 8] [--threads N]
                                  [--vocab 1000000] [--auc-rows 200000] [--json out.json]

The model is the one the throughput goal is stated for: serial MaskNet [400, 400, 400],
embedding dim 16, reduction ratio 0.2, 13 numeric + 26 categorical fields (≈5.3 MFLOP per
row forward + backward), ``net_norm`` layernorm or mclayernorm (fraction 0.8). Every step is
the trainer's own (:func:`ctrcal.train.step.train_step`: BCE, backward, whole-table
embedding L2, gradient clipping, fused Adam) on random in-memory batches (10 % NaN
numerics), so the numbers are the training loop's, not a bare forward pass.

``--dropout`` adds the dropout after every MaskBlock (0.2 in the BARS settings); with several
rates the step-time ratio to no dropout is printed.

Every figure comes with a reference measured in the same run: besides the ratios between
configurations, each round also times one float32 matrix product ``[batch, 400] @ [400,
400]`` with the same matmul library, and the step is reported as a share of the *GEMM-bound
limit*: the rows/s the step's matrix products alone (6 x the FLOPs of its linear layers per
row: forward, input gradient, weight gradient) would allow at that product's rate. The CPU
model is printed first (``lscpu``, with family and model numbers).

The configurations are measured round-robin (``--rounds`` times ``--steps`` steps each) and
the median per configuration is reported: when other processes load the machine, all
configurations see the same load, and the ratios (MC-LN / LN step time, bf16 speed-up) stay
meaningful even when the absolute rows/s do not. The load average is printed before and
after. On a machine that other processes keep busy, ``--threads 1 --clock cpu`` measures the
process's CPU time instead of wall time: rows per CPU-second of one core, which the load
barely changes (multiply by the cores' parallel efficiency for a machine-wide estimate).

``--auc-rows N`` also trains the same model for one epoch on N synthetic rows (``ctrcal
synth`` generator, prepared in a temporary directory) in fp32 and in bf16 autocast with the
same seeds (``--auc-seeds``) and reports both test AUCs, mean and spread over the seeds: the
accuracy cost of bf16 on the CPU next to the seed-to-seed noise.

``--logging-rows N`` measures what run tracking costs: one-epoch training runs on N synthetic
rows (batch ``--logging-batch``), alternately without loggers and with ``train.loggers:
[tensorboard, mlflow]`` at the default ``train.log_every``, ``--logging-rounds`` times each;
the median training rows/s of each and their ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ctrcal.core.batch import Batch
from ctrcal.core.criteo_schema import NUM_CATEGORICAL, NUM_NUMERIC
from ctrcal.core.utils import cpu_model_name
from ctrcal.models.masknet import MaskNet
from ctrcal.train import step, trainer
from ctrcal.train.cpu_matmul import cpu_matmul
from ctrcal.train.precision import (
    cpu_bf16_probe,
    cpu_bf16_units,
    precision_name,
    resolve_precision,
)
from ctrcal.validate import load_config

MODEL = {"hidden_units": [400, 400, 400], "embedding_dim": 16, "reduction_ratio": 0.2}
NORMS = {"layernorm": "layernorm", "mclayernorm": {"name": "mclayernorm", "fraction": 0.8}}


def trained_run_overrides(rows: int) -> list[str]:
    """The config of the benchmarks' trained run (``MODEL`` on ``rows`` synthetic rows, one
    epoch), as ``key=value`` overrides; ``scripts/bench_serve.py`` scores the same run."""
    return [
        f"data.synthetic.rows={rows}",
        "data.synthetic.seed=0",
        "features.min_count=5",
        *(f"model.{k}={json.dumps(v, separators=(',', ':'))}" for k, v in MODEL.items()),
        "train.batch_size=4096",
        "train.epochs=1",
        "train.progress=false",
        f"train.num_threads={torch.get_num_threads()}",
    ]


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def _batch(batch_size: int, vocab: list[int], seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, v, (batch_size,), generator=g) for v in vocab], 1)
    num = torch.randn(batch_size, NUM_NUMERIC, generator=g)
    num[torch.rand(batch_size, NUM_NUMERIC, generator=g) < 0.1] = float("nan")
    label = (torch.rand(batch_size, generator=g) < 0.25).float()
    return Batch(cat, num, label)


def _context(
    norm: str, vocab: list[int], precision: str, emb_l2: float, dropout: float = 0.0
) -> step.StepContext:
    from ctrcal.core.norm_spec import NormSpec

    spec = NORMS[norm]
    spec = NormSpec(spec) if isinstance(spec, str) else NormSpec(spec["name"], {"fraction": 0.8})
    torch.manual_seed(0)
    model = MaskNet(vocab, NUM_NUMERIC, net_norm=spec, dropout=dropout, **MODEL)
    cfg = load_config(None, [f"train.emb_l2={emb_l2}", "train.grad_clip=10.0"])
    opt = step.make_optimizer(model, cfg.train)
    amp = torch.bfloat16 if precision == "bf16" else None
    return step.make_step_context(model, opt, cfg.train, torch.device("cpu"), amp)


def gemm_flops_per_row(model: torch.nn.Module) -> int:
    """FLOPs per row of a training step's matrix products: 3 products of 2*in*out per linear."""
    return sum(
        6 * m.in_features * m.out_features
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )


def _gemm_seconds(a: torch.Tensor, w: torch.Tensor, clock, reps: int = 3) -> float:
    start = clock()
    for _ in range(reps):
        a @ w
    return (clock() - start) / reps


def bench_throughput(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    per_field = max(1, args.vocab // NUM_CATEGORICAL)
    vocab = [per_field] * NUM_CATEGORICAL
    contexts: dict[tuple, step.StepContext] = {}
    for n in args.norms:
        for d in args.dropout:
            shared = _context(n, vocab, "fp32", args.emb_l2, d)
            for p in args.precisions:  # one model per norm; autocast is a per-step switch
                ctx = step.StepContext(**{**shared.__dict__})
                ctx.amp_dtype = torch.bfloat16 if p == "bf16" else None
                contexts[n, d, p] = ctx
    batches = {b: [_batch(b, vocab, s) for s in range(2)] for b in args.batch_sizes}
    configs = [
        (b, p, n, d)
        for b in args.batch_sizes
        for p in args.precisions
        for n in args.norms
        for d in args.dropout
    ]
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    gemm = {b: (torch.randn(b, 400), torch.randn(400, 400)) for b in args.batch_sizes}
    gemm_times: dict[int, list[float]] = {b: [] for b in args.batch_sizes}
    for c in configs:  # warm-up: allocator, oneDNN kernels, optimizer state
        b, p, n, d = c
        for i in range(args.warmup):
            step.train_step(contexts[n, d, p], batches[b][i % 2])
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for b in args.batch_sizes:
        _gemm_seconds(*gemm[b], clock, reps=1)
    for r in range(args.rounds):
        for b in args.batch_sizes:
            gemm_times[b].append(_gemm_seconds(*gemm[b], clock))
        for c in configs if r % 2 == 0 else reversed(configs):
            b, p, n, d = c
            ctx = contexts[n, d, p]
            start = clock()
            for i in range(args.steps):
                step.train_step(ctx, batches[b][i % 2])
            times[c].append((clock() - start) / args.steps)
    flops_row = gemm_flops_per_row(next(iter(contexts.values())).model)
    out: dict[str, dict[str, float]] = {}
    for (b, p, n, d), ts in times.items():
        med = statistics.median(ts)
        gemm_rate = 2 * b * 400 * 400 / statistics.median(gemm_times[b])
        limit = gemm_rate / flops_row
        out[f"{b}/{p}/{n}/{d}"] = {
            "batch": b,
            "precision": p,
            "norm": n,
            "dropout": d,
            "step_ms": med * 1e3,
            "rows_per_s": b / med,
            "gemm_gflops": gemm_rate / 1e9,
            "share_of_gemm_limit": (b / med) / limit,
        }
    return out


def bf16_units() -> str:
    """This CPU's bf16 units, as :func:`ctrcal.train.precision.cpu_bf16_units` reads them."""
    units = cpu_bf16_units()
    return "unknown" if units is None else ", ".join(units) or "none"


def bench_auc(args: argparse.Namespace) -> dict[str, Any]:
    """One-epoch training runs on the same prepared synthetic rows, for every seed every
    precision in turn (fp32, bf16, fp32, bf16, ...): the trainer's rows/s and the test AUC of
    each, and the load average beside each run."""
    from ctrcal.api import prepare

    base = [*trained_run_overrides(args.auc_rows), f"train.cpu_matmul={args.cpu_matmul}"]
    result: dict[str, Any] = {
        p: {"auc": [], "logloss": [], "rows_per_s": [], "load": []} for p in args.precisions
    }
    with tempfile.TemporaryDirectory(prefix="bench-train-") as td:
        data = Path(args.data) if args.data else Path(td) / "data"
        if not (data / "feature_map.json").exists():
            data = prepare(None, data, load_config(None, base)).out_dir
        for seed in range(args.auc_seeds):  # training seeds: the noise to compare against
            for p in args.precisions:
                cfg = load_config(None, [*base, f"train.precision={p}", f"train.seed={seed}"])
                res = trainer.train(cfg, data, Path(td) / f"run-{p}-{seed}")
                out = result[p]
                out["auc"].append(res.test["auc"])
                out["logloss"].append(res.test["logloss"])
                out["rows_per_s"].append(res.train_rows_per_s)
                out["load"].append(_load())
                print(
                    f"  seed {seed} {p}: {res.train_rows_per_s:,.0f} rows/s, test AUC "
                    f"{res.test['auc']:.4f} (load {out['load'][-1]})",
                    flush=True,
                )
    return result


def bench_logging(args: argparse.Namespace) -> dict[str, Any]:
    """Training rows/s without and with both loggers, measured alternately, and the seconds
    spent inside the loggers' step calls against the epoch's training seconds (see above)."""
    from ctrcal.api import prepare
    from ctrcal.train import loggers as loggers_module

    spent = [0.0]
    step = loggers_module.RunLoggers.step

    def timed_step(self, *a: Any) -> None:
        t0 = time.perf_counter()
        step(self, *a)
        spent[0] += time.perf_counter() - t0

    base = [
        f"data.synthetic.rows={args.logging_rows}",
        "data.synthetic.seed=0",
        "features.min_count=5",
        f"train.batch_size={args.logging_batch}",
        "train.epochs=1",
        "train.progress=false",
        f"train.cpu_matmul={args.cpu_matmul}",
    ]
    speeds: dict[str, list[float]] = {"none": [], "tensorboard+mlflow": []}
    loggers = {"none": "[]", "tensorboard+mlflow": "[tensorboard, mlflow]"}
    in_loggers, training = 0.0, 0.0
    loggers_module.RunLoggers.step = timed_step  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-logging-") as td:
            data = prepare(None, Path(td) / "data", load_config(None, base)).out_dir
            for r in range(args.logging_rounds):
                for name, spec in loggers.items():
                    cfg = load_config(None, [*base, f"train.loggers={spec}"])
                    spent[0] = 0.0
                    res = trainer.train(cfg, data, Path(td) / f"run-{name}-{r}")
                    speeds[name].append(res.train_rows_per_s)
                    if name != "none":
                        in_loggers += spent[0]
                        training += sum(h["seconds"] for h in res.history)
    finally:
        loggers_module.RunLoggers.step = step  # type: ignore[method-assign]
    med = {k: statistics.median(v) for k, v in speeds.items()}
    return {
        "rows_per_s": speeds,
        "median": med,
        "ratio": med["tensorboard+mlflow"] / med["none"],
        "share_in_step_logging": in_loggers / max(training, 1e-9),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4096, 10000])
    ap.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    ap.add_argument("--norms", nargs="+", choices=list(NORMS), default=list(NORMS))
    ap.add_argument(
        "--dropout",
        nargs="+",
        type=float,
        default=[0.0],
        help="dropout rates after every MaskBlock",
    )
    ap.add_argument("--rounds", type=int, default=5, help="round-robin passes (0: skip)")
    ap.add_argument("--steps", type=int, default=8, help="steps per configuration per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--vocab", type=int, default=1_000_000, help="total embedding rows")
    ap.add_argument("--emb-l2", type=float, default=1e-5)
    ap.add_argument(
        "--cpu-matmul",
        choices=["auto", "default", "onednn"],
        default="auto",
        help="library of fp32 matmuls (see ctrcal.train.cpu_matmul)",
    )
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or this process's CPU time (robust to other load)",
    )
    ap.add_argument("--auc-rows", type=int, default=0, help="also measure bf16's AUC cost")
    ap.add_argument("--auc-seeds", type=int, default=3, help="training seeds per precision")
    ap.add_argument(
        "--data",
        default=None,
        help="a prepared directory to reuse (or prepare into) for --auc-rows",
    )
    ap.add_argument("--logging-rows", type=int, default=0, help="also measure run tracking's cost")
    ap.add_argument("--logging-batch", type=int, default=1024)
    ap.add_argument("--logging-rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(f"CPU: {cpu_model_name()}; bf16 units: {bf16_units()}")
    vocab = [max(1, args.vocab // NUM_CATEGORICAL)] * NUM_CATEGORICAL
    probed = _context("layernorm", vocab, "fp32", args.emb_l2).model
    probe = cpu_bf16_probe(probed, _batch(4096, vocab, 0))
    auto = precision_name(resolve_precision("auto", torch.device("cpu"), lambda: probe))
    print(
        f"precision auto on this CPU: {auto} (start-up probe on MaskNet [400, 400, 400], 4096 "
        f"rows: bf16 {probe.speedup:.2f}x fp32, relative error {probe.error:.1e})"
    )
    print(f"load average before: {_load()}")
    with cpu_matmul(args.cpu_matmul) as backend:
        print(f"fp32 matmuls: {backend}")
        res = bench_throughput(args) if args.rounds > 0 else {}
    print(f"load average after:  {_load()}")
    print(
        f"{'batch':>6} {'precision':>9} {'norm':>12} {'dropout':>7} {'ms/step':>9} "
        f"{'rows/s':>9} {'GEMM GFLOP/s':>12} {'of GEMM limit':>13}"
    )
    for r in res.values():
        print(
            f"{r['batch']:>6} {r['precision']:>9} {r['norm']:>12} {r['dropout']:>7} "
            f"{r['step_ms']:>9.1f} {r['rows_per_s']:>9,.0f} {r['gemm_gflops']:>12.0f} "
            f"{r['share_of_gemm_limit']:>13.2f}"
        )
    ratios = {}

    def ratio(key: str, num: str, den: str, label: str, fmt: str = ".3f", unit: str = "") -> None:
        """Step time of ``res[num]`` over ``res[den]``, when both configurations ran."""
        a, b = res.get(num), res.get(den)
        if a and b:
            ratios[key] = a["step_ms"] / b["step_ms"]
            print(f"{label}: {ratios[key]:{fmt}}{unit}")

    d0 = args.dropout[0]
    for b in args.batch_sizes:
        for p in args.precisions:
            for d in args.dropout:
                ratio(
                    f"mc_over_ln/{b}/{p}/{d}",
                    f"{b}/{p}/mclayernorm/{d}",
                    f"{b}/{p}/layernorm/{d}",
                    f"MC-LN / LN step time, batch {b}, {p}, dropout {d}",
                )
            for n in args.norms:
                for d in args.dropout[1:]:
                    ratio(
                        f"dropout_cost/{b}/{p}/{n}/{d}",
                        f"{b}/{p}/{n}/{d}",
                        f"{b}/{p}/{n}/{d0}",
                        f"dropout {d} / dropout {d0} step time, batch {b}, {p}, {n}",
                    )
        for n in args.norms:
            for d in args.dropout:
                # a speed-up: fp32 time over bf16 time
                ratio(
                    f"bf16_speedup/{b}/{n}/{d}",
                    f"{b}/fp32/{n}/{d}",
                    f"{b}/bf16/{n}/{d}",
                    f"bf16 speed-up, batch {b}, {n}, dropout {d}",
                    ".2f",
                    "x",
                )
    auc = bench_auc(args) if args.auc_rows > 0 else {}
    for p in args.precisions:
        if p in auc:
            a, ll, rs = auc[p]["auc"], auc[p]["logloss"], auc[p]["rows_per_s"]
            sd = statistics.stdev(a) if len(a) > 1 else float("nan")
            print(
                f"{p}: {statistics.mean(rs):,.0f} training rows/s, test AUC "
                f"{statistics.mean(a):.4f} (sd {sd:.4f} over {len(a)} seeds), logloss "
                f"{statistics.mean(ll):.4f}; 1 epoch on {args.auc_rows:,} synthetic rows"
            )
    if "fp32" in auc and "bf16" in auc:
        pairs = zip(auc["fp32"]["rows_per_s"], auc["bf16"]["rows_per_s"], strict=True)
        speedups = [b / f for f, b in pairs]
        gap = statistics.mean(auc["bf16"]["auc"]) - statistics.mean(auc["fp32"]["auc"])
        ratios["bf16_training_speedup"] = statistics.median(speedups)
        ratios["bf16_auc_minus_fp32"] = gap
        print(
            f"bf16 / fp32 training rows/s per seed: {', '.join(f'{x:.2f}' for x in speedups)} "
            f"(median {statistics.median(speedups):.2f}x); mean test AUC bf16 - fp32: {gap:+.4f}"
        )
    logging = bench_logging(args) if args.logging_rows > 0 else {}
    if logging:
        med = logging["median"]
        print(
            f"training rows/s, median of {args.logging_rounds} alternating one-epoch runs "
            f"({args.logging_rows:,} rows, batch {args.logging_batch}): no loggers "
            f"{med['none']:,.0f}, tensorboard + mlflow {med['tensorboard+mlflow']:,.0f}; "
            f"ratio {logging['ratio']:.3f}"
        )
        print(
            "seconds inside the loggers' step calls / training seconds: "
            f"{100 * logging['share_in_step_logging']:.2f} %"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_model_name(),
                    "bf16_units": bf16_units(),
                    "throughput": res,
                    "ratios": ratios,
                    "auc": auc,
                    "logging": logging,
                    "clock": args.clock,
                    "threads": torch.get_num_threads(),
                    "load": _load(),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
