"""Context Normalization: rows of one context share learned normalization statistics.

Context Normalization (Faye et al., seed 004) groups samples into *contexts* and normalizes
the activations of a row with a mean and a standard deviation *learned* for its context: the
context id is embedded, and two linear maps turn the embedding into ``mu_r`` and ``sigma_r``::

    y = gamma * (x - mu_r) / sqrt(sigma_r^2 + eps) + beta          x, y: [..., N]

Here the context of a row is the value of one categorical field (``{name: contextnorm,
field: C14}``): the ``num_contexts`` most frequent values of the field (ids
``NUM_RESERVED .. NUM_RESERVED + num_contexts - 1``, the feature pipeline numbers kept values
by train frequency) each get their own context; the reserved ids (missing, OOV) keep theirs,
and every other id -- rare values and values never seen in training -- falls back to the
shared OOV context.

**How the layer gets the batch's context ids without a second signature.** Every norm is
built as ``create_norm(spec, width, **kw)`` and called as ``norm(x)``; a context norm also
needs the ids of the rows in ``x``. The model does not pass them: :func:`bind_contexts`
installs a forward pre-hook on the *root* module (every ctrcal model is called
``model(batch)``) that, before any layer runs, hands each :class:`ContextNorm` in the tree its
column ``batch.categorical[:, j]``; a forward hook
clears them after the pass (no stale ids, no tensor kept alive). The hook looks the norms up
at every call, so norms swapped in later with ``replace_norms`` are found too, and works for
foreign models unchanged (ctrcal calls :func:`bind_contexts` in ``create_model``; users of
``replace_norms`` on their own module call it once themselves). A context norm called
without ids raises an error that says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrcal.core.errors import ConfigError
from ctrcal.core.ids import NUM_RESERVED, OOV_ID

__all__ = ["ContextNorm", "bind_contexts"]


class ContextNorm(nn.Module):
    """Context Normalization over the last ``width`` features.

    Args:
        width: normalized width N (an int; the last dimension of the input).
        field: the categorical field whose value is the context (its name, e.g. ``"C14"``,
            or its column index in ``Batch.categorical``).
        num_contexts: how many of the field's most frequent values get their own context
            (the others share the OOV context).
        context_dim: width of the context embedding fed to the mean and scale maps.
        eps: added to ``sigma_r^2``.
        elementwise_affine: learn ``gamma`` and ``beta`` per feature after normalizing.

    Shape:
        input ``[B, ..., N]`` -> output of the same shape; the context ids are ``[B]``
        (set by :func:`bind_contexts`' hook, or by :meth:`set_context`).

    At initialisation ``mu_r = 0`` and ``sigma_r = 1`` for every context: the layer starts as
    the identity (times ``gamma``, plus ``beta``) and learns per-context statistics.
    """

    def __init__(
        self,
        width: int,
        field: str | int,
        num_contexts: int = 32,
        context_dim: int = 8,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(width, int) or width < 1:
            raise ConfigError(
                f"contextnorm normalizes the last dim: width must be an int >= 1, got {width!r}"
            )
        if isinstance(field, bool) or not isinstance(field, (str, int)) or field == "":
            raise ConfigError(f"contextnorm: field must be a categorical field name, got {field!r}")
        if num_contexts < 1 or context_dim < 1:
            raise ConfigError(
                f"contextnorm: num_contexts and context_dim must be >= 1, got {num_contexts}, "
                f"{context_dim}"
            )
        self.width = int(width)
        self.field = field
        self.num_contexts = int(num_contexts)
        self.eps = float(eps)
        self.field_index_: int | None = field if isinstance(field, int) else None
        # a plain parameter, not an nn.Embedding: the trainer's embedding L2 and sparse
        # gradients are for feature tables, not for a norm's statistics
        rows = NUM_RESERVED + self.num_contexts
        self.context_weight = nn.Parameter(torch.empty(rows, context_dim))
        # the mean and scale maps as raw parameters (not nn.Linear), so a model's blanket
        # re-initialisation of its linear layers leaves the identity start intact
        self.mean_weight = nn.Parameter(torch.empty(context_dim, self.width))
        self.mean_bias = nn.Parameter(torch.empty(self.width))
        self.scale_weight = nn.Parameter(torch.empty(context_dim, self.width))
        self.scale_bias = nn.Parameter(torch.empty(self.width))
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.width))
            self.bias = nn.Parameter(torch.zeros(self.width))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self._ids: Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Contexts start as the identity: mean 0, softplus(scale) = 1."""
        nn.init.normal_(self.context_weight, std=0.1)
        nn.init.zeros_(self.mean_weight)
        nn.init.zeros_(self.mean_bias)
        nn.init.zeros_(self.scale_weight)
        nn.init.constant_(self.scale_bias, math.log(math.e - 1.0))  # softplus^-1(1)
        if self.weight is not None:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def set_context(self, ids: Tensor | None) -> None:
        """The raw field ids ``[B]`` of the next forward pass (None clears them)."""
        self._ids = ids

    def context_index(self, ids: Tensor) -> Tensor:
        """Field ids -> context rows: the top ``num_contexts`` values keep theirs, others OOV."""
        ids = ids.long()
        keep = (ids >= 0) & (ids < NUM_RESERVED + self.num_contexts)
        return torch.where(keep, ids, torch.full_like(ids, OOV_ID))

    def forward(self, x: Tensor) -> Tensor:
        ids = self._ids
        if ids is None:
            raise RuntimeError(
                f"ContextNorm(field={self.field!r}) got no context ids: call the model through "
                "ctrcal (create_model) or bind it once with "
                "ctrcal.bind_contexts(model, feature_map.categorical_fields)"
            )
        if ids.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"ContextNorm(field={self.field!r}): {ids.shape[0]} context ids for an input of "
                f"{x.shape[0]} rows"
            )
        emb = F.embedding(self.context_index(ids), self.context_weight)  # [B, context_dim]
        mean = torch.addmm(self.mean_bias, emb, self.mean_weight)  # [B, N]
        std = F.softplus(torch.addmm(self.scale_bias, emb, self.scale_weight))
        inv = torch.rsqrt(std.square() + self.eps)
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (self.width,)
        y = (x - mean.view(shape).to(x.dtype)) * inv.view(shape).to(x.dtype)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y

    def extra_repr(self) -> str:
        return (
            f"{self.width}, field={self.field!r}, num_contexts={self.num_contexts}, eps={self.eps}"
        )


