"""The precision a run computes in: ``train.precision`` resolved once, for training and scoring.

``fp32`` computes in float32 everywhere. ``bf16`` runs the model under bfloat16 autocast: matrix
products take bf16 operands with float32 accumulation, norms accumulate in float32, and the
weights stay float32 (the optimizer's master copy; autocast casts each one once per forward).
``auto`` is bf16 on CUDA; on a CPU it is bf16 only where :func:`cpu_bf16_probe` finds the
run's own model, on its first batch, faster in bf16 and as accurate as the check below
allows (wide layers on CPUs with AMX or AVX512-BF16 units); elsewhere it is fp32, and a
small model (:data:`BF16_MIN_DENSE_WEIGHTS`), whose steps the casts dominate, stays fp32
without a probe. A resumed run keeps the precision its checkpoint records.

The same resolved precision drives the training steps, the validation of every epoch, the
test split's scores and ``ctrcal evaluate`` (one-shot and MC passes): a run is scored in the
arithmetic it was trained in.

The probe times the same float32 and bf16 work interleaved, several times each, in this
process's CPU time (all its threads), and keeps the least of each: other processes on a busy
machine barely change it. It costs about six forward and backward passes at start-up. Its
verdict depends on the CPU, the thread count and the model: a run that must reproduce bit
for bit on other machines states ``precision: fp32`` (or ``bf16``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ctrcal.core.batch import Batch

__all__ = [
    "BF16_MIN_DENSE_WEIGHTS",
    "BF16_MIN_SPEEDUP",
    "BF16_TOLERANCE",
    "Bf16Probe",
    "bf16_may_pay",
    "compute_precision",
    "cpu_bf16_probe",
    "cpu_bf16_units",
    "dense_weights",
    "precision_name",
    "resolve_precision",
]

BF16_MIN_SPEEDUP = 1.5
"""bf16 must beat float32 by this factor in the probe for ``auto`` to pick it on a CPU: a
margin for the casts and element-wise work that a training step has beyond the probe's, and
for the probe's own noise. Models near the margin would otherwise flip between precisions
with the machine's load: the demo's MaskNet [128, 128] measures 1.3-1.4x on one thread of an
AMX Xeon (it stays fp32), a BARS-sized MaskNet [400, 400, 400] about 2x (bf16)."""

BF16_MIN_DENSE_WEIGHTS = 500_000
"""Dense weights (Σ in × out over the linear layers, about the multiply-adds per row) below
which ``auto`` keeps a CPU run in float32 without timing it. bf16 speeds up the matrix
products alone; below this, casts, lookups and element-wise work decide, and the probe's
verdict sits near :data:`BF16_MIN_SPEEDUP` where the machine's load can flip it. Measured on
an AMX Xeon, one thread: the demo's MaskNet [128, 128] (307k weights) 1.3-1.4x in the probe,
once over 1.5x on a loaded machine; the benchmark's [400, 400, 400] (889k) about 2x. So a
small model's runs reproduce whatever the load."""

BF16_TOLERANCE = 0.1
"""Largest relative error (l2 norm of the difference over the float32 result's) of the
probe's logits and dense gradients together under bf16. Rounding the operands to bf16 gives
a few 1e-3 on the logits and a few 1e-2 on gradients several layers below them; a broken
bf16 path is far off."""


@dataclass(frozen=True)
class Bf16Probe:
    """What the start-up probe measured: CPU seconds of one float32 and one bf16 training
    forward and backward (the least of several), the bf16 result's relative error, and the
    verdict."""

    fp32_s: float
    bf16_s: float
    error: float
    pays: bool

    @property
    def speedup(self) -> float:
        return self.fp32_s / self.bf16_s if self.bf16_s > 0 else 0.0


