"""Feature embeddings for CTR models: one fused categorical table and numeric embeddings.

:class:`FeatureEmbedding` turns a row of Fc categorical ids and Fn continuous numerics into
F = Fn + Fc vectors of width D (numeric fields first, then categorical, in feature-map order).

* **Categorical fields** share ONE ``nn.Embedding`` of ``sum(vocab_sizes)`` rows; field ``j``'s
  local id ``i`` lives at row ``offsets[j] + i``, so a whole batch is one gather.
* **Numeric fields** (values in model-input space, NaN = missing) have three modes:

  ``linear`` (default)
      ``e_j = x_j * v_j + b_j``. The per-field bias is what keeps the value's information
      when a per-field norm follows: ``LayerNorm(x * v)`` depends on ``x`` only through
      ``sign(x)`` (the norm divides the scale ``|x|`` away, up to its eps), while the
      direction of ``x * v + b`` turns with ``x`` from ``-v`` through ``b`` to ``+v``, so every
      value maps to a different normalized vector and a small numeric shift moves the
      prediction.
  ``scaled``
      ``e_j = x_j * v_j`` (FuxiCTR's numeric embedding). Behind a per-field norm only the sign
      of ``x`` survives; kept for comparison with published setups that use no ``emb_norm``.
  ``bucket``
      ``x_j`` is bucketized with the feature map's stored boundaries (bucket ``i`` holds
      ``boundaries[i-1] < x <= boundaries[i]``) and the bucket's vector is looked up in the
      same fused table as the categorical ids (one gather for everything).

  A missing numeric (NaN) is embedded as a learned per-field vector ``m_j`` in every mode
  (``bucket``: its own bucket); NaN never reaches the arithmetic, so no NaN propagates.

:class:`FieldNorm` applies a registry norm per field over D (each field its own layer, as
FuxiCTR's ``emb_layernorm``), with fused paths for plain LayerNorms and MC-LayerNorms (one
grouped call for all fields, :func:`~ctrcal.layers.mc_layernorm.functional.mc_grouped_layer_norm`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ctrcal.layers.kernels.chunks import Chunks
from ctrcal.layers.kernels.cpu_kernels import cpu_kernels
from ctrcal.layers.kernels.fusion import fusable_on_cpu, is_layer_norm, is_stock
from ctrcal.layers.mc_layernorm.functional import grouped_layer_norm, mc_grouped_layer_norm
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.layers.registry import create_norm
from ctrcal.layers.table_lookup import table_lookup

NUMERIC_EMBEDDINGS = ("linear", "scaled", "bucket")


class FeatureEmbedding(nn.Module):
    """Embeds categorical ids and continuous numerics into ``[B, F, D]``.

    Args:
        vocab_sizes: per categorical field, the number of ids (ids are in ``[0, size)``).
        num_numeric: number of numeric fields Fn.
        embedding_dim: D.
        numeric_embedding: ``linear`` (``x*v + b``), ``scaled`` (``x*v``) or ``bucket``.
        bucket_boundaries: per numeric field, sorted finite boundaries (``bucket`` mode only).
        init_std: standard deviation of the normal init of every embedding parameter.

    Shapes:
        categorical: int64 ``[B, Fc]`` field-local ids; numeric: float ``[B, Fn]`` (NaN =
        missing); output: ``[B, Fn + Fc, D]`` (numeric fields first).
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        num_numeric: int,
        embedding_dim: int,
        numeric_embedding: str = "linear",
        bucket_boundaries: Sequence[Sequence[float]] | None = None,
        init_std: float = 1e-4,
    ) -> None:
        super().__init__()
        vocab_sizes = [int(v) for v in vocab_sizes]
        if any(v < 1 for v in vocab_sizes):
            raise ValueError(f"every vocab size must be >= 1, got {vocab_sizes}")
        if num_numeric < 0 or embedding_dim < 1:
            raise ValueError(
                f"need num_numeric >= 0 and embedding_dim >= 1, got {num_numeric}, {embedding_dim}"
            )
        if numeric_embedding not in NUMERIC_EMBEDDINGS:
            raise ValueError(
                f"unknown numeric_embedding {numeric_embedding!r} "
                f"(valid: {', '.join(NUMERIC_EMBEDDINGS)})"
            )
        self.num_categorical = len(vocab_sizes)
        self.num_numeric = int(num_numeric)
        self.num_fields = self.num_numeric + self.num_categorical
        self.embedding_dim = int(embedding_dim)
        self.numeric_embedding = numeric_embedding
        self.init_std = float(init_std)
        if self.num_fields == 0:
            raise ValueError("FeatureEmbedding needs at least one field")

        # Rows of the fused table: [numeric buckets (bucket mode)] + [categorical vocabularies].
        sizes = list(vocab_sizes)
        if numeric_embedding == "bucket" and self.num_numeric:
            boundaries = _check_boundaries(bucket_boundaries, self.num_numeric)
            width = max(1, max(len(b) for b in boundaries))
            padded = torch.full((self.num_numeric, width), float("inf"))
            for j, b in enumerate(boundaries):
                padded[j, : len(b)] = torch.tensor(b, dtype=torch.float32)
            # len(b) + 1 value buckets, then the missing bucket.
            counts = torch.tensor([len(b) for b in boundaries], dtype=torch.int64)
            self.register_buffer("boundaries", padded, persistent=True)
            self.register_buffer("missing_bucket", counts + 1, persistent=True)
            sizes = [len(b) + 2 for b in boundaries] + sizes
        # summed in Python: the same ids, and no tensor op that a meta-device build (ctrcal
        # validate) would route through torch's Python reference kernels
        offsets = torch.tensor([0, *itertools.accumulate(sizes[:-1])], dtype=torch.int64)
        self.table_fields = len(sizes)
        if sizes:
            self.table = nn.Embedding(sum(sizes), self.embedding_dim)
            self.register_buffer("offsets", offsets, persistent=True)
        else:
            self.table = None
        if numeric_embedding in ("linear", "scaled") and self.num_numeric:
            shape = (self.num_numeric, self.embedding_dim)
            self.numeric_weight = nn.Parameter(torch.empty(shape))
            self.numeric_bias = (
                nn.Parameter(torch.empty(shape)) if numeric_embedding == "linear" else None
            )
            self.numeric_missing = nn.Parameter(torch.empty(shape))
        else:
            self.numeric_weight = self.numeric_bias = self.numeric_missing = None
        # set by the training step: the backward adds the table's gradient into its .grad
        self.grad_in_place = False
        self.reset_parameters()

    @property
    def output_dim(self) -> int:
        """F * D, the width of the flattened embedding."""
        return self.num_fields * self.embedding_dim

    def reset_parameters(self) -> None:
        """Small-normal init (std ``init_std``) of every embedding parameter."""
        for p in (
            self.table.weight if self.table is not None else None,
            self.numeric_weight,
            self.numeric_bias,
            self.numeric_missing,
        ):
            if p is not None:
                nn.init.normal_(p, mean=0.0, std=self.init_std)

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        """Embed a batch.

        Args:
            categorical: int64 ``[B, Fc]`` field-local ids.
            numeric: float ``[B, Fn]`` model-input values, NaN where missing.

        Returns:
            ``[B, Fn + Fc, D]`` embeddings, numeric fields first.
        """
        lead = self._embed_numeric(numeric) if self.numeric_weight is not None else None
        if self.table is None:
            return lead
        ids = categorical
        if self.numeric_embedding == "bucket" and self.num_numeric:
            ids = torch.cat([self._bucketize(numeric), categorical], dim=1)
        # one node: the rows land in their place in the output, and the backward adds the
        # table's gradient into a dense .grad kept across steps when the training step asks
        # for it (`grad_in_place`), else as `table.sparse` says (see table_lookup)
        return table_lookup(self.table, ids, self.offsets, lead, self.grad_in_place)

    def _embed_numeric(self, numeric: torch.Tensor) -> torch.Tensor:
        """``x*v + b`` (or ``x*v``), and the missing vector where ``x`` is NaN: ``[B, Fn, D]``.

        On the CPU in float32 (values that need no gradient) one C pass each way computes
        it (:class:`_NumericEmbedFn`). Elsewhere it is ONE small matrix product
        ``[x~, m] @ W + b`` with ``x~`` the values with NaN set to 0, ``m`` the missing
        indicators and ``W`` block-diagonal (``v_j`` on the value rows, ``missing_j - b_j`` on
        the indicator rows): NaN never meets the arithmetic, and a GEMM (forward and backward)
        is several times cheaper than the equivalent broadcast ``where``/``addcmul`` over
        ``[B, Fn, D]``. Both run in float32 even under autocast, so that small numeric shifts
        are not rounded away by bf16.
        """
        fn, dim = self.num_numeric, self.embedding_dim
        weight, bias, missing_vec = self.numeric_weight, self.numeric_bias, self.numeric_missing
        values = numeric.to(weight.dtype)
        # both ways run outside autocast: the kernel may run under it
        if (
            numeric.dim() == 2
            and not numeric.requires_grad
            and fusable_on_cpu(values, weight, autocast_free=True, kernels=cpu_kernels)
        ):
            # one C pass each way instead of the product and its operands (same function)
            return _NumericEmbedFn.apply(values.contiguous(), weight, bias, missing_vec)
        missing = torch.isnan(numeric)
        with torch.autocast(numeric.device.type, enabled=False):
            x = torch.nan_to_num(values, nan=0.0)
            rows = torch.cat([x, missing.to(weight.dtype)], dim=1)  # [B, 2*Fn]
            eye = torch.eye(fn, device=weight.device, dtype=weight.dtype).unsqueeze(-1)
            gap = missing_vec if bias is None else missing_vec - bias
            w = torch.cat([eye * weight, eye * gap]).reshape(2 * fn, fn * dim)
            out = rows @ w if bias is None else torch.addmm(bias.reshape(-1), rows, w)
        return out.view(-1, fn, dim)

    def _bucketize(self, numeric: torch.Tensor) -> torch.Tensor:
        """Bucket ids ``[B, Fn]`` (missing -> the field's last bucket).

        Eager runs ``searchsorted``; an exported graph (ONNX has no ``searchsorted``) runs
        :func:`count_below`, which gives the same ids. ``searchsorted`` stays in eager because
        it is 1.2-9.5x faster there (docs/benchmarks.md, "Bucketizing numerics").
        """
        if torch.jit.is_tracing() or torch.compiler.is_exporting():
            ids = count_below(self.boundaries, numeric.float())
        else:
            values = numeric.float().t().contiguous()  # [Fn, B]: one sorted row per field
            ids = torch.searchsorted(self.boundaries, values, right=False).t()
        return torch.where(torch.isnan(numeric), self.missing_bucket, ids)

    def embedding_tables(self) -> list[nn.Parameter]:
        """The parameters an embedding L2 penalty applies to (the fused table)."""
        return [self.table.weight] if self.table is not None else []

    def extra_repr(self) -> str:
        return (
            f"numeric={self.num_numeric} ({self.numeric_embedding}), "
            f"categorical={self.num_categorical}, dim={self.embedding_dim}, "
            f"table_rows={self.table.num_embeddings if self.table is not None else 0}"
        )


