"""MC-LayerNorm: LayerNorm whose statistics come from a random subset of the features.

Math (per row; a *row* is one index of the leading dimensions, the ``N = prod(normalized_shape)``
trailing elements are its features)::

    S  ~ uniform random subset of {1..N} with exactly k = max(2, floor(f * N)) elements
    mu = 1/k * sum_{i in S} x_i                     (subset mean)
    v  = 1/k * sum_{i in S} (x_i - mu)^2            (biased subset variance)
    y_i = (x_i - mu) / sqrt(v + eps) * weight_i + bias_i       for ALL i in 1..N

Every row draws its own subset, independently of every other row and of every other layer.
``k`` is computed in exact rational arithmetic (:func:`mc_subset_size`): ``f * N`` within 1e-9
of an integer counts as that integer, so ``f=0.3, N=10`` gives 3 although the float 0.3 is
slightly below 0.3 (and ``int(0.29 * 100)`` is 28, not 29).

Modes:

* **training** (``module.train()``): the per-row subset above (algorithm 1 of the paper).
* **evaluation, one-shot** (``module.eval()``, the default at prediction time): plain LayerNorm
  over all N features, the paper's one-shot approximation of the MC integral (algorithm 2).
* **evaluation, MC** (``with mc_mode(model): ...``): keeps sampling at eval time, so repeated
  forward passes give Monte Carlo samples of the prediction; :func:`mc_predict` averages
  ``sigmoid(logits)`` over them (eq. 6 of the paper averages probabilities).

Per-field norms: :func:`mc_grouped_layer_norm` normalises ``[..., F, D]`` over D for all F
fields in one call (one kernel launch) with ``[F, D]`` affine parameters, exactly what F
separate layers compute; :class:`~ctrcal.layers.embedding.FieldNorm` uses it.

How the subsets are drawn (:data:`BACKENDS`; all give the semantics above, none shares subsets
between rows):

* ``c`` (default for CPU tensors): a small C kernel, compiled once per machine with the system
  C compiler (about a second; cached under ``~/.cache/ctrcal``) and loaded with ctypes. Per row,
  Floyd's algorithm draws a uniform subset of size ``d = min(k, N - k)`` (the complement when
  k > N/2) with d bounded integers; each is exactly uniform (Lemire's multiply-and-reject).
  The random bits are SplitMix64 outputs keyed by one draw from torch's RNG (so
  ``torch.manual_seed`` and ``generator`` reproduce the subsets) and the row index (so the
  result does not depend on the thread count). A row keeps its d drawn positions, not a mask:
  the statistics are a plain pass over the row corrected on them, and so is the backward.
  Statistics, output and backward are fused; built for the machine's own vector
  instructions. Cost grows with d (f near 0.5 costs most); see ``scripts/bench_norms.py``.
  No double backward (``once_differentiable``). Registered with ``torch.library`` as well,
  so a ``torch.compile`` graph on CPU keeps the kernel (eager calls skip the op dispatch).
* ``triton`` (default for CUDA tensors when triton is installed): one fused forward and one
  fused backward kernel (:mod:`ctrcal.layers.mcln_triton`); each row's exact-k subset comes
  from Philox bits keyed by a seed and the element's position, kept as one bit per element
  for the backward;
  float32 accumulation for float32/bfloat16/float16 input; registered with ``torch.library``
  so ``torch.compile`` keeps it. A failed compile falls back to ``torch`` with one warning.
* ``torch`` (any device; CPU fallback without a compiler): the subset is the d smallest of
  i.i.d. float64 uniform keys (``topk``; a tie, probability about N^2 * 2^-54 per row, is the
  only departure from uniform), or, when there are at most 4096 subsets of size d, a row of a
  table of all of them picked by ``floor(u * C)`` with a 53-bit u. Much slower on CPU (per-row
  selection), fine on GPU.

MC-LayerNorm is the subject of a patent application by IBM (US 2025/0094784).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrcal.errors import ConfigError
from ctrcal.layers import mcln_kernel
from ctrcal.layers.mcln_kernel import kernel_available, small_side
from ctrcal.layers.spec import MC_BACKENDS, mc_subset_size

__all__ = [
    "BACKENDS",
    "MCLayerNorm",
    "grouped_layer_norm",
    "has_mc_layers",
    "kernel_available",
    "mc_grouped_layer_norm",
    "mc_layer_norm",
    "mc_mode",
    "mc_predict",
    "mc_subset_size",
    "sample_subset_mask",
    "set_mc_mode",
]

_ShapeLike = int | Sequence[int] | torch.Size


def _check_k(n: int, k: int) -> None:
    if not 0 <= k <= n:
        raise ValueError(f"subset size k={k} must be in [0, {n}]")


def sample_subset_mask(
    rows: int,
    n: int,
    k: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    backend: str | None = None,
) -> Tensor:
    """Independent uniform random k-subsets of ``{0..n-1}``, one per row, as a 0/1 mask.

    Every row is an independent draw, uniform over all ``C(n, k)`` subsets (see the module
    docstring for how each backend draws it).

    Args:
        rows: number of rows R.
        n: number of elements N per row.
        k: subset size, ``0 <= k <= n``.
        generator: torch generator to draw from (default: torch's global RNG for ``device``).
        device: device of the result.
        dtype: dtype of the result (1 for chosen, 0 otherwise).
        backend: ``"auto"`` (default), ``"c"``, ``"triton"`` or ``"torch"``; see
            :data:`BACKENDS`. With the same generator state, ``c`` and ``triton`` give the
            subsets their layer's forward draws.

    Returns:
        Tensor [R, N] with exactly k ones in every row.
    """
    _check_k(n, k)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if _choose_backend(backend, device, n) == "triton":
        seed = _triton().draw_seed(device, generator)
        return _triton().subset_mask(rows, n, k, seed).to(dtype)
    if _use_kernel(backend, device):
        key = _draw_key(generator, device)
        return mcln_kernel.subset_mask(rows, n, k, key).to(dtype)
    return _torch_subset_mask(rows, n, k, generator, device, dtype)


# All subsets of a small row as a table: one uniform index per row picks one exactly.
_TABLE_LIMIT = 4096
_tables: dict[tuple[int, int, str], Tensor] = {}


def _subset_table(n: int, d: int, device: torch.device) -> Tensor:
    key = (n, d, str(device))
    table = _tables.get(key)
    if table is None:
        if d == 0:
            table = torch.zeros(1, n)
        else:
            combos = torch.combinations(torch.arange(n), d).reshape(-1, d)
            table = torch.zeros(combos.shape[0], n).scatter_(1, combos, 1.0)
        table = table.to(device)
        _tables[key] = table
    return table


def _torch_subset_mask(
    rows: int,
    n: int,
    k: int,
    generator: torch.Generator | None,
    device: torch.device,
    dtype: torch.dtype,
) -> Tensor:
    d, invert = small_side(n, k)
    if math.comb(n, d) <= _TABLE_LIMIT:
        table = _subset_table(n, d, device)
        u = torch.rand(rows, generator=generator, device=device, dtype=torch.float64)
        # floor(u * C) with a 53-bit u: each subset within C * 2**-53 of probability 1/C
        idx = (u * table.shape[0]).long().clamp_(max=table.shape[0] - 1)
        mask = F.embedding(idx, table)
    else:
        # the d smallest of i.i.d. float64 keys: a uniform d-subset (ties ~ n**2 * 2**-54)
        keys = torch.rand(rows, n, generator=generator, device=device, dtype=torch.float64)
        idx = keys.topk(d, dim=1, largest=False, sorted=False).indices
        mask = torch.zeros(rows, n, device=device).scatter_(1, idx, 1.0)
    if invert:
        mask = 1.0 - mask
    return mask.to(dtype)


def _as_shape(normalized_shape: _ShapeLike) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


def mc_layer_norm(
    input: Tensor,
    normalized_shape: _ShapeLike,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    fraction: float = 0.8,
    *,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    backend: str | None = None,
    subset_size: int | None = None,
) -> Tensor:
    """Functional MC-LayerNorm (the training-mode computation; see the module docstring).

    Args:
        input: [..., *normalized_shape]; every index of the leading dims is one row.
        normalized_shape: trailing shape normalized over (N = its product).
        weight: [*normalized_shape] or None.
        bias: [*normalized_shape] or None.
        eps: added to the subset variance inside the square root.
        fraction: the paper's f; the subset size is :func:`mc_subset_size` (N, f).
        mask: optional [R, N] 0/1 mask (R = number of rows), used instead of drawing one (for
            tests and custom samplers); each row's statistics are over its ones.
        generator: torch generator for the subset draw.
        backend: ``"auto"`` (default), ``"c"``, ``"triton"`` or ``"torch"``; see
            :data:`BACKENDS`.
        subset_size: k already computed from (N, fraction) (layers pass theirs: the exact
            rational arithmetic of :func:`mc_subset_size` is not traceable by torch.compile).

    Returns:
        Tensor of the input's shape and dtype (statistics in float32, or float64 for float64
        input).

    Raises:
        ValueError: wrong trailing shape, or weight/bias on another device than the input.
    """
    shape = _as_shape(normalized_shape)
    n = math.prod(shape)
    if tuple(input.shape[input.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"expected input with trailing shape {list(shape)}, got {list(input.shape)}"
        )
    _check_devices(input, weight, bias)
    if mask is None:
        k = subset_size if subset_size is not None else mc_subset_size(n, fraction)
        if k == n:  # the full set: exactly LayerNorm, at LayerNorm's cost
            return F.layer_norm(input, shape, weight, bias, eps)
    else:
        k = 0
    # no reshapes where the shapes already fit: each one is a node of the autograd graph,
    # and at small and medium sizes those nodes cost as much as the kernel's work
    w = weight if weight is None or weight.dim() == 1 else weight.reshape(n)
    b = bias if bias is None or bias.dim() == 1 else bias.reshape(n)
    flat = input.dim() == 2 and len(shape) == 1
    y = _normalize_rows(
        input if flat else input.reshape(-1, n), w, b, 1, k, eps, mask, generator, backend
    )
    return y if flat else y.reshape(input.shape)


def mc_grouped_layer_norm(
    input: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    fraction: float = 0.8,
    *,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    backend: str | None = None,
    subset_size: int | None = None,
) -> Tensor:
    """Per-field MC-LayerNorm of ``input [..., G, D]`` over D, in one call for all G fields.

    Exactly what G separate :class:`MCLayerNorm` (D) layers applied to ``input[..., g, :]``
    compute (each (row, field) draws its own k-subset of the D features, k from
    :func:`mc_subset_size` (D, f)), with field g's affine pair ``weight[g], bias[g]``.

    Args:
        input: [..., G, D].
        weight: [G, D] or None.
        bias: [G, D] or None.
        eps: added to the subset variance inside the square root.
        fraction: the paper's f.
        mask: optional [R * G, D] 0/1 mask (R = number of leading rows), as in
            :func:`mc_layer_norm`.
        generator: torch generator for the subset draw.
        backend: see :data:`BACKENDS`.
        subset_size: k already computed from (D, fraction), as in :func:`mc_layer_norm`.

    Returns:
        Tensor of the input's shape and dtype.

    Raises:
        ValueError: input not [..., G, D], weight/bias not [G, D], or on another device.
    """
    if input.dim() < 2:
        raise ValueError(f"expected input [..., G, D], got {list(input.shape)}")
    groups, d = int(input.shape[-2]), int(input.shape[-1])
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (groups, d):
            raise ValueError(
                f"{name} must have shape [{groups}, {d}] for input {list(input.shape)}, "
                f"got {list(p.shape)}"
            )
    _check_devices(input, weight, bias)
    if mask is None:
        k = subset_size if subset_size is not None else mc_subset_size(d, fraction)
        if k == d:  # the full set: per-field LayerNorm
            return grouped_layer_norm(input, weight, bias, eps)
    else:
        k = 0
    x = input.reshape(-1, d)
    y = _normalize_rows(x, weight, bias, groups, k, eps, mask, generator, backend)
    return y.reshape(input.shape)


def grouped_layer_norm(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """Per-field LayerNorm of ``input [..., G, D]`` over D with field g's affine ``[G, D]`` row.

    Runs as MC-LayerNorm's fused kernel with the full set (k = D: nothing drawn, statistics
    over the whole row), one pass forward and one backward: the C kernel for CPU float32/
    float64 tensors, the Triton kernel for CUDA tensors; elsewhere (or with the ``torch``
    backend) ``F.layer_norm`` followed by the stacked affine. The fused path matters for fair
    comparisons: the unfused one costs about twice the C kernel's time at (4096, 39, 16) on
    CPU and 4.8x the Triton MC kernel's on an H100, which would make per-field MC-LayerNorm
    look cheaper than it is against per-field LayerNorm.

    Args:
        input: [..., G, D].
        weight: [G, D] or None.
        bias: [G, D] or None.
        eps: added to the variance inside the square root.

    Returns:
        Tensor of the input's shape (and dtype, except that the unfused path follows
        autocast).
    """
    d = int(input.shape[-1])
    if input.numel() > 0 and _layer_norm_backend(input) != "torch":
        groups = int(input.shape[-2])
        w = weight.to(input.dtype) if weight is not None else None
        b = bias.to(input.dtype) if bias is not None else None
        y = _normalize_rows(input.reshape(-1, d), w, b, groups, d, eps, None, None, None)
        return y.reshape(input.shape)
    y = F.layer_norm(input, (d,), None, None, eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _layer_norm_backend(x: Tensor) -> str:
    """The fused path of a per-field LayerNorm of ``x``: c, triton, or torch (unfused)."""
    try:
        choice = _choose_backend(None, x.device, int(x.shape[-1]))
    except (ValueError, RuntimeError):  # a backend forced for MC-LayerNorm that x cannot take
        return "torch"
    if choice == "c" and x.dtype not in (torch.float32, torch.float64):
        return "torch"
    return choice


def _check_devices(input: Tensor, *params: Tensor | None) -> None:
    for p in params:
        if p is not None and p.device != input.device:
            raise ValueError(
                f"MC-LayerNorm input is on {input.device} but its weight/bias on {p.device}; "
                "move the module to the input's device (module.to(device))"
            )


def _normalize_rows(
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
    """MC-LayerNorm of rows x [R, N]; row r takes affine row ``r % groups`` of weight/bias
    [groups, N] (or [N] when groups is 1)."""
    rows, n = x.shape
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if mask is None and rows > 0:
        choice = _choose_backend(backend, x.device, n)
        if choice == "triton":
            if _is_compiling() and compiled_mode() == "decomposed":
                return _decomposed_rows(x, weight, bias, groups, k, eps, generator)
            try:
                return _triton().triton_mc_layer_norm(x, weight, bias, groups, k, eps, generator)
            except Exception as exc:  # any compiler or driver failure: fall back, once
                if _is_compiling() or _resolve_backend(backend) == "triton":
                    raise
                _triton().mark_broken(exc)
        elif choice == "c":
            # the full set (LayerNorm) draws nothing: torch's RNG stream stays as it was
            key = _NO_DRAW if k == n else _draw_key_tensor(generator, x.device)
            w = weight.to(compute) if weight is not None else None
            b = bias.to(compute) if bias is not None else None
            # the kernel's own op runs no autocast-listed op: no need to switch autocast off
            # around it (which costs as much as the rest of the call at small sizes)
            y = mcln_kernel.kernel_mc_layer_norm(x.to(compute), w, b, k, eps, key, groups)
            return y.to(x.dtype)
    if mask is None:
        mask = _torch_subset_mask(rows, n, k, generator, x.device, compute)
        counts: int | Tensor = k
    else:
        if tuple(mask.shape) != (rows, n):
            raise ValueError(f"mask must have shape [{rows}, {n}], got {list(mask.shape)}")
        mask = mask.to(device=x.device, dtype=compute)
        counts = mask.sum(dim=1, keepdim=True)
    return _masked_rows(x, mask, counts, weight, bias, groups, eps)


def _masked_rows(
    x: Tensor,
    mask: Tensor | None,
    counts: int | Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    groups: int,
    eps: float,
) -> Tensor:
    """Rows x [R, N] normalised with the statistics of their ``mask`` [R, N] (0/1, in the
    compute dtype; None: every feature) over ``counts`` (an int, or [R, 1]) features, then the
    affine (weight/bias [groups, N] or [N]). Float32 statistics (float64 for float64 input);
    the output has x's dtype."""
    rows, n = x.shape
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(x.device.type, enabled=False):
        xf = x.to(compute)
        masked = xf if mask is None else xf * mask
        mu = masked.sum(dim=1, keepdim=True) / counts
        xc = xf - mu
        sq = xc * xc if mask is None else xc * xc * mask
        var = sq.sum(dim=1, keepdim=True) / counts
        y = (xc * torch.rsqrt(var + eps)).reshape(-1, groups, n)
        if weight is not None:
            y = y * weight.to(compute)
        if bias is not None:
            y = y + bias.to(compute)
    return y.reshape(rows, n).to(x.dtype)