def dense_weights(model: nn.Module) -> int:
    """Σ in_features × out_features over ``model``'s linear layers."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))


def bf16_may_pay(model: nn.Module) -> bool:
    """Whether ``model`` is large enough for ``auto`` to time it in bf16 on a CPU
    (:data:`BF16_MIN_DENSE_WEIGHTS`)."""
    return dense_weights(model) >= BF16_MIN_DENSE_WEIGHTS


def _forward_backward(
    model: nn.Module, batch: Batch, params: list[torch.Tensor], bf16: bool
) -> torch.Tensor:
    """The model's logits and the gradient of their mean square with respect to ``params``,
    flattened into one vector."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch.inputs()).float()
    grads = torch.autograd.grad(logits.square().mean(), params, allow_unused=True)
    flat = [g.flatten() for g in grads if g is not None]
    return torch.cat([logits.detach().flatten(), *flat])


def _relative_error(reduced: torch.Tensor, exact: torch.Tensor) -> float:
    return float((reduced - exact).norm() / exact.norm().clamp_min(1e-30))


def cpu_bf16_probe(model: nn.Module, batch: Batch, repeats: int = 3) -> Bf16Probe:
    """Time ``model``'s forward and backward on ``batch`` in float32 and under bf16 autocast,
    interleaved, ``repeats`` times each, and compare the results.

    Only the dense weights' gradients are taken (the embedding tables' are what a lookup
    costs in either precision), and nothing is stored in ``.grad``; torch's RNG state (MC
    subsets, dropout masks) is restored afterwards, so training draws what it would have
    drawn without the probe. bf16 pays when it is :data:`BF16_MIN_SPEEDUP` times faster and
    its logits and gradients are within :data:`BF16_TOLERANCE` of float32's.
    """
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in tables]
    if not params:
        return Bf16Probe(0.0, 0.0, float("inf"), False)
    best = {False: float("inf"), True: float("inf")}
    with torch.random.fork_rng(devices=[]):
        try:
            torch.manual_seed(0)
            exact = _forward_backward(model, batch, params, bf16=False)
            torch.manual_seed(0)
            reduced = _forward_backward(model, batch, params, bf16=True)
        except RuntimeError:  # no bf16 kernels for an op of this model in this build
            return Bf16Probe(0.0, 0.0, float("inf"), False)
        for _ in range(repeats):
            for bf16 in (False, True):
                start = time.process_time()
                _forward_backward(model, batch, params, bf16)
                best[bf16] = min(best[bf16], time.process_time() - start)
    error = _relative_error(reduced, exact)
    pays = error < BF16_TOLERANCE and best[False] >= BF16_MIN_SPEEDUP * best[True]
    return Bf16Probe(best[False], best[True], error, pays)


_BF16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


def cpu_bf16_units() -> list[str] | None:
    """This CPU's bf16 units from its ``/proc/cpuinfo`` flags (``AMX-BF16``, ``AVX512-BF16``),
    or None where that file does not say (not Linux, or not an x86 CPU)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(
                (ln.split(":", 1)[1].split() for ln in info if ln.startswith("flags")), None
            )
    except OSError:
        return None
    if flags is None:
        return None
    return [label for flag, label in _BF16_FLAGS.items() if flag in flags]


def resolve_precision(
    precision: str, device: torch.device, probe: Callable[[], Bf16Probe] | None = None
) -> torch.dtype | None:
    """The autocast dtype of ``train.precision`` on ``device``: ``torch.bfloat16``, or None
    for float32. ``auto`` on a CPU calls ``probe`` (e.g. :func:`cpu_bf16_probe` on the run's
    model and first batch) and is float32 without one, or on an x86 CPU without bf16 units
    (where bf16 is emulated: no probe runs, so ``auto`` costs nothing there)."""
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        return None
    if device.type == "cuda":
        return torch.bfloat16
    if device.type != "cpu" or probe is None or cpu_bf16_units() == []:
        return None
    return torch.bfloat16 if probe().pays else None


def precision_name(dtype: torch.dtype | None) -> str:
    """``bf16`` or ``fp32``: how a resolved precision is written in a run's files."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


@contextlib.contextmanager
def compute_precision(dtype: torch.dtype | None, device_type: str) -> Iterator[None]:
    """Run the body's model calls in ``dtype`` (autocast) on ``device_type``; None: as they
    are (float32)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type, dtype=dtype):
        yield
