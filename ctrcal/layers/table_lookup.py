"""The embedding lookup of :class:`~ctrcal.layers.embedding.FeatureEmbedding` as one node.

``table_lookup(table, ids, offsets, lead)`` returns ``cat([lead, table[ids + offsets]], 1)``
(``lead``: the numeric fields' embeddings, or None) -- what ``F.embedding`` followed by
``torch.cat`` computes -- with the C kernels of :mod:`ctrcal.layers.kernels.cpu_kernels` on the CPU:

* **Forward**: the rows are copied straight into their place in the ``[B, F, D]`` output
  (no separate lookup result to concatenate).
* **Backward**: the rows' gradients are added into the table's gradient straight from the
  ``[B, F, D]`` gradient (no contiguous copy of its categorical part, no sparse tensor). The
  threads own disjoint ranges of table rows, so no two write the same row and each row sums
  its contributions in batch order. ``torch``'s ``dense += sparse`` runs one small tensor
  operation per looked-up row (hundreds of nanoseconds each, 260000 rows per step for
  Criteo at batch 10000).

Where the table's gradient goes follows the table's settings: with ``grad_in_place`` (set by
the training step, :func:`ctrcal.train.step.make_step_context`) the rows are added into the
table's dense ``.grad`` buffer kept across steps (created if missing) and autograd receives
nothing for the table -- no table-sized tensor is allocated, zeroed or added per step; with
``table.sparse`` the gradient is the usual sparse tensor; otherwise a dense table-sized
tensor. Every other case (no C compiler, another device or dtype) runs ``F.embedding`` and
``torch.cat``, with the same results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu

__all__ = ["table_lookup"]

_MIN_BATCH_CHUNK = 256  # batch rows per thread at least in the gather
_MIN_TABLE_CHUNK = 1 << 14  # table rows per thread at least in the scatter-add


def table_lookup(
    table: nn.Embedding,
    ids: Tensor,
    offsets: Tensor,
    lead: Tensor | None = None,
    grad_in_place: bool = False,
) -> Tensor:
    """``cat([lead, table.weight[ids + offsets]], dim=1)``: ``[B, Fl + T, D]``.

    Args:
        table: the fused table (``[V, D]`` weight).
        ids: int64 ``[B, T]`` field-local ids.
        offsets: int64 ``[T]``, each field's first row in the table.
        lead: ``[B, Fl, D]`` embeddings placed before the looked-up fields, or None.
        grad_in_place: add the table's gradient into ``table.weight.grad`` during the
            backward pass instead of handing it to autograd (see the module docstring).

    Raises:
        IndexError: an id whose row lies outside the table.
    """
    weight = table.weight
    # a gather is not an autocast op: the kernel runs under autocast too
    read = (weight,) if lead is None else (weight, lead)
    usable = (
        ids.dtype == torch.int64
        and ids.dim() == 2
        and fusable_on_cpu(*read, autocast_free=True, kernels=cpu_kernels)
    )
    if not usable:
        rows = F.embedding(ids + offsets, weight, sparse=table.sparse)
        return rows if lead is None else torch.cat([lead, rows], dim=1)
    mode = "in_place" if grad_in_place else "sparse" if table.sparse else "dense"
    return _TableLookup.apply(lead, ids.contiguous(), offsets.contiguous(), weight, mode)


class _TableLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lead, ids, offsets, weight, mode):  # type: ignore[override]
        lib = cpu_kernels()
        batch, fields = ids.shape
        rows, dim = weight.shape
        lead_fields = 0 if lead is None else lead.shape[1]
        out = torch.empty(batch, lead_fields + fields, dim, dtype=weight.dtype)
        if lead is not None:
            out[:, :lead_fields].copy_(lead)
        w = weight.detach().contiguous()
        chunks = Chunks(batch, _MIN_BATCH_CHUNK)
        bad = torch.empty(chunks.count, dtype=torch.int64)  # per chunk: -1 or the first bad id
        chunks.run(
            lib,
            "table_gather_f32",
            w.data_ptr(),
            rows,
            ids.data_ptr(),
            offsets.data_ptr(),
            out.data_ptr(),
            fields,
            dim,
            out.stride(0),
            lead_fields,
            bad.data_ptr(),
        )
        bad = bad[bad >= 0]
        if bad.numel():
            b, t = divmod(int(bad.min()), fields)
            raise IndexError(
                f"embedding id {int(ids[b, t])} of field {t} (batch row {b}) maps to table "
                f"row {int(ids[b, t] + offsets[t])}, outside the table's {rows} rows"
            )
        ctx.save_for_backward(ids, offsets)
        ctx.weight, ctx.mode, ctx.lead_fields = weight, mode, lead_fields
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        ids, offsets = ctx.saved_tensors
        weight, mode, lead_fields = ctx.weight, ctx.mode, ctx.lead_fields
        grad_lead = grad[:, :lead_fields] if ctx.needs_input_grad[0] else None
        if not ctx.needs_input_grad[3]:
            return grad_lead, None, None, None, None
        batch, fields = ids.shape
        rows, dim = weight.shape
        if grad.stride(2) != 1 or grad.stride(1) != dim:
            grad = grad.contiguous()
        if mode == "sparse":
            values = grad[:, lead_fields:].reshape(-1, dim)
            index = (ids + offsets).reshape(1, -1)
            sparse = torch.sparse_coo_tensor(index, values, weight.shape, check_invariants=False)
            return grad_lead, None, None, sparse, None
        if mode == "in_place":
            if weight.grad is None or weight.grad.is_sparse or not weight.grad.is_contiguous():
                weight.grad = torch.zeros_like(weight, memory_format=torch.contiguous_format)
            target = weight.grad
        else:
            target = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        lib = cpu_kernels()
        # chunks of table rows: each thread adds into the rows it owns
        Chunks(rows, _MIN_TABLE_CHUNK).run(
            lib,
            "table_scatter_add_f32",
            target.data_ptr(),
            ids.data_ptr(),
            offsets.data_ptr(),
            grad.data_ptr(),
            batch,
            fields,
            dim,
            grad.stride(0),
            lead_fields,
        )
        return grad_lead, None, None, (None if mode == "in_place" else target), None
