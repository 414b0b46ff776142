"""MC-LayerNorm's functional API: argument checks, then :func:`.dispatch.normalize_rows`.

* :func:`mc_layer_norm`: the row layer over trailing ``normalized_shape`` (what
  :class:`~ctrcal.layers.mc_layernorm.module.MCLayerNorm` runs while sampling);
* :func:`mc_grouped_layer_norm`: per-field MC-LayerNorm of ``[..., G, D]`` over D for all G
  fields in one call (one kernel launch), with ``[G, D]`` affine parameters -- exactly what G
  separate layers compute; :class:`~ctrcal.layers.embedding.FieldNorm` runs it;
* :func:`grouped_layer_norm`: the same with every feature (per-field LayerNorm), fused;
* :func:`sample_subset_mask`: the subsets a backend draws, as a 0/1 mask.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ctrcal.core.norm_spec import mc_subset_size
from ctrcal.layers.kernels import mcln_kernel
from ctrcal.layers.mc_layernorm.definition import check_k, torch_subset_mask
from ctrcal.layers.mc_layernorm.dispatch import (
    choose_backend,
    draw_key,
    layer_norm_backend,
    normalize_rows,
    triton,
)

__all__ = ["grouped_layer_norm", "mc_grouped_layer_norm", "mc_layer_norm", "sample_subset_mask"]

ShapeLike = int | Sequence[int] | torch.Size


def as_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints."""
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


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

    Every row is an independent draw, uniform over all ``C(n, k)`` subsets (see
    :mod:`.dispatch` for how each backend draws it).

    Args:
        rows: number of rows R.
        n: number of elements N per row.
        k: subset size, ``0 <= k <= n``.
        generator: torch generator to draw from (default: torch's global RNG for ``device``).
        device: device of the result.
        dtype: dtype of the result (1 for chosen, 0 otherwise).
        backend: ``"auto"`` (default), ``"c"``, ``"triton"`` or ``"torch"``; see
            :data:`~.dispatch.BACKENDS`. With the same generator state, ``c`` and ``triton``
            give the subsets their layer's forward draws.

    Returns:
        Tensor [R, N] with exactly k ones in every row.
    """
    check_k(n, k)
    device = torch.device(device) if device is not None else torch.device("cpu")
    # the backend is chosen as for rows of width n on this device (none is allocated)
    choice = choose_backend(backend, torch.empty(0, n, device=device))
    if choice == "triton":
        seed = triton().draw_seed(device, generator)
        return triton().subset_mask(rows, n, k, seed).to(dtype)
    if choice == "c":
        key = draw_key(generator, device)
        return mcln_kernel.subset_mask(rows, n, k, key).to(dtype)
    return torch_subset_mask(rows, n, k, generator, device, dtype)


def mc_layer_norm(
    input: Tensor,
    normalized_shape: ShapeLike,
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
    """Functional MC-LayerNorm (the training-mode computation of :mod:`.definition`).

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
            :data:`~.dispatch.BACKENDS`.
        subset_size: k already computed from (N, fraction) (layers pass theirs: the exact
            rational arithmetic of :func:`mc_subset_size` is not traceable by torch.compile).

    Returns:
        Tensor of the input's shape and dtype (statistics in float32, or float64 for float64
        input).

    Raises:
        ValueError: wrong trailing shape, or weight/bias on another device than the input.
    """
    shape = as_shape(normalized_shape)
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
    y = normalize_rows(
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

    Exactly what G separate :class:`~ctrcal.layers.mc_layernorm.module.MCLayerNorm` (D) layers
    applied to ``input[..., g, :]`` compute (each (row, field) draws its own k-subset of the D
    features, k from :func:`mc_subset_size` (D, f)), with field g's affine pair
    ``weight[g], bias[g]``.

    Args:
        input: [..., G, D].
        weight: [G, D] or None.
        bias: [G, D] or None.
        eps: added to the subset variance inside the square root.
        fraction: the paper's f.
        mask: optional [R * G, D] 0/1 mask (R = number of leading rows), as in
            :func:`mc_layer_norm`.
        generator: torch generator for the subset draw.
        backend: see :data:`~.dispatch.BACKENDS`.
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
    y = normalize_rows(x, weight, bias, groups, k, eps, mask, generator, backend)
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
    if input.numel() > 0 and layer_norm_backend(input) != "torch":
        groups = int(input.shape[-2])
        w = weight.to(input.dtype) if weight is not None else None
        b = bias.to(input.dtype) if bias is not None else None
        y = normalize_rows(input.reshape(-1, d), w, b, groups, d, eps, None, None, None)
        return y.reshape(input.shape)
    y = F.layer_norm(input, (d,), None, None, eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _check_devices(input: Tensor, *params: Tensor | None) -> None:
    for p in params:
        if p is not None and p.device != input.device:
            raise ValueError(
                f"MC-LayerNorm input is on {input.device} but its weight/bias on {p.device}; "
                "move the module to the input's device (module.to(device))"
            )
