"""One command that exercises every GPU path of ctrcal and prints GPU benchmarks.

    python scripts/gpu_check.py                 # all checks, then the benchmarks
    python scripts/gpu_check.py --no-bench      # checks only
    python scripts/gpu_check.py --bench-only --batch 65536
    python scripts/gpu_check.py --quick         # kernel checks + layer and step ratios

Checks (tiny generated data; each prints PASS or FAIL with a reason):

* Triton MC-LayerNorm vs the masked formula and the torch path, row (N=400) and grouped
  (39 fields x 16) shapes, fp32 and bf16: exact k per row, inclusion rates, subset-mean
  variance against theory, forward and gradients equal to the formula on the same subsets;
* per-field MC-LayerNorm (FieldNorm) on the grouped kernel; torch.compile keeps the kernel,
  and the ``CTRCAL_MCLN_COMPILED=decomposed`` graph (subset op + tensor ops) equals it;
* MaskNet forward/backward under bf16 autocast;
* end to end through the command line: training runs with LayerNorm and MC-LayerNorm with the
  data resident on the GPU (fp32, bf16, compiled), DDP with NCCL over the visible GPUs
  (``--nproc``), MC integration (``evaluate --mc-samples``), a shift report with
  ``--devices auto``.

Benchmarks (median of several timed rounds, CUDA-synchronised): MC-LN / LN forward+backward
layer ratios, serial MaskNet training rows/s (data on the device; fp32 and bf16; LN and
MC-LN; eager and compiled, MC-LN compiled both ways) and the MC-LN / LN step ratios,
evaluation rows/s (one-shot LN, one-shot MC-LN, 1 MC sample) and the report's MC variants
(10 MC-LayerNorm or MC-Dropout passes as one forward of passes x rows, through the one
prediction loop).

``--quick`` (a few minutes) runs the Triton kernel checks (no torch-path or model checks, no
command-line runs) and the layer and training-step benchmarks (no evaluation benchmark);
``--compile-precisions fp32 bf16`` also compiles the fp32 step (default: bf16 only).

Without a CUDA GPU it says so and exits 0. Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str) -> Callable[[Callable[[], str | None]], Callable[[], None]]:
    """Run the decorated function as one check; record and print PASS/FAIL."""

    def wrap(fn: Callable[[], str | None]) -> Callable[[], None]:
        def run() -> None:
            start = time.perf_counter()
            try:
                detail = fn() or ""
                ok = True
            except Exception as exc:  # report every failure, keep checking the rest
                detail = f"{type(exc).__name__}: {exc}"
                ok = False
                if os.environ.get("GPU_CHECK_DEBUG"):
                    traceback.print_exc()
            seconds = time.perf_counter() - start
            RESULTS.append((name, ok, detail))
            status = "PASS" if ok else "FAIL"
            print(f"[{status}] {name} ({seconds:.1f}s) {detail}"[:2000], flush=True)

        return run

    return wrap


def require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# ---------------------------------------------------------------------------------------------
# kernel checks


def _statistics_checks(backend: str, rows: int, groups: int, d: int, f: float) -> str:
    from ctrcal.core.norm_spec import mc_subset_size
    from ctrcal.layers.mc_layernorm.functional import mc_grouped_layer_norm, sample_subset_mask

    dev = torch.device("cuda")
    k = mc_subset_size(d, f)
    mask = sample_subset_mask(rows * groups, d, k, device=dev, backend=backend)
    require(bool((mask.sum(1) == k).all()), f"{backend}: not exactly k={k} in every row")
    share = mask.double().mean(0)
    se = math.sqrt(k / d * (1 - k / d) / (rows * groups))
    require(bool(((share - k / d).abs() < 6 * se).all()), f"{backend}: inclusion rates off")
    # subset mean of a fixed row: variance sigma^2 (N-k)/(k(N-1)) across rows and fields
    base = torch.randn(d, device=dev, dtype=torch.float64) * 2 + 1
    x = base.expand(rows, groups, d).contiguous().float()
    with torch.no_grad():
        y = mc_grouped_layer_norm(x, eps=0.0, fraction=f, backend=backend).double()
    s = (base[0] - base[1]) / (y[..., 0] - y[..., 1])
    mu = (base[0] - y[..., 0] * s).reshape(-1)
    sigma2 = base.var(unbiased=False).item()
    theory = sigma2 * (d - k) / (k * (d - 1))
    centred = mu - base.mean()
    var_hat = centred.pow(2).mean().item()
    se = math.sqrt((centred.pow(4).mean().item() - var_hat**2) / centred.numel())
    require(abs(var_hat - theory) < 6 * se, f"{backend}: Var(subset mean) {var_hat} vs {theory}")
    return f"k={k} var(mean)={var_hat:.4g} theory={theory:.4g}"


def _formula_check(rows: int, groups: int, d: int, f: float, dtype: torch.dtype) -> str:
    from ctrcal.core.norm_spec import mc_subset_size
    from ctrcal.layers.mc_layernorm.functional import mc_grouped_layer_norm, sample_subset_mask

    dev = torch.device("cuda")
    k = mc_subset_size(d, f)
    torch.manual_seed(0)
    x = (torch.randn(rows, groups, d, device=dev) * 3 + 2).to(dtype).requires_grad_()
    w = torch.randn(groups, d, device=dev, requires_grad=True)
    b = torch.randn(groups, d, device=dev, requires_grad=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(11)
    mask = sample_subset_mask(rows * groups, d, k, generator=gen, device=dev, backend="triton")
    gen.manual_seed(11)
    out = mc_grouped_layer_norm(x, w, b, 1e-5, f, generator=gen, backend="triton")
    require(out.dtype == dtype, f"output dtype {out.dtype}")
    m = mask.reshape(rows, groups, d).double()
    xd = x.detach().double().requires_grad_()
    wd, bd = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    mu = (xd * m).sum(-1, keepdim=True) / k
    var = ((xd - mu) ** 2 * m).sum(-1, keepdim=True) / k
    ref = (xd - mu) / torch.sqrt(var + 1e-5) * wd + bd
    tol = 2e-4 if dtype == torch.float32 else 5e-2
    err = (out.double() - ref).abs().max().item()
    require(err < tol * (1 + ref.abs().max().item()), f"forward error {err}")
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (x, w, b), g.to(dtype))
    ref_grads = torch.autograd.grad(ref, (xd, wd, bd), g)
    errs = []
    for a, r in zip(grads, ref_grads, strict=True):
        e = (a.double() - r).abs().max().item() / (1 + r.abs().max().item())
        errs.append(e)
        require(e < (1e-3 if dtype == torch.float32 else 5e-2), f"gradient error {e}")
    return f"max forward error {err:.2e}, gradient errors {', '.join(f'{e:.1e}' for e in errs)}"


@check("triton MC-LN row (4096x400): exact k, inclusion rates, subset-mean variance")
def check_row_statistics() -> str:
    return _statistics_checks("triton", 4096, 1, 400, 0.8)


@check("torch-path MC-LN row (4096x400): same statistics")
def check_row_statistics_torch() -> str:
    return _statistics_checks("torch", 4096, 1, 400, 0.8)


@check("triton MC-LN grouped (2048x39x16): exact k, inclusion rates, subset-mean variance")
def check_grouped_statistics() -> str:
    return _statistics_checks("triton", 2048, 39, 16, 0.8)


@check("torch-path MC-LN grouped (2048x39x16): same statistics")
def check_grouped_statistics_torch() -> str:
    return _statistics_checks("torch", 2048, 39, 16, 0.8)


@check("triton MC-LN row fp32: forward and gradients equal the formula on its subsets")
def check_row_formula() -> str:
    return _formula_check(512, 1, 400, 0.8, torch.float32)


@check("triton MC-LN row bf16 input: fp32 accumulation, bf16 output")
def check_row_formula_bf16() -> str:
    return _formula_check(512, 1, 400, 0.8, torch.bfloat16)


@check("triton MC-LN grouped fp32 (39 fields x 16): forward and gradients")
def check_grouped_formula() -> str:
    return _formula_check(256, 39, 16, 0.8, torch.float32)


@check("triton MC-LN wide rows (N=3000) and N above one program (torch path)")
def check_wide() -> str:
    from ctrcal.layers.kernels import mcln_triton

    out = _formula_check(64, 1, 3000, 0.5, torch.float32)
    from ctrcal.layers.mc_layernorm.functional import mc_layer_norm

    n = mcln_triton.MAX_WIDTH + 100
    x = torch.randn(8, n, device="cuda")
    y = mc_layer_norm(x, n, fraction=0.5)
    require(bool(torch.isfinite(y).all()), "non-finite output above MAX_WIDTH")
    return out


@check("per-field MC-LN (FieldNorm, 39x16) runs the grouped Triton kernel")
def check_field_norm() -> str:
    from ctrcal.layers.embedding import FieldNorm
    from ctrcal.layers.kernels import mcln_triton

    calls = []
    real = mcln_triton.mc_layer_norm_fwd
    norm = FieldNorm(39, 16, "mclayernorm").cuda().train()
    x = torch.randn(1024, 39, 16, device="cuda", requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        mcln_triton.mc_layer_norm_fwd = lambda *a: calls.append(a[4]) or real(*a)
        try:
            y = norm(x)
        finally:
            mcln_triton.mc_layer_norm_fwd = real
    y.square().sum().backward()
    require(calls == [39], f"expected one grouped launch with 39 groups, got {calls}")
    require(all(n.weight.grad is not None for n in norm.norms), "missing field gradients")
    return "one launch for 39 fields"


@check("torch.compile keeps the Triton MC-LN op (fullgraph, inductor)")
def check_compile() -> str:
    from torch._dynamo.testing import CompileCounterWithBackend

    from ctrcal.layers.mc_layernorm.module import MCLayerNorm

    layer = MCLayerNorm(400, fraction=0.8).cuda().train()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    x = torch.randn(256, 400, device="cuda", requires_grad=True)
    y = compiled(x)
    y.square().sum().backward()
    ops = {str(n.target) for g in counter.graphs for n in g.graph.nodes}
    require(any("mc_layer_norm_fwd" in op for op in ops), f"op not in graph: {sorted(ops)}")
    torch.manual_seed(3)
    a = compiled(x)
    torch.manual_seed(3)
    b = compiled(x)
    require(torch.equal(a, b), "compiled layer not reproducible under manual_seed")
    return f"{counter.frame_count} graph, op kept"


@check("torch.compile, CTRCAL_MCLN_COMPILED=decomposed: subset op + fused tensor ops = kernel")
def check_compile_decomposed() -> str:
    from ctrcal.layers.mc_layernorm.module import MCLayerNorm

    layer = MCLayerNorm(400, fraction=0.8).cuda().train()
    x = torch.randn(512, 400, device="cuda")
    results = []
    for mode in ("decomposed", "kernel"):
        os.environ["CTRCAL_MCLN_COMPILED"] = mode
        torch._dynamo.reset()  # trace again under this mode
        try:
            compiled = torch.compile(layer, fullgraph=True)
            torch.manual_seed(11)
            xi = x.clone().requires_grad_()
            y = compiled(xi)
            (dx,) = torch.autograd.grad((y * y.cos()).sum(), [xi])
            results.append((y.detach(), dx))
        finally:
            os.environ.pop("CTRCAL_MCLN_COMPILED", None)
    (y_d, dx_d), (y_k, dx_k) = results
    err_y = (y_d - y_k).abs().max().item()
    err_dx = (dx_d - dx_k).abs().max().item()
    require(err_y < 1e-4 and err_dx < 1e-4, f"max |diff| y {err_y:.2e}, dx {err_dx:.2e}")
    return f"max |diff| y {err_y:.1e}, dx {err_dx:.1e}"


@check("MaskNet forward/backward under bf16 autocast (LN and MC-LN everywhere)")
def check_bf16() -> str:
    from ctrcal.core.batch import Batch
    from ctrcal.core.norm_spec import NormSpec
    from ctrcal.models.masknet import MaskNet

    vocab = [1000] * 26
    for norm in ("layernorm", "mclayernorm"):
        torch.manual_seed(0)
        model = MaskNet(
            vocab,
            13,
            embedding_dim=16,
            hidden_units=[400, 400, 400],
            net_norm=NormSpec(norm),
            emb_norm=NormSpec(norm),
        ).cuda()
        cat, num, label = _batch(4096, vocab)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(Batch(cat, num, None))
        loss = F.binary_cross_entropy_with_logits(logits.float().reshape(-1), label)
        loss.backward()
        require(bool(torch.isfinite(loss)), f"{norm}: non-finite loss")
    return "finite loss and gradients"


@check("MC integration on the GPU (mc_predict: 20 samples)")
def check_mc_predict() -> str:
    from ctrcal.core.batch import Batch
    from ctrcal.core.norm_spec import NormSpec
    from ctrcal.layers.mc_layernorm.predict import mc_predict
    from ctrcal.models.masknet import MaskNet

    vocab = [1000] * 26
    model = MaskNet(
        vocab,
        13,
        embedding_dim=16,
        hidden_units=[64, 64],
        net_norm=NormSpec("mclayernorm"),
        emb_norm=NormSpec("mclayernorm"),
    ).cuda()
    cat, num, _ = _batch(512, vocab)
    mean, std = mc_predict(model, Batch(cat, num, None), n_samples=20)
    require(bool((std > 0).all()), "no spread between MC samples")
    require(bool(((mean >= 0) & (mean <= 1)).all()), "mean outside [0, 1]")
    return f"mean std {std.mean().item():.2e}"


@check("MC passes sharing the deterministic prefix equal full passes on the GPU")
def check_mc_replay() -> str:
    from ctrcal.core.batch import Batch
    from ctrcal.core.norm_spec import NormSpec
    from ctrcal.layers.mc_layernorm.module import mc_mode
    from ctrcal.layers.mc_layernorm.predict import sample_probabilities
    from ctrcal.models.masknet import MaskNet
    from ctrcal.train.predict import mc_dropout

    vocab = [1000] * 26
    cat, num, _ = _batch(2048, vocab)
    worst = 0.0
    for emb, net, dropout_on in (
        ("mclayernorm", "mclayernorm", False),
        ("none", "mclayernorm", False),
        ("layernorm", "layernorm", True),
    ):
        torch.manual_seed(0)
        model = (
            MaskNet(
                vocab,
                13,
                embedding_dim=16,
                hidden_units=[64, 64],
                dropout=0.2,
                net_norm=NormSpec(net),
                emb_norm=NormSpec(emb),
            )
            .cuda()
            .eval()
        )
        probs = []
        for fn in (model, lambda b, m=model: m(b)):  # the hook, then full passes
            with torch.no_grad(), mc_mode(model), contextlib.ExitStack() as stack:
                if dropout_on:
                    stack.enter_context(mc_dropout(model))
                torch.manual_seed(1)
                probs.append(sample_probabilities(fn, [Batch(cat, num, None)], 10))
        require(bool((probs[0].std(0) > 0).all()), f"{emb}/{net}: the passes did not sample")
        # the same draws; a matrix product may round differently at another number of rows
        worst = max(worst, float((probs[0] - probs[1]).abs().max()))
    require(worst < 1e-4, f"shared-prefix passes differ from full passes by {worst:.2e}")
    return f"largest difference {worst:.1e}"


def _batch(rows: int, vocab: list[int], seed: int = 0):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    cat = torch.stack([torch.randint(0, v, (rows,), device="cuda", generator=g) for v in vocab], 1)
    num = torch.randn(rows, 13, device="cuda", generator=g)
    num[torch.rand(rows, 13, device="cuda", generator=g) < 0.1] = float("nan")
    label = (torch.rand(rows, device="cuda", generator=g) < 0.25).float()
    return cat, num, label


# ---------------------------------------------------------------------------------------------
# end to end through the command line


def _root_cause(proc: subprocess.CompletedProcess) -> str:
    """The lines of a failed command that say what went wrong (not the launcher's noise)."""
    text = f"{proc.stdout}\n{proc.stderr}"
    lines = [
        line.strip()
        for line in text.splitlines()
        if ("rror" in line or "ctrcal:" in line)
        and "elastic" not in line
        and "ChildFailedError" not in line
        and not line.strip().startswith("File ")
    ]
    return " | ".join(lines[:8])[:1500] or text[-1500:]


def _cli(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "ctrcal", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    if proc.returncode != 0:
        command = " ".join(args[:2])
        raise RuntimeError(f"ctrcal {command} exited {proc.returncode}: {_root_cause(proc)}")
    return proc


# one shift, one level: the check is that the report runs on the GPUs, not what it finds
SHIFT_REPORT_GRID = "report.shifts=[{name: gaussian_numeric, intensities: [0.0, 0.25]}]"


class EndToEnd:
    def __init__(self, work: Path, rows: int) -> None:
        self.work = work
        self.rows = rows
        self.data = work / "data"
        self.base = [
            "train.device=cuda",
            "train.data_mode=device",
            "train.epochs=1",
            "train.progress=false",
            "train.batch_size=4096",
            "model.hidden_units=[400,400,400]",
            "model.embedding_dim=16",
        ]
        self.mc = ["model.net_norm=mclayernorm", "model.emb_norm=mclayernorm"]

    def prepare(self) -> str:
        _cli(["synth", str(self.work / "raw.txt"), "--rows", str(self.rows), "--seed", "0"])
        _cli(["prepare", str(self.work / "raw.txt"), "--out", str(self.data)])
        return f"{self.rows} synthetic rows prepared"

    def train(self, name: str, extra: list[str], nproc: int = 1) -> str:
        out = self.work / name
        args = ["train", "configs/demo.yaml", *self.base, *extra]
        args += ["--data", str(self.data), "--out", str(out)]
        if nproc > 1:
            args += ["--nproc", str(nproc)]
        start = time.perf_counter()
        _cli(args)
        require((out / "result.json").exists(), f"no result.json in {out}")
        import json

        result = json.loads((out / "result.json").read_text())
        test = result.get("test") or result.get("valid") or {}
        return f"test AUC {test.get('auc', float('nan')):.4f} in {time.perf_counter() - start:.0f}s"


def end_to_end_checks(work: Path, rows: int) -> None:
    e2e = EndToEnd(work, rows)
    check("prepare tiny synthetic data (ctrcal synth + prepare)")(e2e.prepare)()
    if not (e2e.data / "feature_map.json").exists():
        return
    for run_name, name, extra in [
        (
            "run_ln",
            "train LN, fp32, data on device",
            ["model.net_norm=layernorm", "train.precision=fp32"],
        ),
        (
            "run_mc",
            "train MC-LN (MaskBlocks + per-field), fp32, data on device",
            [*e2e.mc, "train.precision=fp32"],
        ),
        (
            "run_mc_bf16",
            "train MC-LN, bf16 autocast, data on device",
            [*e2e.mc, "train.precision=bf16"],
        ),
        ("run_mc_compile", "train MC-LN, torch.compile", [*e2e.mc, "train.compile=true"]),
    ]:
        check(name)(lambda run_name=run_name, extra=extra: e2e.train(run_name, extra))()
    gpus = torch.cuda.device_count()
    check(f"DDP with NCCL over {gpus} GPU(s)")(lambda: _ddp(e2e))()

    def evaluate_mc() -> str:
        run = work / "run_mc"
        require((run / "result.json").exists(), "no MC-LN run to evaluate")
        proc = _cli(["evaluate", str(run), "--mc-samples", "10", "--data", str(e2e.data)])
        return proc.stdout.strip().splitlines()[-1][:200] if proc.stdout.strip() else ""

    check("MC integration: ctrcal evaluate --mc-samples 10")(evaluate_mc)()

    def shift_report() -> str:
        out = work / "report"
        _cli(
            [
                "shift-report",
                "configs/demo.yaml",
                *e2e.base,
                SHIFT_REPORT_GRID,
                "--data",
                str(e2e.data),
                "--out",
                str(out),
                "--seeds",
                "1",
                "--devices",
                "auto",
            ]
        )
        produced = sorted(p.name for p in out.iterdir())
        require(any(p.endswith(".json") for p in produced), f"no summary in {produced}")
        return f"wrote {', '.join(produced[:6])}"

    check("shift report with --devices auto")(shift_report)()


def _ddp(e2e: EndToEnd) -> str:
    """``ctrcal train --nproc N`` over the N visible GPUs; with one GPU, a one-process NCCL
    group under torchrun (DDP's wrapping and all-reduces still run)."""
    gpus = torch.cuda.device_count()
    if gpus > 1:
        return e2e.train("run_ddp", e2e.mc, nproc=gpus) + f" ({gpus} processes)"
    out = e2e.work / "run_ddp"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "ctrcal",
        "train",
        "configs/demo.yaml",
        *e2e.base,
        *e2e.mc,
        "--data",
        str(e2e.data),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}: {_root_cause(proc)}")
    require((out / "result.json").exists(), "no result.json from the DDP run")
    return "1 process (one GPU visible)"


# ---------------------------------------------------------------------------------------------
# benchmarks


def _time_cuda(fn: Callable[[], None], repeats: int, rounds: int = 5) -> float:
    """Median over rounds of the mean seconds per call (CUDA events)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(times)


def bench_layers(rows: int) -> None:
    print(f"\nlayer forward+backward, {rows} rows (ms; ratio to LayerNorm)")
    for label, shape, dtype in [
        ("row 400 fp32", (rows, 400), torch.float32),
        ("row 400 bf16", (rows, 400), torch.bfloat16),
        ("grouped 39x16 fp32", (rows, 39, 16), torch.float32),
        ("grouped 39x16 bf16", (rows, 39, 16), torch.bfloat16),
    ]:
        _bench_layer(label, shape, dtype)


def _bench_layer(label: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    from ctrcal.layers.mc_layernorm.functional import mc_grouped_layer_norm

    d = shape[-1]
    groups = shape[1] if len(shape) == 3 else 1
    x = torch.randn(shape, device="cuda", dtype=dtype).reshape(-1, groups, d)
    x.requires_grad_()
    g = torch.randn_like(x)
    w = torch.ones(groups, d, device="cuda", requires_grad=True)
    b = torch.zeros(groups, d, device="cuda", requires_grad=True)

    def ln() -> None:  # what nn.LayerNorm / FieldNorm's LayerNorm path run
        if groups == 1:
            F.layer_norm(x, (d,), w[0].to(dtype), b[0].to(dtype), 1e-5).backward(g)
        else:
            (F.layer_norm(x, (d,), None, None, 1e-5) * w + b).backward(g)

    def mc_triton() -> None:
        mc_grouped_layer_norm(x, w, b, 1e-5, 0.8).backward(g)

    def mc_torch() -> None:
        mc_grouped_layer_norm(x, w, b, 1e-5, 0.8, backend="torch").backward(g)

    t_ln = _time_cuda(ln, 20)
    t_mc = _time_cuda(mc_triton, 20)
    t_torch = _time_cuda(mc_torch, 5)
    print(
        f"  {label:<20} LN {t_ln * 1e3:7.3f}  MC-LN triton {t_mc * 1e3:7.3f} "
        f"({t_mc / t_ln:4.2f}x)  MC-LN torch path {t_torch * 1e3:7.3f} ({t_torch / t_ln:4.2f}x)"
    )


def _masknet(norm: str, emb_norm: str = "none", dropout: float = 0.0):
    from ctrcal.core.norm_spec import NormSpec
    from ctrcal.models.masknet import MaskNet

    torch.manual_seed(0)
    return MaskNet(
        [40_000] * 26,
        13,
        embedding_dim=16,
        hidden_units=[400, 400, 400],
        reduction_ratio=0.2,
        net_norm=NormSpec(norm),
        emb_norm=NormSpec(emb_norm),
        dropout=dropout,
    ).cuda()


def bench_training(
    batch: int, compiled: bool, compile_precisions: tuple[str, ...] = ("bf16",)
) -> dict[tuple[str, str], float]:
    from ctrcal.core.batch import Batch

    vocab = [40_000] * 26
    batches = [_batch(batch, vocab, seed) for seed in range(4)]
    out: dict[tuple[str, str], float] = {}
    # each compiled (norm, precision) pair is a compile of its own: about a minute
    precisions = compile_precisions if compiled else ("fp32", "bf16")
    # compiled, MC-LN runs both ways a graph can hold it (ctrcal.layers.mc_layernorm
    # .COMPILED_MODES): the fused kernel op, or the subset op with inductor-fused tensor ops
    variants = [("layernorm", "kernel"), ("mclayernorm", "kernel")]
    if compiled:
        variants.append(("mclayernorm", "decomposed"))
    for norm, mode in variants:
        model = _masknet(norm)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        label = norm if mode == "kernel" else f"{norm}-{mode}"
        for precision in precisions:
            amp = precision == "bf16"

            def step(model=model, opt=opt, amp=amp) -> torch.Tensor:
                cat, num, label = batches[step.i % 4]
                step.i += 1
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    logits = model(Batch(cat, num, None)).reshape(-1)
                loss = F.binary_cross_entropy_with_logits(logits.float(), label)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss

            step.i = 0
            fn = torch.compile(step) if compiled else step
            os.environ["CTRCAL_MCLN_COMPILED"] = mode  # read when the step is traced
            try:
                seconds = _time_cuda(fn, 20)
            finally:
                os.environ.pop("CTRCAL_MCLN_COMPILED", None)
            out[(label, precision)] = seconds
    return out


def bench_eval(batch: int) -> None:
    from ctrcal.core.batch import Batch
    from ctrcal.layers.mc_layernorm.module import mc_mode

    vocab = [40_000] * 26
    inputs = Batch(*_batch(batch, vocab)[:2], None)
    print(f"\nevaluation rows/s (batch {batch}, no_grad, bf16 autocast off)")
    results = {}
    for label, norm, mc in [
        ("LN one-shot", "layernorm", False),
        ("MC-LN one-shot", "mclayernorm", False),
        ("MC-LN 1 MC sample", "mclayernorm", True),
    ]:
        model = _masknet(norm).eval()

        @torch.no_grad()
        def run(model=model) -> None:
            model(inputs)

        if mc:
            with mc_mode(model):
                seconds = _time_cuda(run, 20)
        else:
            seconds = _time_cuda(run, 20)
        results[label] = seconds
        print(f"  {label:<20} {batch / seconds:>14,.0f} rows/s")
    ratio = results["MC-LN one-shot"] / results["LN one-shot"]
    print(f"  one-shot MC-LN / LN evaluation time: {ratio:.3f}")
    # the report's MC variants through the one prediction loop: 10 passes of the batch as one
    # forward of passes x rows, the deterministic prefix computed once
    from ctrcal.train.predict import predict_split

    for label, norm, emb_norm, dropout_on in [
        ("MC-LN blocks, 10 passes", "mclayernorm", "none", False),
        ("MC-LN blocks+fields, 10", "mclayernorm", "mclayernorm", False),
        ("MC-Dropout, 10 passes", "layernorm", "none", True),
    ]:
        model = _masknet(norm, emb_norm, dropout=0.2 if dropout_on else 0.0).eval()

        def passes(model=model, dropout_on=dropout_on) -> None:
            predict_split(
                [model], inputs, batch_size=batch, mc_samples=10, mc_dropout_on=dropout_on
            )

        seconds = _time_cuda(passes, 5)
        print(
            f"  {label:<24} {batch / seconds:>14,.0f} rows/s  "
            f"{seconds / results['LN one-shot']:.2f}x LN one-shot"
        )


def benchmarks(
    batch: int, evaluation: bool = True, compile_precisions: tuple[str, ...] = ("bf16",)
) -> None:
    props = torch.cuda.get_device_properties(0)
    print(f"\n=== GPU benchmarks on {props.name} ({torch.cuda.device_count()} visible) ===")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    bench_layers(batch)
    for compiled in (False, True):
        if compiled and not compile_precisions:
            continue
        try:
            res = bench_training(batch, compiled, compile_precisions)
        except Exception as exc:  # compiled training may fail where eager works: say so
            print(f"\ntraining ({'compiled' if compiled else 'eager'}) failed: {exc}"[:800])
            continue
        mode = "torch.compile" if compiled else "eager"
        print(f"\nserial MaskNet [400,400,400] emb 16 training, batch {batch}, {mode}")
        for (norm, precision), seconds in res.items():
            print(
                f"  {norm:<12} {precision:<5} {seconds * 1e3:8.2f} ms/step "
                f"{batch / seconds:>14,.0f} rows/s"
            )
        for precision in sorted({p for _, p in res}):
            for label in sorted({n for n, _ in res} - {"layernorm"}):
                ratio = res[(label, precision)] / res[("layernorm", precision)]
                print(f"  {label} / layernorm step time, {precision}: {ratio:.3f}")
    if evaluation:
        bench_eval(batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-bench", action="store_true", help="checks only")
    ap.add_argument("--bench-only", action="store_true", help="benchmarks only")
    ap.add_argument("--no-e2e", action="store_true", help="skip the command-line runs")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the Triton kernel checks and the layer/step benchmarks only (no torch-path or "
        "model checks, no command-line runs, no evaluation benchmark)",
    )
    ap.add_argument(
        "--compile-precisions",
        nargs="*",
        choices=["fp32", "bf16"],
        default=["bf16"],
        help="precisions of the compiled training benchmark (each about a minute of compile "
        "per norm; none: skip it)",
    )
    ap.add_argument("--rows", type=int, default=40_000, help="synthetic rows end to end")
    ap.add_argument("--batch", type=int, default=65_536, help="benchmark batch size")
    args = ap.parse_args(argv)
    if args.quick:
        args.no_e2e = True
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible here; nothing to check (exit 0)")
        return 0
    sys.path.insert(0, str(ROOT))
    props = torch.cuda.get_device_properties(0)
    print(
        f"gpu_check on {props.name}, {torch.cuda.device_count()} GPU(s), torch {torch.__version__}"
    )
    try:
        import triton

        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton not installed: MC-LayerNorm takes the torch path on CUDA")
    if not args.bench_only:
        checks = [
            check_row_statistics,
            check_row_statistics_torch,
            check_grouped_statistics,
            check_grouped_statistics_torch,
            check_row_formula,
            check_row_formula_bf16,
            check_grouped_formula,
            check_wide,
            check_field_norm,
            check_compile,
            check_compile_decomposed,
            check_bf16,
            check_mc_predict,
            check_mc_replay,
        ]
        if args.quick:
            slow = {
                check_row_statistics_torch,
                check_grouped_statistics_torch,
                check_bf16,
                check_mc_predict,
                check_mc_replay,
            }
            checks = [fn for fn in checks if fn not in slow]
        for fn in checks:
            fn()
        if not args.no_e2e:
            with tempfile.TemporaryDirectory(prefix="gpu-check-") as td:
                end_to_end_checks(Path(td), args.rows)
        failed = [name for name, ok, _ in RESULTS if not ok]
        print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed")
        for name in failed:
            print(f"  FAILED: {name}")
    if not args.no_bench:
        benchmarks(
            args.batch,
            evaluation=not args.quick,
            compile_precisions=tuple(args.compile_precisions),
        )
    return 1 if any(not ok for _, ok, _ in RESULTS) else 0


if __name__ == "__main__":
    raise SystemExit(main())