COMPILED_MODES = ("kernel", "decomposed")
"""How a ``torch.compile`` graph runs the Triton MC-LayerNorm (environment variable
``CTRCAL_MCLN_COMPILED``, read when a graph is traced). ``kernel`` (default): the fused forward
and backward ops, kept whole in the graph. ``decomposed``: only the subset draw is an op
(:func:`ctrcal.layers.mcln_triton.mc_subset_mask`, the same subsets from the same seed); the
masked statistics, the affine and their gradients are ordinary tensor ops that inductor fuses
with the neighbouring operations, at the cost of a one-byte-per-element mask."""


def compiled_mode() -> str:
    """The :data:`COMPILED_MODES` entry in force (``CTRCAL_MCLN_COMPILED``, default kernel)."""
    mode = (os.environ.get("CTRCAL_MCLN_COMPILED") or "kernel").strip().lower()
    if mode not in COMPILED_MODES:
        raise ConfigError(
            f"CTRCAL_MCLN_COMPILED must be one of {', '.join(COMPILED_MODES)}, got {mode!r}"
        )
    return mode


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
    subset draw: the traced form of the ``decomposed`` :func:`compiled_mode`. Statistics in
    float32 (float64 input: float64); the output has x's dtype."""
    rows, n = x.shape
    if k == n:  # the full set draws nothing
        return _masked_rows(x, None, n, weight, bias, groups, eps)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    seed = _triton().draw_seed(x.device, generator)
    mask = _triton().mc_subset_mask(seed, rows, n, k).to(compute)
    return _masked_rows(x, mask, k, weight, bias, groups, eps)


