"""The last layer of a CTR model, ``Linear(width -> 1)``, as a matrix-vector product.

``nn.Linear(width, 1)`` runs as a matrix product with one output column (forward) and one
inner dimension (the input gradient ``[B, 1] x [1, width]``). GEMM libraries handle these
degenerate shapes poorly on the CPU: for B = 10000 rows of width 400 the three products of a
training step cost several times what the same work costs as ``addmv`` / ``mv`` / an outer
product, which run at memory speed. :func:`linear_logit` computes the same function with
those (autograd's ``addmv`` backward: the input gradient is ``outer(grad, w)``, the weight
gradient ``x^T · grad``), so only the summation order differs from ``layer(x)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["linear_logit"]


def linear_logit(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x).squeeze(-1)`` for a one-output ``nn.Linear``: logits ``[B]`` from ``[B, N]``.

    Any other layer (a replaced or hooked one, more outputs), input rank, device other than the
    CPU, or autocast (which decides the precision of ``nn.Linear`` itself) runs ``layer(x)``.
    """
    fusable = (
        type(layer) is nn.Linear
        and layer.out_features == 1
        and not (layer._forward_hooks or layer._forward_pre_hooks)
        and x.dim() == 2
        and x.device.type == "cpu"
        and x.dtype == layer.weight.dtype
        and not torch.is_autocast_enabled("cpu")
    )
    if not fusable:
        return layer(x).squeeze(-1)
    weight = layer.weight[0]
    if layer.bias is None:
        return torch.mv(x, weight)
    return torch.addmv(layer.bias, x, weight)
