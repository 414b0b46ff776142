"""Per-field MC-LayerNorm as one layer: F fields of width D normalised in one call.

:class:`GroupedMCLayerNorm` holds the F fields' affine parameters as ``[F, D]`` tensors and
runs :func:`~ctrcal.layers.mc_layernorm.mc_grouped_layer_norm` (one kernel launch for the
whole ``[B, F, D]`` batch on every backend) where F separate
:class:`~ctrcal.layers.mc_layernorm.MCLayerNorm` (D) layers would take F calls. The
arithmetic is the same: every (row, field) draws its own uniform subset of exactly k of the D
features.

:class:`~ctrcal.layers.embedding.FieldNorm` keeps its per-field modules (so its state_dict and
``replace_norms`` stay as they are) and takes the same grouped path when its fields are
identically configured MCLayerNorms; :meth:`GroupedMCLayerNorm.from_layers` converts a list of
per-field layers into one grouped layer (and :meth:`GroupedMCLayerNorm.to_layers` back).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ctrcal.layers.mc_layernorm import (
    MCLayerNorm,
    _resolve_backend,
    grouped_layer_norm,
    mc_grouped_layer_norm,
    mc_subset_size,
)

__all__ = ["GroupedMCLayerNorm"]


class GroupedMCLayerNorm(nn.Module):
    """MC-LayerNorm over the last dim of ``[..., F, D]`` with per-field affine parameters.

    Training (or ``mc_sampling`` at evaluation): each (row, field) normalises its D features
    by the biased mean and variance of its own uniform subset of exactly
    ``k = max(2, floor(f * D))`` of them (eps inside the square root), then field g's affine
    ``weight[g], bias[g]``. Evaluation: one-shot per-field LayerNorm.

    Args:
        num_fields: F.
        dim: D.
        eps: added to the variance inside the square root.
        elementwise_affine: learn ``weight`` [F, D] (init 1) and ``bias`` [F, D] (init 0).
        bias: learn ``bias`` too (with ``elementwise_affine``).
        device: parameter device.
        dtype: parameter dtype.
        fraction: the paper's f (keyword only).
        generator: optional torch generator for the subset draws (keyword only).
        backend: see :data:`ctrcal.layers.mc_layernorm.BACKENDS` (keyword only).

    Shape:
        input [..., F, D] -> output of the same shape and dtype.
    """

    def __init__(
        self,
        num_fields: int,
        dim: int,
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
        super().__init__()
        if int(num_fields) < 1 or int(dim) < 1:
            raise ValueError(f"need num_fields >= 1 and dim >= 1, got {num_fields}, {dim}")
        self.num_fields, self.dim = int(num_fields), int(dim)
        self.eps = float(eps)
        self.fraction = fraction
        self.subset_size = mc_subset_size(self.dim, fraction)
        if backend is not None:
            _resolve_backend(backend)
        self.backend = backend
        self.generator = generator
        self.mc_sampling = False
        shape = (self.num_fields, self.dim)
        kw = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(shape, **kw))
            self.bias = nn.Parameter(torch.zeros(shape, **kw)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    @property
    def sampling(self) -> bool:
        """Whether the next forward draws subsets (training, or MC mode at evaluation)."""
        return self.training or self.mc_sampling

    def forward(self, input: Tensor) -> Tensor:
        if tuple(input.shape[-2:]) != (self.num_fields, self.dim):
            raise ValueError(
                f"expected input [..., {self.num_fields}, {self.dim}], got {list(input.shape)}"
            )
        if not self.sampling:
            return grouped_layer_norm(input, self.weight, self.bias, self.eps)
        return mc_grouped_layer_norm(
            input,
            self.weight,
            self.bias,
            self.eps,
            self.fraction,
            generator=self.generator,
            backend=self.backend,
            subset_size=self.subset_size,
        )

    @classmethod
    def from_layers(cls, layers: Sequence[nn.Module], **kwargs: object) -> GroupedMCLayerNorm:
        """One grouped layer from F per-field ``nn.LayerNorm``/``MCLayerNorm`` (D) layers.

        The F layers' weights and biases become the rows of ``weight``/``bias``; eps,
        fraction, backend and generator come from the first layer unless given in
        ``kwargs``. Field order is list order.

        Raises:
            ValueError: layers of different widths, eps or affine settings, or not over one
                trailing dim.
        """
        layers = list(layers)
        if not layers or not all(isinstance(n, nn.LayerNorm) for n in layers):
            raise ValueError("from_layers needs a non-empty list of LayerNorm/MCLayerNorm")
        first = layers[0]
        if len(first.normalized_shape) != 1:
            raise ValueError(
                f"per-field layers normalise one dim, got {list(first.normalized_shape)}"
            )
        for n in layers:
            if (
                tuple(n.normalized_shape) != tuple(first.normalized_shape)
                or n.eps != first.eps
                or (n.weight is None) != (first.weight is None)
                or (n.bias is None) != (first.bias is None)
            ):
                raise ValueError("from_layers needs identically configured per-field layers")
        options: dict[str, object] = {"eps": first.eps}
        if isinstance(first, MCLayerNorm):
            options.update(
                fraction=first.fraction, backend=first.backend, generator=first.generator
            )
        options.update(kwargs)
        ref = first.weight if first.weight is not None else None
        grouped = cls(
            len(layers),
            first.normalized_shape[0],
            elementwise_affine=first.weight is not None,
            bias=first.bias is not None,
            device=ref.device if ref is not None else None,
            dtype=ref.dtype if ref is not None else None,
            **options,  # type: ignore[arg-type]
        )
        with torch.no_grad():
            if grouped.weight is not None:
                grouped.weight.copy_(torch.stack([n.weight for n in layers]))
            if grouped.bias is not None:
                grouped.bias.copy_(torch.stack([n.bias for n in layers]))
        return grouped

    def to_layers(self) -> list[MCLayerNorm]:
        """The F equivalent per-field :class:`MCLayerNorm` (D) layers (copies)."""
        out = []
        for g in range(self.num_fields):
            layer = MCLayerNorm(
                self.dim,
                self.eps,
                elementwise_affine=self.weight is not None,
                bias=self.bias is not None,
                fraction=self.fraction,
                generator=self.generator,
                backend=self.backend,
            )
            with torch.no_grad():
                if self.weight is not None:
                    layer.weight = nn.Parameter(self.weight[g].detach().clone())
                if self.bias is not None:
                    layer.bias = nn.Parameter(self.bias[g].detach().clone())
            out.append(layer.train(self.training))
        return out

    def extra_repr(self) -> str:
        return (
            f"fields={self.num_fields}, dim={self.dim}, eps={self.eps}, "
            f"fraction={self.fraction}, k={self.subset_size}"
        )