# ---------------------------------------------------------------------------------------------
# Backend choice (the fused kernels live in ctrcal.layers.mcln_kernel and mcln_triton)

BACKENDS = MC_BACKENDS  # named once, in ctrcal.layers.spec (config checks need them)
"""``auto``: the C kernel for CPU tensors when it builds (else ``torch``), the Triton kernel
for CUDA tensors when triton is installed and compiles (else ``torch``, with one warning).
``c``: the C kernel (CPU; an error if it cannot be built). ``triton``: the Triton kernel (CUDA
tensors, or CPU tensors under ``TRITON_INTERPRET=1``; an error without triton). ``torch``: pure
torch ops on any device (the subset from a table of all subsets when ``C(N, d) <= 4096``, else
the d smallest of i.i.d. float64 keys). Rows wider than
:data:`ctrcal.layers.mcln_triton.MAX_WIDTH` take the torch path instead of ``triton``. The
environment variable ``CTRCAL_MCLN_BACKEND`` sets the default."""


def _resolve_backend(backend: str | None) -> str:
    choice = backend or os.environ.get("CTRCAL_MCLN_BACKEND") or "auto"
    choice = choice.strip().lower()
    if choice not in BACKENDS:
        raise ConfigError(
            f"MC-LayerNorm backend must be one of {', '.join(BACKENDS)}, got {choice!r}"
        )
    return choice


