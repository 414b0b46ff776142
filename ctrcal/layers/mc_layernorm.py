"""MC-LayerNorm: LayerNorm whose statistics come from a random subset of the features.

Math (per row; a *row* is one index of the leading dimensions, the ``N = prod(normalized_shape)``
trailing elements are its features)::

    S  ~ uniform random subset of {1..N} with exactly k = max(2, floor(f * N)) elements
    mu = 1/k * sum_{i in S} x_i                     (subset mean)
    v  = 1/k * sum_{i in S} (x_i - mu)^2            (biased subset variance)
    y_i = (x_i - mu) / sqrt(v + eps) * weight_i + bias_i       for ALL i in 1..N

Every row draws its own subset, independently of every other row and of every other layer.

Modes:

* **training** (``module.train()``): the per-row subset above (algorithm 1 of the paper).
* **evaluation, one-shot** (``module.eval()``, the default at prediction time): plain LayerNorm
  over all N features, the paper's one-shot approximation of the MC integral (algorithm 2).
* **evaluation, MC** (``with mc_mode(model): ...``): keeps sampling at eval time, so repeated
  forward passes give Monte Carlo samples of the prediction; :func:`mc_predict` averages
  ``sigmoid(logits)`` over them (eq. 6 of the paper averages probabilities).

MC-LayerNorm is the subject of a patent application by IBM (US 2025/0094784).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrcal.errors import ConfigError

__all__ = [
    "MCLayerNorm",
    "mc_layer_norm",
    "mc_mode",
    "mc_predict",
    "mc_subset_size",
    "sample_subset_mask",
    "set_mc_mode",
]

_ShapeLike = int | Sequence[int] | torch.Size

# |f*N - round(f*N)| at or below this counts as the integer: a float fraction is the nearest
# binary number to what the user wrote (0.3 is stored as 0.29999999999999998889...), and the
# product's representation error is ~N * 2**-53, far below this for any realistic N.
_INTEGER_TOLERANCE = Fraction(1, 10**9)


def mc_subset_size(n: int, fraction: float | Fraction) -> int:
    """Subset size ``k = max(2, floor(fraction * n))`` in exact rational arithmetic.

    The float ``fraction`` is converted to its exact rational value; a product within 1e-9 of
    an integer is taken as that integer, so ``fraction=0.3, n=10`` gives 3 and
    ``fraction=0.29, n=100`` gives 29 (naive float code gives 2 and 28).

    Args:
        n: number of normalized elements N (>= 2).
        fraction: the paper's f, ``0 < f <= 1``.

    Raises:
        ConfigError (a ValueError): f outside (0, 1], or f * N < 2 (fewer than two features
            would make the subset variance meaningless).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (numbers.Real, Fraction)):
        raise ConfigError(f"MC-LayerNorm fraction must be a number in (0, 1], got {fraction!r}")
    if isinstance(fraction, float) and not math.isfinite(fraction):
        raise ConfigError(f"MC-LayerNorm fraction must be in (0, 1], got {fraction!r}")
    f = Fraction(fraction)
    if not 0 < f <= 1:
        raise ConfigError(f"MC-LayerNorm fraction must be in (0, 1], got {fraction!r}")
    product = f * int(n)
    nearest = round(product)
    k = nearest if abs(product - nearest) <= _INTEGER_TOLERANCE else math.floor(product)
    if k < 2:
        raise ConfigError(
            f"MC-LayerNorm needs fraction * N >= 2, got fraction={fraction!r} with N={n} "
            f"(f*N={float(product):.6g}); use a larger fraction or a wider layer"
        )
    return max(2, k)


def sample_subset_mask(
    rows: int,
    n: int,
    k: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Independent uniform random k-subsets of ``{0..n-1}``, one per row, as a 0/1 mask.

    Args:
        rows: number of rows R.
        n: number of elements N per row.
        k: subset size, ``0 <= k <= n``.
        generator: torch generator to draw from (default: torch's global RNG for ``device``).
        device: device of the result.
        dtype: dtype of the result (1 for chosen, 0 otherwise).

    Returns:
        Tensor [R, N] with exactly k ones in every row.
    """
    if not 0 <= k <= n:
        raise ValueError(f"subset size k={k} must be in [0, {n}]")
    keys = torch.rand(rows, n, generator=generator, device=device)
    idx = keys.topk(k, dim=1, sorted=False).indices
    mask = torch.zeros(rows, n, device=device, dtype=dtype)
    return mask.scatter_(1, idx, 1.0)


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

    Returns:
        Tensor of the input's shape and dtype (statistics computed in float32 or wider).
    """
    shape = _as_shape(normalized_shape)
    n = math.prod(shape)
    if tuple(input.shape[input.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"expected input with trailing shape {list(shape)}, got {list(input.shape)}"
        )
    x = input.reshape(-1, n)
    rows = x.shape[0]
    k: int | Tensor
    if mask is None:
        k = mc_subset_size(n, fraction)
        if k == n:  # the full set: exactly LayerNorm, at LayerNorm's cost
            return F.layer_norm(input, shape, weight, bias, eps)
        mask = sample_subset_mask(rows, n, k, generator=generator, device=x.device)
    else:
        if tuple(mask.shape) != (rows, n):
            raise ValueError(f"mask must have shape [{rows}, {n}], got {list(mask.shape)}")
        k = mask  # replaced by the per-row counts below
    compute = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        xf = x.to(compute)
        m = mask.to(compute)
        if not isinstance(k, int):
            k = m.sum(dim=1, keepdim=True)
        mu = (xf * m).sum(dim=1, keepdim=True) / k
        xc = xf - mu
        var = (xc * xc * m).sum(dim=1, keepdim=True) / k
        y = (xc * torch.rsqrt(var + eps)).reshape(input.shape)
        if weight is not None:
            y = y * weight.to(compute)
        if bias is not None:
            y = y + bias.to(compute)
    return y.to(input.dtype)


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
    ) -> None:
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias, device=device, dtype=dtype
        )
        self.fraction = fraction
        self.subset_size = mc_subset_size(math.prod(self.normalized_shape), fraction)
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
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fraction={self.fraction}, k={self.subset_size}"


# ---------------------------------------------------------------------------------------------
# Model-level MC mode and MC integration


def _mc_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "mc_sampling")]


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