def _context_norms(root: nn.Module) -> list[ContextNorm]:
    return [m for m in root.modules() if isinstance(m, ContextNorm)]


def bind_contexts(model: nn.Module, categorical_fields: Sequence[str] | Any | None) -> int:
    """Let every :class:`ContextNorm` in ``model`` see its field's ids on each forward pass.

    Resolves each context norm's ``field`` to its column in ``Batch.categorical`` and installs
    (once) a forward pre-hook on ``model`` that reads ``batch.categorical`` -- ``batch`` being
    the one argument of ``model(batch)`` -- and a forward hook that clears the ids afterwards.

    Args:
        model: the root module, called as ``model(batch)`` with ``batch.categorical``
            ``[B, Fc]`` (a :class:`~ctrcal.core.batch.Batch`).
        categorical_fields: the field names in column order (``feature_map.categorical_fields``;
            a feature map itself is accepted too). None: every field must be an index.

    Returns:
        How many context norms the model holds now.

    Raises:
        ConfigError: a field that is not one of the categorical fields.
    """
    fields = getattr(categorical_fields, "categorical_fields", categorical_fields)
    fields = list(fields) if fields is not None else None
    norms = _context_norms(model)
    for norm in norms:
        if isinstance(norm.field, int):
            if fields is not None and not 0 <= norm.field < len(fields):
                raise ConfigError(
                    f"contextnorm: field index {norm.field} is outside the {len(fields)} "
                    "categorical fields"
                )
            norm.field_index_ = norm.field
            continue
        if fields is None or norm.field not in fields:
            from ctrcal.core.registry import closest

            hint = closest(str(norm.field), fields or [])
            did = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(
                f"contextnorm: field {norm.field!r} is not a categorical field{did} "
                f"(valid: {', '.join(fields or [])})"
            )
        norm.field_index_ = fields.index(norm.field)
    if norms and _set_contexts not in model._forward_pre_hooks.values():
        model.register_forward_pre_hook(_set_contexts)
        model.register_forward_hook(_clear_contexts)
    return len(norms)


def _set_contexts(module: nn.Module, args: tuple[Any, ...]) -> None:
    norms = _context_norms(module)
    if not norms:
        return
    categorical = getattr(args[0], "categorical", None) if args else None
    if not isinstance(categorical, Tensor) or categorical.dim() != 2:
        raise RuntimeError(
            "a model with a ContextNorm is called as model(batch), batch.categorical [B, Fc]"
        )
    for norm in norms:
        if norm.field_index_ is None:
            raise RuntimeError(
                f"ContextNorm(field={norm.field!r}) is not bound to a column: call "
                "ctrcal.bind_contexts(model, feature_map.categorical_fields) after adding it"
            )
        norm.set_context(categorical[:, norm.field_index_])


def _clear_contexts(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    for norm in _context_norms(module):
        norm.set_context(None)
