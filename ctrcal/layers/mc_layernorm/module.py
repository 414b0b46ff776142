"""The MC-LayerNorm layer and its modes, and the switch that puts a whole model in MC mode.

Modes of :class:`MCLayerNorm`:

* **training** (``module.train()``): the per-row subset of :mod:`.definition` (algorithm 1 of
  the paper).
* **evaluation, one-shot** (``module.eval()``, the default at prediction time): plain LayerNorm
  over all N features, the paper's one-shot approximation of the MC integral (algorithm 2).
* **evaluation, MC** (``with mc_mode(model): ...``): keeps sampling at eval time, so repeated
  forward passes give Monte Carlo samples of the prediction;
  :func:`~ctrcal.layers.mc_layernorm.predict.mc_predict` averages them.

:func:`mc_mode` and :func:`set_mc_mode` switch every *MC layer* of a model: any module with an
``mc_sampling`` flag (this layer, and other people's layers that follow the same protocol).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrcal.core.norm_spec import mc_subset_size
from ctrcal.layers.mc_layernorm.dispatch import resolve_backend
from ctrcal.layers.mc_layernorm.functional import ShapeLike, mc_layer_norm

__all__ = ["MCLayerNorm", "has_mc_layers", "mc_mode", "set_mc_mode"]


class MCLayerNorm(nn.LayerNorm):
    """Drop-in :class:`torch.nn.LayerNorm` with Monte Carlo subset statistics.

    Same constructor and parameters (``weight``, ``bias``) as ``nn.LayerNorm``, so a LayerNorm
    state_dict loads into it and back; plus ``fraction`` (the paper's f).

    * Training: each row (every index of the leading dimensions) normalises all its
      ``N = prod(normalized_shape)`` elements by the statistics of its own uniform random
      subset of exactly ``k = max(2, floor(f * N))`` of them (:mod:`.definition`), then the
      elementwise affine. ``f = 1`` is exactly LayerNorm.
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
            ``CTRCAL_MCLN_BACKEND``, default auto); see
            :data:`~ctrcal.layers.mc_layernorm.dispatch.BACKENDS`.

    Shape:
        input [..., *normalized_shape] -> output of the same shape and dtype.

    Raises:
        ConfigError (a ValueError): f outside (0, 1] or f * N < 2.
    """

    def __init__(
        self,
        normalized_shape: ShapeLike,
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
            resolve_backend(backend)
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
# Model-level MC mode


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