def _triton() -> Any:
    """The Triton kernels' module, imported on first use: importing triton costs a CPU-only
    process 0.3-0.5 s of start-up for kernels it never launches."""
    from ctrcal.layers import mcln_triton

    return mcln_triton


def _choose_backend(backend: str | None, device: torch.device, width: int) -> str:
    """The path that normalizes rows of ``width`` on ``device``: c, triton or torch."""
    choice = _resolve_backend(backend)
    if choice == "torch":
        return "torch"
    if choice == "c":
        if device.type != "cpu":
            raise ValueError(f"the 'c' MC-LayerNorm backend runs on CPU tensors, got {device}")
        mcln_kernel.get_kernel()  # raises with the build error
        return "c"
    if choice == "triton":
        if not _triton().HAVE_TRITON:
            raise RuntimeError("the 'triton' MC-LayerNorm backend needs triton installed")
        if device.type == "cpu" and not _triton().interpreting():
            raise ValueError(
                "the 'triton' MC-LayerNorm backend runs on CUDA tensors (CPU tensors only "
                "under TRITON_INTERPRET=1)"
            )
        return "triton" if _triton().triton_usable(device, width) else "torch"
    if device.type == "cuda":
        return "triton" if _triton().triton_usable(device, width) else "torch"
    if device.type != "cpu":
        return "torch"
    return "c" if _c_kernel_ready() else "torch"


