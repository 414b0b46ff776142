"""The cross network of DCNv2 (Wang et al. 2021): explicit bounded-degree feature crosses.

Full rank (DCN-V2, eq. 1)::

    x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l                    x: [B, d], W_l: [d, d]

Low rank (``low_rank = r``, one expert)::

    x_{l+1} = x_0 ⊙ (U_l (V_l^T x_l) + b_l) + x_l            U_l, V_l: [d, r]

Mixture of low-rank experts (DCN-Mix, ``num_experts = E > 1``), each expert with a
nonlinear projection in the low-rank space and a softmax gate over experts::

    u_e = U_e tanh(C_e tanh(V_e^T x_l)) + b_e,  g = softmax(G x_l)
    x_{l+1} = x_0 ⊙ sum_e g_e u_e + x_l

Every layer is a few dense matrix products on contiguous ``[B, d]`` tensors: the experts of
a layer are stacked into one ``[d, E*r]`` projection and batched ``einsum``s, never a Python
loop over experts, and the cross update is one fused ``addcmul``.

Full rank on float32 CPU tensors, the layers run as one autograd Function with a C pass each
way per layer (:mod:`ctrcal.layers.kernels.cpu_kernels`): forward, the bias add and the cross
update; backward, ``du = g * x0``, the bias gradient's column sums and the accumulation of ``x0``'s
gradient in one pass, then ``dx = g + du W`` as one ``addmm``. Autograd ran five elementwise
passes for that per layer (two products, a sum and two accumulations).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_stock

__all__ = ["CrossNet"]


class CrossNet(nn.Module):
    """``num_layers`` cross layers over ``input_dim`` features.

    Args:
        input_dim: d, the width of ``x_0`` (the flattened embedding).
        num_layers: number of cross layers (>= 1).
        low_rank: r; 0 means full-rank ``W_l``.
        num_experts: E low-rank experts per layer (needs ``low_rank > 0`` when > 1).

    Shapes:
        input ``[B, d]`` -> output ``[B, d]``.
    """

    def __init__(
        self, input_dim: int, num_layers: int, low_rank: int = 0, num_experts: int = 1
    ) -> None:
        super().__init__()
        if input_dim < 1 or num_layers < 1:
            raise ValueError(
                f"CrossNet needs input_dim >= 1 and num_layers >= 1, got {input_dim}, {num_layers}"
            )
        if low_rank < 0 or num_experts < 1:
            raise ValueError(
                f"low_rank must be >= 0 and num_experts >= 1, got {low_rank}, {num_experts}"
            )
        if num_experts > 1 and low_rank == 0:
            raise ValueError("a mixture of experts (num_experts > 1) needs low_rank > 0")
        self.input_dim, self.num_layers = int(input_dim), int(num_layers)
        self.low_rank, self.num_experts = int(low_rank), int(num_experts)
        d, r, e, n = self.input_dim, self.low_rank, self.num_experts, self.num_layers
        if r == 0:
            self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        else:
            self.layers = None
            self.V = nn.Parameter(torch.empty(n, d, e * r))  # x @ V: every expert at once
            self.U = nn.Parameter(torch.empty(n, e, r, d))
            self.bias = nn.Parameter(torch.zeros(n, d))
            if e > 1:
                self.C = nn.Parameter(torch.empty(n, e, r, r))
                self.gate = nn.Parameter(torch.empty(n, d, e))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal weights (per layer and expert), zero biases."""
        if self.layers is not None:
            for lin in self.layers:
                nn.init.xavier_normal_(lin.weight)
                nn.init.zeros_(lin.bias)
            return
        e, r = self.num_experts, self.low_rank
        for i in range(self.num_layers):
            for k in range(e):
                nn.init.xavier_normal_(self.V.data[i, :, k * r : (k + 1) * r])
                nn.init.xavier_normal_(self.U.data[i, k])
                if e > 1:
                    nn.init.xavier_normal_(self.C.data[i, k])
            if e > 1:
                nn.init.xavier_normal_(self.gate.data[i])
        nn.init.zeros_(self.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        if self.layers is not None:
            if _fusable(x0, self.layers):
                params = [p for lin in self.layers for p in (lin.weight, lin.bias)]
                return _FullRankCrossFn.apply(x0.contiguous(), *params)
            for lin in self.layers:
                x = torch.addcmul(x, x0, lin(x))
            return x
        e, r = self.num_experts, self.low_rank
        for i in range(self.num_layers):
            v = x @ self.V[i]  # [B, E*r]
            if e == 1:
                u = torch.addmm(self.bias[i], v, self.U[i, 0])  # [B, d]
            else:
                v = torch.tanh(v).view(-1, e, r)
                v = torch.tanh(torch.einsum("ber,ers->bes", v, self.C[i]))
                experts = torch.einsum("ber,erd->bed", v, self.U[i])  # [B, E, d]
                g = torch.softmax(x @ self.gate[i], dim=-1)  # [B, E]
                # sum_e g_e (x0 ⊙ (u_e + b)) = x0 ⊙ (sum_e g_e u_e + b): the gates sum to 1
                u = torch.einsum("be,bed->bd", g, experts) + self.bias[i]
            x = torch.addcmul(x, x0, u)
        return x

    def extra_repr(self) -> str:
        return (
            f"input_dim={self.input_dim}, num_layers={self.num_layers}, "
            f"low_rank={self.low_rank}, num_experts={self.num_experts}"
        )


_MIN_ROWS = 64  # rows per thread at least in the cross-layer kernels


def _fusable(x0: Tensor, layers: nn.ModuleList) -> bool:
    """Whether the C kernels may run these full-rank layers on x0 ``[B, d]``: plain
    ``nn.Linear`` layers with a bias and without hooks, and
    :func:`~ctrcal.layers.kernels.fusion.fusable_on_cpu` for x0 and the weights."""
    return (
        x0.dim() == 2
        and all(is_stock(lin, nn.Linear) and lin.bias is not None for lin in layers)
        and fusable_on_cpu(x0, *(lin.weight for lin in layers), kernels=cpu_kernels)
    )


class _FullRankCrossFn(torch.autograd.Function):
    """``x_{l+1} = x0 * (x_l W_l^T + b_l) + x_l`` for every layer; params are W_0, b_0,
    W_1, b_1, ... Saves each layer's input x_l and u_l = x_l W_l^T + b_l, as autograd did."""

    @staticmethod
    def forward(ctx, x0, *params):  # type: ignore[override]
        lib = cpu_kernels()
        rows, n = x0.shape
        x, saved = x0, []
        for weight, bias in zip(params[0::2], params[1::2], strict=True):
            u = x @ weight.t()  # the bias joins in the kernel, which writes u over it
            y = torch.empty_like(x0)
            Chunks(rows, _MIN_ROWS).run(
                lib,
                "cross_fwd_f32",
                u.data_ptr(),
                bias.data_ptr(),
                x0.data_ptr(),
                x.data_ptr(),
                y.data_ptr(),
                n,
            )
            saved += [x, u]
            x = y
        ctx.save_for_backward(x0, *params[0::2], *saved)
        ctx.layers = len(params) // 2
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x0, *rest = ctx.saved_tensors
        layers = ctx.layers
        weights, saved = rest[:layers], rest[layers:]
        lib = cpu_kernels()
        rows, n = x0.shape
        g = grad.contiguous()
        dx0 = torch.empty_like(x0)  # written by the first pass back, then accumulated
        grads: list[Tensor | None] = [None] * (2 * layers)
        for i in reversed(range(layers)):
            x, u = saved[2 * i], saved[2 * i + 1]
            chunks = Chunks(rows, _MIN_ROWS)
            db = chunks.partials(n)  # the bias gradient, per chunk
            du = torch.empty_like(x0)
            chunks.run(
                lib,
                "cross_bwd_f32",
                g.data_ptr(),
                x0.data_ptr(),
                u.data_ptr(),
                du.data_ptr(),
                dx0.data_ptr(),
                db.data_ptr(),
                n,
                int(i == layers - 1),
            )
            grads[2 * i] = du.t() @ x
            grads[2 * i + 1] = db.sum(0)
            g = torch.addmm(g, du, weights[i])  # the gradient of x_i: g + du W_i
        return dx0.add_(g), *grads
