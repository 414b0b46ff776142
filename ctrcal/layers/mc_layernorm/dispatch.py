"""Which implementation normalises a call's rows: the backend dispatch of MC-LayerNorm.

Every functional entry point (:mod:`.functional`) ends in :func:`normalize_rows` on rows
``[R, N]``; this module picks the path and runs it. All paths compute the function of
:mod:`.definition`, and none shares subsets between rows (:data:`BACKENDS`):

* ``c`` (default for CPU tensors): the C kernel of :mod:`ctrcal.layers.kernels.mcln_kernel`,
  compiled once per machine with the system C compiler (about a second; cached under
  ``~/.cache/ctrcal``) and loaded with ctypes. Per row, an exact uniform k-subset kept as a
  bitmask: rows of at most 64 features draw the smaller side (``min(k, N - k)``) with Floyd's
  algorithm; wider rows keep each feature on 8 random bits against ``floor(k * 256 / N)`` and
  then correct the count to exactly k by removing (or adding) a uniform set of ranks among
  the features kept (or left out) -- every feature treated alike, then a correction blind to
  the order: uniform over all ``C(N, k)`` subsets. Every bounded integer is exactly uniform
  (Lemire's multiply-and-reject). The random bits are SplitMix64 outputs keyed by one draw
  from torch's RNG (so ``torch.manual_seed`` and ``generator`` reproduce the subsets) and the
  row index (so the result does not depend on the thread count, nor on the machine's vector
  instructions). The statistics are one pass over the row with the subset's bits as the
  vector mask, and the backward reads the saved bits (``ceil(N / 64)`` words a row). Statistics,
  output and backward are fused; built for the machine's own vector instructions (AVX-512
  where present). Cost grows with ``sqrt(N k (N - k)) / N`` (the correction) and N (the
  Bernoulli bits); see ``scripts/bench_norms.py``. No double backward
  (``once_differentiable``). Registered with ``torch.library`` as well, so a
  ``torch.compile`` graph on CPU keeps the kernel (eager calls skip the op dispatch). It
  runs where :func:`ctrcal.layers.kernels.fusion.fusable_on_cpu` -- the one rule of every fused CPU
  kernel -- allows it: any dtype (the rows are converted to float32/float64) and under
  autocast (the ops it replaces run outside autocast, see :func:`.definition.masked_rows`).
* ``triton`` (default for CUDA tensors when triton is installed): one fused forward and one
  fused backward kernel (:mod:`ctrcal.layers.kernels.mcln_triton`); each row's exact-k subset comes
  from Philox bits keyed by a seed and the element's position, kept as one bit per element
  for the backward; float32 accumulation for float32/bfloat16/float16 input; registered
  with ``torch.library`` so ``torch.compile`` keeps it (see :data:`COMPILED_MODES`). A failed
  compile falls back to ``torch`` with one warning.
* ``torch`` (any device; CPU fallback without a compiler): the sampler and formula of
  :mod:`.definition` as tensor ops. Much slower on CPU (per-row selection), fine on GPU.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import Tensor

from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import MC_BACKENDS
from ctrcal.layers.kernels import mcln_kernel
from ctrcal.layers.kernels.fusion import fusable_on_cpu
from ctrcal.layers.mc_layernorm.definition import compute_dtype, masked_rows, torch_subset_mask

__all__ = [
    "BACKENDS",
    "COMPILED_MODES",
    "choose_backend",
    "compiled_mode",
    "layer_norm_backend",
    "normalize_rows",
    "resolve_backend",
]

BACKENDS = MC_BACKENDS  # named once, in ctrcal.core.norm_spec (config checks need them)
"""``auto``: the C kernel for CPU tensors when it builds (else ``torch``), the Triton kernel
for CUDA tensors when triton is installed and compiles (else ``torch``, with one warning).
``c``: the C kernel (CPU; an error if it cannot be built). ``triton``: the Triton kernel (CUDA
tensors, or CPU tensors under ``TRITON_INTERPRET=1``; an error without triton). ``torch``: pure
torch ops on any device (the subset from a table of all subsets when ``C(N, d) <= 4096``, else
the d smallest of i.i.d. float64 keys). Rows wider than
:data:`ctrcal.layers.kernels.mcln_triton.MAX_WIDTH` take the torch path instead of ``triton``. The
environment variable ``CTRCAL_MCLN_BACKEND`` sets the default."""

COMPILED_MODES = ("kernel", "decomposed")
"""How a ``torch.compile`` graph runs the Triton MC-LayerNorm (environment variable
``CTRCAL_MCLN_COMPILED``, read when a graph is traced). ``kernel`` (default): the fused forward
and backward ops, kept whole in the graph. ``decomposed``: only the subset draw is an op
(:func:`ctrcal.layers.kernels.mcln_triton.mc_subset_mask`, the same subsets from the same seed); the
masked statistics, the affine and their gradients are ordinary tensor ops that inductor fuses
with the neighbouring operations, at the cost of a one-byte-per-element mask."""

_C_DTYPES = (torch.float32, torch.float64)  # what the C kernel computes in


def resolve_backend(backend: str | None) -> str:
    """The :data:`BACKENDS` entry asked for: ``backend``, else ``CTRCAL_MCLN_BACKEND``, else
    auto. Raises ConfigError for an unknown name."""
    choice = backend or os.environ.get("CTRCAL_MCLN_BACKEND") or "auto"
    choice = choice.strip().lower()
    if choice not in BACKENDS:
        raise ConfigError(
            f"MC-LayerNorm backend must be one of {', '.join(BACKENDS)}, got {choice!r}"
        )
    return choice


def compiled_mode() -> str:
    """The :data:`COMPILED_MODES` entry in force (``CTRCAL_MCLN_COMPILED``, default kernel)."""
    mode = (os.environ.get("CTRCAL_MCLN_COMPILED") or "kernel").strip().lower()
    if mode not in COMPILED_MODES:
        raise ConfigError(
            f"CTRCAL_MCLN_COMPILED must be one of {', '.join(COMPILED_MODES)}, got {mode!r}"
        )
    return mode


def triton() -> Any:
    """The Triton kernels' module, imported on first use: importing triton costs a CPU-only
    process 0.3-0.5 s of start-up for kernels it never launches."""
    from ctrcal.layers.kernels import mcln_triton

    return mcln_triton


def choose_backend(backend: str | None, rows: Tensor) -> str:
    """The path that normalizes ``rows`` (``[R, N]``; only its device, dtype and width are
    read): c, triton or torch."""
    choice = resolve_backend(backend)
    device, width = rows.device, int(rows.shape[-1])
    if choice == "torch":
        return "torch"
    if choice == "c":
        if device.type != "cpu":
            raise ValueError(f"the 'c' MC-LayerNorm backend runs on CPU tensors, got {device}")
        mcln_kernel.get_kernel()  # raises with the build error
        return "c"
    if choice == "triton":
        if not triton().HAVE_TRITON:
            raise RuntimeError("the 'triton' MC-LayerNorm backend needs triton installed")
        if device.type == "cpu" and not triton().interpreting():
            raise ValueError(
                "the 'triton' MC-LayerNorm backend runs on CUDA tensors (CPU tensors only "
                "under TRITON_INTERPRET=1)"
            )
        return "triton" if triton().triton_usable(device, width) else "torch"
    if device.type == "cuda":
        return "triton" if triton().triton_usable(device, width) else "torch"
    fusable = fusable_on_cpu(rows, dtypes=None, autocast_free=True, kernels=c_kernel_ready)
    return "c" if fusable else "torch"


def layer_norm_backend(x: Tensor) -> str:
    """The fused path of a per-field LayerNorm of ``x``: c, triton, or torch (unfused)."""
    try:
        choice = choose_backend(None, x)
    except (ValueError, RuntimeError):  # a backend forced for MC-LayerNorm that x cannot take
        return "torch"
    if choice == "c" and x.dtype not in _C_DTYPES:
        return "torch"
    return choice


def c_kernel_ready() -> bool:
    """Whether the C kernel is built and loaded (builds it on first call; says once per
    process when it cannot be)."""
    if not mcln_kernel.kernel_available():
        if not _warned:
            _warned.append(True)
            warnings.warn(
                f"{mcln_kernel.kernel_error()}; MC-LayerNorm uses the slower pure-torch path",
                stacklevel=6,
            )
        return False
    return True


_warned: list[bool] = []  # the missing kernel is said once per process


# A graph being compiled asks once, at trace time, and keeps the answer as a constant (the
# build behind it takes a lock dynamo cannot trace). This is the mark that
# torch.compiler.assume_constant_result sets; calling that would import torch._dynamo (about
# a second, and triton with it) into every process that imports this module.
c_kernel_ready._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _is_compiling() -> bool:
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check()) if check is not None else False


def draw_key_tensor(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """One 63-bit draw from torch's RNG (or ``generator``) keying every row's stream, as a
    one-element int64 tensor (a compiled graph keeps the draw without reading it back)."""
    gen_device = generator.device if generator is not None else device
    return torch.randint(0, 2**63 - 1, (1,), generator=generator, device=gen_device)


def draw_key(generator: torch.Generator | None, device: torch.device) -> int:
    """:func:`draw_key_tensor` read back as an int."""
    return int(draw_key_tensor(generator, device).item())


# the key of a LayerNorm run through the kernel (k = N draws nothing)
_NO_DRAW = torch.zeros(1, dtype=torch.int64)


def normalize_rows(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    groups: int,
    k: int,
    eps: float,
    mask: Tensor | None,
    generator: torch.Generator | None,
    backend: str | None,
) -> Tensor:
    """MC-LayerNorm of rows x [R, N] with subsets of k features (k = N: LayerNorm, nothing
    drawn), or the subsets of ``mask`` [R, N] when given (then always the torch path); row r
    takes affine row ``r % groups`` of weight/bias [groups, N] (or [N] when groups is 1)."""
    rows, n = x.shape
    compute = compute_dtype(x.dtype)
    if mask is None and rows > 0:
        choice = choose_backend(backend, x)
        if choice == "triton":
            if _is_compiling() and compiled_mode() == "decomposed":
                return _decomposed_rows(x, weight, bias, groups, k, eps, generator)
            try:
                return triton().triton_mc_layer_norm(x, weight, bias, groups, k, eps, generator)
            except Exception as exc:  # any compiler or driver failure: fall back, once
                if _is_compiling() or resolve_backend(backend) == "triton":
                    raise
                triton().mark_broken(exc)
        elif choice == "c":
            # the full set (LayerNorm) draws nothing: torch's RNG stream stays as it was
            key = _NO_DRAW if k == n else draw_key_tensor(generator, x.device)
            w = weight if weight is None or weight.dtype == compute else weight.to(compute)
            b = bias if bias is None or bias.dtype == compute else bias.to(compute)
            # bf16 rows go in and come out as bf16 (the kernel widens them as it reads, no
            # float32 copies either way); the kernel's own op runs no autocast-listed op: no
            # need to switch autocast off around it (which costs as much as the rest of the
            # call at small sizes)
            rows_in = x if x.dtype in mcln_kernel.KERNEL_DTYPES else x.to(compute)
            y = mcln_kernel.kernel_mc_layer_norm(rows_in, w, b, k, eps, key, groups)
            return y if y.dtype == x.dtype else y.to(x.dtype)
    if mask is None:
        mask = torch_subset_mask(rows, n, k, generator, x.device, compute)
        counts: int | Tensor = k
    else:
        if tuple(mask.shape) != (rows, n):
            raise ValueError(f"mask must have shape [{rows}, {n}], got {list(mask.shape)}")
        mask = mask.to(device=x.device, dtype=compute)
        counts = mask.sum(dim=1, keepdim=True)
    return masked_rows(x, mask, counts, weight, bias, groups, eps)


def _decomposed_rows(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    groups: int,
    k: int,
    eps: float,
    generator: torch.Generator | None,
) -> Tensor:
    """MC-LayerNorm of x [R, N] (affine [groups, N] or [N]) as tensor ops around the Triton
    subset draw: the traced form of the ``decomposed`` :func:`compiled_mode`."""
    rows, n = x.shape
    if k == n:  # the full set draws nothing
        return masked_rows(x, None, n, weight, bias, groups, eps)
    compute = compute_dtype(x.dtype)
    seed = triton().draw_seed(x.device, generator)
    mask = triton().mc_subset_mask(seed, rows, n, k).to(compute)
    return masked_rows(x, mask, k, weight, bias, groups, eps)