def _use_kernel(backend: str | None, device: torch.device) -> bool:
    """Whether the C kernel draws subsets for ``device`` (see :func:`_choose_backend`)."""
    if _resolve_backend(backend) == "triton":
        return False
    return _choose_backend(backend, device, 0) == "c"


def _c_kernel_ready() -> bool:
    if not mcln_kernel.kernel_available():
        if not _warned:
            _warned.append(True)
            warnings.warn(
                f"{mcln_kernel.kernel_error()}; MC-LayerNorm uses the slower pure-torch path",
                stacklevel=5,
            )
        return False
    return True


_warned: list[bool] = []  # the missing kernel is said once per process


# A graph being compiled asks once, at trace time, and keeps the answer as a constant (the
# build behind it takes a lock dynamo cannot trace). This is the mark that
# torch.compiler.assume_constant_result sets; calling that would import torch._dynamo (about
# a second, and triton with it) into every process that imports this module.
_c_kernel_ready._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _is_compiling() -> bool:
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check()) if check is not None else False


def _draw_key_tensor(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """One 63-bit draw from torch's RNG (or ``generator``) keying every row's stream, as a
    one-element int64 tensor (a compiled graph keeps the draw without reading it back)."""
    gen_device = generator.device if generator is not None else device
    return torch.randint(0, 2**63 - 1, (1,), generator=generator, device=gen_device)


def _draw_key(generator: torch.Generator | None, device: torch.device) -> int:
    """:func:`_draw_key_tensor` read back as an int."""
    return int(_draw_key_tensor(generator, device).item())


# the key of a LayerNorm run through the kernel (k = N draws nothing)
_NO_DRAW = torch.zeros(1, dtype=torch.int64)


class MCLayerNorm(nn.LayerNorm):
    """Drop-in :class:`torch.nn.LayerNorm` with Monte Carlo subset statistics.

    Same constructor and parameters (``weight``, ``bias``) as ``nn.LayerNorm``, so a LayerNorm
    state_dict loads into it and back; plus ``fraction`` (the paper's f).

    * Training: each row (every index of the leading dimensions) draws its own uniform random
      subset S of exactly ``k = max(2, floor(f * N))`` of the ``N = prod(normalized_shape)``
      elements; the biased mean and variance over S normalize all N elements (eps inside the
      square root), then the elementwise affine is applied. ``k`` is computed exactly, see
      :func:`mc_subset_size`. ``f = 1`` is exactly LayerNorm.
    * Evaluation: one-shot, i.e. exactly ``F.layer_norm`` (the paper's one-shot approximation).
    * MC mode at evaluation (``mc_sampling = True``, or ``with mc_mode(model):``): keeps
      sampling so repeated passes are Monte Carlo samples.

    Draws come from torch's RNG (so ``torch.manual_seed`` reproduces them) or from
    ``generator`` when one is set.

    Args:
        normalized_shape: int or trailing shape normalized over.
        eps: added to the variance inside the square root.
        elementwise_affine: learn ``weight`` (init 1) and ``bias`` (init 0).
        bias: learn ``bias`` too (with ``elementwise_affine``).
        device: parameter device.
        dtype: parameter dtype.
        fraction: the paper's f, ``0 < f <= 1`` (keyword only).
        generator: optional torch generator for the subset draws (keyword only).
        backend: ``"auto"``, ``"c"``, ``"triton"`` or ``"torch"`` (keyword only; None reads
            ``CTRCAL_MCLN_BACKEND``, default auto); see :data:`BACKENDS`.

    Shape:
        input [..., *normalized_shape] -> output of the same shape and dtype.

    Raises:
        ConfigError (a ValueError): f outside (0, 1] or f * N < 2.
    """

    def __init__(
        self,
        normalized_shape: _ShapeLike,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        fraction: float = 0.8,
        generator: torch.Generator | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias, device=device, dtype=dtype
        )
        self.fraction = fraction
        self.subset_size = mc_subset_size(math.prod(self.normalized_shape), fraction)
        if backend is not None:
            _resolve_backend(backend)
        self.backend = backend
        self.generator = generator
        self.mc_sampling = False

    @property
    def sampling(self) -> bool:
        """Whether the next forward draws subsets (training, or MC mode at evaluation)."""
        return self.training or self.mc_sampling

    def forward(self, input: Tensor) -> Tensor:
        if not self.sampling:
            return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return mc_layer_norm(
            input,
            self.normalized_shape,
            self.weight,
            self.bias,
            self.eps,
            self.fraction,
            generator=self.generator,
            backend=self.backend,
            subset_size=self.subset_size,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fraction={self.fraction}, k={self.subset_size}"


# ---------------------------------------------------------------------------------------------
# Model-level MC mode and MC integration


def _mc_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "mc_sampling")]