def count_below(boundaries: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per field, how many boundaries lie strictly below each value: int64 ``[B, Fn]``.

    ``searchsorted(boundaries, values.t(), right=False).t()`` written as a branchless binary
    search of comparisons and gathers (ONNX and every exporter have both): each of the
    ``ceil(log2(W + 1))`` steps reads one boundary per value. A value equal to a boundary is
    not below it (bucket ``i`` holds ``boundaries[i-1] < x <= boundaries[i]``); NaN is below
    nothing (0).

    Args:
        boundaries: float ``[Fn, W]``, each row sorted ascending (``+inf`` padding allowed).
        values: float ``[B, Fn]``.
    """
    fields, width = boundaries.shape
    size = 1 << width.bit_length()  # a power of two above W: the search can land past it
    pad = torch.full(
        (fields, size - width), float("inf"), dtype=boundaries.dtype, device=boundaries.device
    )
    flat = torch.cat([boundaries, pad], dim=1).reshape(-1)
    # where field j's step reads: j * size - 1 + (position + step)
    base = torch.arange(fields, device=values.device) * size - 1
    pos = torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    step = size // 2
    while step:
        below = flat[base + pos + step] < values
        pos = pos + below.long() * step
        step //= 2
    return pos


_MIN_ROWS = 256  # batch rows per thread at least in the numeric embedding kernel


class _NumericEmbedFn(torch.autograd.Function):
    """``x*v (+ b)``, or the missing vector where ``x`` is NaN, ``[B, Fn, D]``, in one C pass
    each way (:mod:`ctrcal.layers.kernels.cpu_kernels`); the values themselves get no gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, missing):  # type: ignore[override]
        lib = cpu_kernels()
        rows, fields = x.shape
        dim = weight.shape[1]
        out = torch.empty(rows, fields, dim, dtype=weight.dtype)
        Chunks(rows, _MIN_ROWS).run(
            lib,
            "numeric_embed_fwd_f32",
            x.data_ptr(),
            weight.data_ptr(),
            0 if bias is None else bias.data_ptr(),
            missing.data_ptr(),
            out.data_ptr(),
            fields,
            dim,
            fields * dim,
        )
        ctx.save_for_backward(x)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        lib = cpu_kernels()
        rows, fields = x.shape
        dim = grad.shape[2]
        if grad.stride(2) != 1 or grad.stride(1) != dim:
            grad = grad.contiguous()
        chunks = Chunks(rows, _MIN_ROWS)
        dw, db, dm = (chunks.partials(fields, dim, dtype=grad.dtype) for _ in range(3))
        chunks.run(
            lib,
            "numeric_embed_bwd_f32",
            x.data_ptr(),
            grad.data_ptr(),
            dw.data_ptr(),
            db.data_ptr() if ctx.has_bias else 0,
            dm.data_ptr(),
            fields,
            dim,
            grad.stride(0),
        )
        return None, dw.sum(0), db.sum(0) if ctx.has_bias else None, dm.sum(0)


