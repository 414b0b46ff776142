"""When a fused path may stand in for stock modules and torch ops: the one rule.

On the CPU, ctrcal runs a few chains of stock modules and ops as fused kernels: the small C
kernels of :mod:`ctrcal.layers.kernels.cpu_kernels` (dropout, LayerNorm + ReLU + dropout,
MaskBlock's masked input, the numeric embedding, the table lookup, DCNv2's cross layers),
MC-LayerNorm's C kernel (:mod:`ctrcal.layers.kernels.mcln_kernel`) and a matrix-vector product
for a one-output head (:mod:`ctrcal.layers.logit_head`). A fused path must give what the
modules would have given, so every one of them asks the same two questions, here:

* **the modules** (:func:`is_stock`, :func:`is_layer_norm`): is the module exactly the stock
  class -- a subclass has its own forward (``MCLayerNorm`` is an ``nn.LayerNorm``) -- and is it
  unhooked? A hook must see the module called, so a hooked module is called.
* **the tensors** (:func:`fusable_on_cpu`): are they all CPU tensors of one dtype that the
  kernel takes, is autocast off on the CPU (autocast would run the replaced ops in lower
  precision, a float32 kernel would silently not), and is the kernel loaded? Conditions on
  shapes (a 2-D input, a width that matches) stay with each kernel: they are facts about its
  arguments, not about when fusing is allowed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["FLOAT32", "fusable_on_cpu", "is_layer_norm", "is_stock", "unhooked"]

FLOAT32 = (torch.float32,)
"""The dtype of the small C kernels (:mod:`ctrcal.layers.kernels.cpu_kernels`)."""


def unhooked(module: nn.Module) -> bool:
    """Whether no forward hook or pre-hook is registered on ``module`` itself."""
    return not (module._forward_hooks or module._forward_pre_hooks)


def is_stock(module: nn.Module | None, cls: type[nn.Module]) -> bool:
    """Whether ``module`` is exactly ``cls`` (not a subclass) and unhooked: then a fused path
    may compute its arithmetic without calling it."""
    return type(module) is cls and unhooked(module)


def is_layer_norm(module: nn.Module | None) -> bool:
    """Whether ``module`` is exactly ``nn.LayerNorm``: not a subclass such as MCLayerNorm or a
    channel-first LayerNorm2d, which compute something else with the same parameters."""
    return type(module) is nn.LayerNorm


def fusable_on_cpu(
    *tensors: Tensor,
    dtypes: tuple[torch.dtype, ...] | None = FLOAT32,
    autocast_free: bool = False,
    kernels: Callable[[], object] | None,
) -> bool:
    """Whether a fused CPU kernel may replace the torch ops it stands for, on ``tensors``.

    The one statement of that rule for every fused CPU path of ctrcal:

    * every tensor the kernel reads is a CPU tensor, all of one dtype, and that dtype is one
      the kernel takes;
    * CPU autocast is off, unless the replaced ops run outside autocast anyway
      (``autocast_free``): under autocast they would run in lower precision;
    * the kernel is loaded: ``kernels()`` is true (the small kernels' library is None where
      it cannot be built and while ``torch.compile`` traces, since a ctypes call would split
      the graph);
    * no exporter records the call (``torch.jit.trace``, ``torch.export`` and the ONNX
      exporter): an exported graph holds torch's own ops, which every runtime knows.

    Args:
        *tensors: the tensors the kernel reads (inputs and parameters).
        dtypes: the dtypes the kernel takes; None: any (a kernel that converts its input).
        autocast_free: the replaced ops switch autocast off themselves, or autocast lists
            none of them.
        kernels: returns the kernel's library (or True), or None (or False) where it is not
            loaded, e.g. :func:`~ctrcal.layers.kernels.cpu_kernels.cpu_kernels`; None: the fused
            path is made of torch ops and needs no library.

    Returns:
        True when the fused path may run; False sends the caller to the stock modules.
    """
    if not tensors:
        raise ValueError("fusable_on_cpu needs the tensors the kernel reads")
    dtype = tensors[0].dtype
    if dtypes is not None and dtype not in dtypes:
        return False
    for t in tensors:  # a loop, not all(...): asked several times per training step
        if t.device.type != "cpu" or t.dtype != dtype:
            return False
    if not autocast_free and torch.is_autocast_enabled("cpu"):
        return False
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        return False
    return kernels is None or bool(kernels())