def has_mc_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds a layer that MC sampling switches (so MC passes differ)."""
    return bool(_mc_layers(model))


def _noop_pre_hook(module: nn.Module, args: tuple) -> None:
    return None


def set_mc_mode(model: nn.Module, enabled: bool = True) -> int:
    """Switch every MC layer (module with an ``mc_sampling`` flag) of ``model``; return count."""
    layers = _mc_layers(model)
    for layer in layers:
        _set_layer(layer, enabled)
    return len(layers)


def _set_layer(layer: nn.Module, enabled: bool) -> None:
    layer.mc_sampling = enabled
    handle = layer.__dict__.pop("_mc_hook_handle", None)
    if handle is not None:
        handle.remove()
    if enabled:
        # Fused inference paths in foreign code (e.g. nn.TransformerEncoderLayer at eval under
        # no_grad) read the norm's weights and skip its forward; they step aside when a module
        # has a forward hook, so an MC layer carries a no-op one while sampling at eval.
        layer.__dict__["_mc_hook_handle"] = layer.register_forward_pre_hook(_noop_pre_hook)


class mc_mode:  # noqa: N801 - used like torch.set_grad_enabled
    """Put every MC layer of ``model`` into (or out of) MC-sampling mode.

    Like ``torch.set_grad_enabled``, it takes effect when called and, used as a context
    manager, restores each layer's previous setting on exit::

        model.eval()
        with mc_mode(model):
            samples = [torch.sigmoid(model(x)) for _ in range(10)]

    Args:
        model: any module tree; MC layers are modules with an ``mc_sampling`` attribute.
        enabled: True samples at evaluation, False gives one-shot LayerNorm.

    Attributes:
        count: how many MC layers were switched.
    """

    def __init__(self, model: nn.Module, enabled: bool = True) -> None:
        self._layers = _mc_layers(model)
        self._previous = [bool(layer.mc_sampling) for layer in self._layers]
        self.count = len(self._layers)
        for layer in self._layers:
            _set_layer(layer, enabled)

    def __enter__(self) -> mc_mode:
        return self

    def __exit__(self, *exc: object) -> None:
        for layer, previous in zip(self._layers, self._previous, strict=True):
            _set_layer(layer, previous)


@torch.no_grad()
def mc_predict(
    model: nn.Module,
    *inputs: Tensor,
    n_samples: int = 10,
    max_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Monte Carlo prediction: mean and std of ``sigmoid(model(*inputs))`` over samples.

    The model runs in eval mode with every MC layer sampling (its training flag is restored
    afterwards). Instead of a Python loop over samples, the batch is repeated along dim 0 so one
    forward pass yields many samples; ``max_rows`` bounds the rows of one pass.

    Args:
        model: module whose forward takes batch-first tensors and returns logits [B] or [B, 1].
        *inputs: tensors with the batch dimension first (e.g. categorical [B, Fc] and
            numeric [B, Fn]).
        n_samples: number of MC samples per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).

    Returns:
        (mean_prob [B], std_prob [B]) in float32; std is the population std over samples.
    """
    if not inputs:
        raise ValueError("mc_predict needs at least one input tensor")
    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if max_rows is not None and int(max_rows) < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    batch = inputs[0].shape[0]
    for t in inputs:
        if t.shape[0] != batch:
            raise ValueError(
                f"all inputs need the same batch size, got {[t.shape[0] for t in inputs]}"
            )
    n_samples = int(n_samples)
    limit = n_samples * batch if max_rows is None else int(max_rows)
    was_training = model.training
    model.eval()
    probs: list[Tensor] = []
    try:
        with mc_mode(model) as mode:
            if mode.count == 0:
                warnings.warn(
                    "mc_predict: the model has no MC layers; all samples are identical",
                    stacklevel=3,
                )
            step = max(1, min(batch, limit))
            for start in range(0, batch, step):
                chunk = [t[start : start + step] for t in inputs]
                rows = chunk[0].shape[0]
                per_pass = max(1, limit // max(rows, 1))
                parts = []
                done = 0
                while done < n_samples:
                    s = min(per_pass, n_samples - done)
                    rep = [t.repeat(s, *([1] * (t.dim() - 1))) for t in chunk]
                    logits = model(*rep)
                    if logits.numel() != s * rows:
                        raise ValueError(
                            f"mc_predict expects logits [B] or [B, 1], got {list(logits.shape)}"
                        )
                    parts.append(torch.sigmoid(logits.float().reshape(s, rows)))
                    done += s
                probs.append(torch.cat(parts, dim=0))
    finally:
        model.train(was_training)
    p = (
        torch.cat(probs, dim=1)
        if probs
        else inputs[0].new_zeros((n_samples, 0), dtype=torch.float32)
    )
    std, mean = torch.std_mean(p, dim=0, correction=0)
    return mean, std