def _check_boundaries(boundaries: Any, num_numeric: int) -> list[list[float]]:
    if boundaries is None:
        raise ValueError(
            "numeric_embedding 'bucket' needs bucket boundaries in the feature map "
            "(prepare the data with features.numeric_buckets > 0)"
        )
    out = [[float(v) for v in b] for b in boundaries]
    if len(out) != num_numeric:
        raise ValueError(f"expected {num_numeric} boundary lists, got {len(out)}")
    for j, b in enumerate(out):
        t = torch.tensor(b, dtype=torch.float64)
        if not torch.isfinite(t).all() or (len(b) > 1 and not (t[1:] > t[:-1]).all()):
            raise ValueError(
                f"bucket boundaries of numeric field {j} must be finite and "
                f"strictly increasing, got {b}"
            )
    return out


class FieldNorm(nn.Module):
    """One norm per field over the embedding dim D (``[B, F, D] -> [B, F, D]``).

    Each field gets its own layer from the registry (``create_norm(spec, D)``), so each has its
    own affine parameters (state_dict keys ``norms.<field>.weight``/``bias``) and
    ``replace_norms`` can swap them like any other norm. Two fused paths compute exactly what
    the F layers compute, in one call instead of F:

    * every layer a plain ``nn.LayerNorm``: one ``layer_norm`` over all fields, then the
      stacked per-field affine;
    * every layer an identically configured :class:`MCLayerNorm` (same eps, fraction, backend,
      generator, affine settings and mode): one grouped MC-LayerNorm call
      (:func:`~ctrcal.layers.mc_layernorm.functional.mc_grouped_layer_norm`; each (row, field)
      still draws its own subset), or the LayerNorm path when not sampling (evaluation, one-shot).

    Args:
        num_fields: F.
        dim: D.
        norm: a norm spec (name, class, partial or ``NormSpec``) for ``create_norm``.
    """

    def __init__(self, num_fields: int, dim: int, norm: Any) -> None:
        super().__init__()
        self.norms = nn.ModuleList(create_norm(norm, dim) for _ in range(num_fields))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = list(self.norms)
        kind = _fusable(norms)
        if kind is None:
            return torch.stack([n(x[:, i]) for i, n in enumerate(norms)], dim=1)
        first = norms[0]
        weight = torch.stack([n.weight for n in norms]) if first.weight is not None else None
        bias = torch.stack([n.bias for n in norms]) if first.bias is not None else None
        if kind == "mc":
            return mc_grouped_layer_norm(
                x,
                weight,
                bias,
                first.eps,
                first.fraction,
                generator=first.generator,
                backend=first.backend,
                subset_size=first.subset_size,
            )
        return grouped_layer_norm(x, weight, bias, first.eps)


def _fusable(norms: list[nn.Module]) -> str | None:
    """``"ln"``/``"mc"`` when the fields' layers can run as one call, else None."""
    first = norms[0]
    if is_layer_norm(first):
        # a hooked field norm is called (the MC-LayerNorm group below cannot ask this:
        # mc_mode hooks every MC layer while it samples at evaluation)
        same_type = all(is_stock(n, nn.LayerNorm) for n in norms)
        return "ln" if same_type and _same_layernorms(norms) else None
    if type(first) is not MCLayerNorm or len(first.normalized_shape) != 1:
        return None
    if not (all(type(n) is MCLayerNorm for n in norms) and _same_layernorms(norms)):
        return None
    sampling = first.sampling
    if not all(
        n.sampling == sampling
        and n.fraction == first.fraction
        and n.backend == first.backend
        and n.generator is first.generator
        for n in norms
    ):
        return None
    return "mc" if sampling else "ln"


def _same_layernorms(norms: list[nn.LayerNorm]) -> bool:
    first = norms[0]
    return all(
        n.eps == first.eps
        and n.normalized_shape == first.normalized_shape
        and (n.weight is None) == (first.weight is None)
        and (n.bias is None) == (first.bias is None)
        for n in norms
    )
