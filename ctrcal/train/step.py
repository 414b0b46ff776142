"""One optimizer step: the optimizer's parameter groups, gradient buffers, clipping, AMP.

:func:`make_step_context` is built once per training run; :func:`train_step` then does one
step on one batch without a host sync (the loss stays on the device).

Embedding L2 (``train.emb_l2``) is FuxiCTR's ``embedding_regularizer``: (λ/2)·||W||² over the
WHOLE categorical table (rows a batch does not use shrink too, as in the published setups),
applied as its gradient λ·W: with Adam as the table group's coupled ``weight_decay`` inside the
fused optimizer kernel (no extra pass over the table; it is added after gradient clipping,
which only matters in the rare steps that clip), with AdamW added to the gradient before
clipping. The reported training loss is the BCE alone. Only ``nn.Embedding`` tables are
penalised, not the numeric embedding vectors (FuxiCTR's numeric embeddings are linear
layers, outside its embedding regulariser too).

Weight noise (``train.weight_noise``, :mod:`ctrcal.train.noise`) perturbs the dense weights
(every trainable parameter but the embedding tables) for the forward and backward pass and
restores them before clipping and the optimizer step.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import optimizer as optim_hooks

from ctrcal.core.batch import Batch
from ctrcal.layers.embedding import FeatureEmbedding
from ctrcal.train.cpu_memory import retain_freed_memory
from ctrcal.train.noise import perturb_weights, restore_weights, weight_noise_std
from ctrcal.train.precision import compute_precision

__all__ = [
    "StepContext",
    "embedding_tables",
    "make_optimizer",
    "LR_SCHEDULES",
    "set_scheduled_lr",
    "make_step_context",
    "optimizer_step",
    "train_step",
    "without_dynamo_import",
]


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters other than the embedding tables: the optimizer's dense group,
    and what weight noise perturbs."""
    tables = {id(p) for p in embedding_tables(model)}
    return [p for p in model.parameters() if p.requires_grad and id(p) not in tables]


def make_optimizer(model: nn.Module, cfg_train: Any) -> torch.optim.Optimizer:
    """Adam or AdamW over two groups: dense layers (``weight_decay``) and embedding tables.

    With Adam, ``emb_l2`` is the table group's (coupled, i.e. L2) ``weight_decay``: Adam adds
    ``emb_l2 * W`` to the table's gradient inside its fused kernel, which is exactly the
    gradient of (emb_l2/2)*||W||^2 at no extra pass over the table. (AdamW's weight decay is
    decoupled, so there :func:`train_step` adds the L2 gradient itself.)
    """
    tables = {id(p) for p in embedding_tables(model)}
    dense = dense_parameters(model)
    emb = [p for p in model.parameters() if p.requires_grad and id(p) in tables]
    groups = [{"params": dense, "weight_decay": cfg_train.weight_decay}]
    if emb:
        decay = cfg_train.emb_l2 if cfg_train.optimizer == "adam" else 0.0
        groups.append({"params": emb, "weight_decay": decay})
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg_train.optimizer]
    devices = {p.device.type for p in model.parameters()}
    # The fused kernels (one per step instead of one per tensor) exist on CPU and CUDA.
    fused = devices <= {"cpu", "cuda"}
    for group in groups:
        # the LR the plateau rule lowers; a within-training schedule multiplies it each step
        # (a param group key, so it is saved and resumed with the optimizer's state)
        group["base_lr"] = cfg_train.lr
    with without_dynamo_import():
        return cls(groups, lr=cfg_train.lr, fused=fused)


# ``train.lr_schedule``: the LR multiplier at the fraction ``t`` in [0, 1) of all planned steps
# (``train.epochs`` × the steps of an epoch). ``constant`` leaves the LR to the plateau rule;
# the decays bring it to 0 at the last step, so the run ends where the loss is flat instead of
# wherever the last full-size steps put it (with a constant LR, one epoch of the decisive
# protocol ended with PCOC anywhere in 0.84-1.13 across seeds; decayed, 1.00-1.02).
LR_SCHEDULES: dict[str, Callable[[float], float]] = {
    "constant": lambda t: 1.0,
    "linear": lambda t: 1.0 - t,
    "cosine": lambda t: 0.5 * (1.0 + math.cos(math.pi * t)),
}


def set_scheduled_lr(
    optimizer: torch.optim.Optimizer, schedule: str, step: int, total_steps: int
) -> None:
    """Set every group's LR to its ``base_lr`` times ``schedule``'s multiplier at global step
    ``step`` of ``total_steps`` (Python floats: no tensor, no host sync)."""
    multiplier = LR_SCHEDULES[schedule](min(step / max(total_steps, 1), 1.0))
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * multiplier


# torch.optim.Optimizer methods wrapped in ``torch._disable_dynamo`` that a run calls.
_DYNAMO_GUARDED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


@contextmanager
def without_dynamo_import() -> Iterator[None]:
    """Call torch's optimizer methods without importing ``torch._dynamo`` in a process that
    has not imported it.

    torch wraps :class:`torch.optim.Optimizer`'s ``add_param_group``, ``zero_grad``,
    ``state_dict`` and ``load_state_dict`` in ``torch._disable_dynamo``, whose first call
    imports ``torch._dynamo`` (1.6-2.4 s of CPU here, more than torch itself) only to build a
    "do not trace this" wrapper, cached on the function as ``__dynamo_disable``. That wrapper
    changes nothing outside a dynamo trace, and a process without dynamo traces nothing: for
    the duration of the block the cache holds the plain function (what the wrapper calls
    outside a trace), and torch's own wrapping is back when the block ends.
    """
    if "torch._dynamo" in sys.modules:
        yield
        return
    placed = []
    for name in _DYNAMO_GUARDED:
        plain = getattr(torch.optim.Optimizer, name).__wrapped__
        if getattr(plain, "__dynamo_disable", None) is None:
            plain.__dynamo_disable = plain
            placed.append(plain)
    try:
        yield
    finally:
        for plain in placed:
            if getattr(plain, "__dynamo_disable", None) is plain:
                del plain.__dynamo_disable


def _plain_step(optimizer: torch.optim.Optimizer) -> Callable[..., object] | None:
    """The optimizer class's own ``step`` under torch's two wrappers (the hook/profiler one
    that ``Optimizer.__init__`` installs, and ``_use_grad_for_differentiable``), or None where
    the wrapping is not the one this module knows."""
    hooked = type(optimizer).step
    use_grad = getattr(hooked, "__wrapped__", None)
    plain = getattr(use_grad, "__wrapped__", None)
    known = (
        getattr(hooked, "hooked", False)
        and getattr(getattr(use_grad, "__code__", None), "co_name", None) == "_use_grad"
        and callable(plain)
        and not optimizer.defaults.get("differentiable", False)
    )
    return plain if known else None


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, without importing ``torch._dynamo`` in a process that has not.

    torch's ``step`` wrapper imports dynamo on every call for a ``graph_break()``, which does
    nothing outside a trace; the rest of what it does is the grad mode (off, for an optimizer
    that is not differentiable), step hooks and a profiler label. Where no hook is registered,
    no profiler runs and ``step`` is the class's, the same update is the class's own step under
    ``no_grad``; otherwise, or once dynamo is imported, torch's ``step`` runs as it is.
    """
    plain = _plain_step(optimizer)
    hooks = (
        optim_hooks._global_optimizer_pre_hooks
        or optim_hooks._global_optimizer_post_hooks
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
    )
    if (
        plain is None
        or "step" in vars(optimizer)  # a step replaced on the instance runs as it is
        or hooks
        or "torch._dynamo" in sys.modules
        or torch.autograd.profiler._is_profiler_enabled
    ):
        optimizer.step()
        return
    with torch.no_grad():
        plain(optimizer)


def embedding_tables(model: nn.Module) -> list[nn.Parameter]:
    """Weights of every ``nn.Embedding`` in the model (what ``emb_l2`` applies to)."""
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            seen[id(module.weight)] = module.weight
    return list(seen.values())


@dataclass
class StepContext:
    """Everything one training step needs (built once by :func:`make_step_context`)."""

    model: nn.Module
    forward: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]
    tables: list[nn.Parameter]
    emb_l2: float  # added by the step itself (AdamW); 0 when the optimizer applies it (Adam)
    grad_clip: float
    device_type: str
    amp_dtype: torch.dtype | None
    sparse_tables: bool = False  # tables emit sparse grads into persistent dense .grad buffers
    weight_noise_std: float = 0.0  # std of the noise on `noisy` for each forward/backward
    noisy: list[nn.Parameter] | None = None  # the weights weight noise perturbs


def make_step_context(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg_train: Any,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    forward: Callable[..., torch.Tensor] | None = None,
    sparse_tables: bool = True,
) -> StepContext:
    """Set up the training step for ``model`` (switching its tables to sparse gradients).

    With ``sparse_tables`` the tables' gradients touch only the B*F looked-up rows of a
    dense ``.grad`` kept allocated across steps (zeroed in place), instead of a fresh
    table-sized gradient allocated, zeroed and filled every step: a
    :class:`~ctrcal.layers.embedding.FeatureEmbedding` gets ``grad_in_place`` (its backward
    adds the rows straight into ``.grad``, see :mod:`ctrcal.layers.table_lookup`), any other
    ``nn.Embedding`` ``sparse=True`` (autograd adds its sparse gradient into ``.grad``). The
    optimizer still sees an ordinary dense gradient, so Adam's update of every row is
    unchanged.
    """
    tables = embedding_tables(model)
    if device.type == "cpu":
        retain_freed_memory()  # no page faults on the activations every step
    if sparse_tables:
        in_place = set()
        for module in model.modules():
            if isinstance(module, FeatureEmbedding) and module.table is not None:
                module.grad_in_place = True
                in_place.add(id(module.table))
        for module in model.modules():
            if isinstance(module, nn.Embedding) and id(module) not in in_place:
                module.sparse = True
    return StepContext(
        model=model,
        forward=forward if forward is not None else model,
        optimizer=optimizer,
        params=[p for p in model.parameters() if p.requires_grad],
        tables=tables,
        emb_l2=cfg_train.emb_l2 if cfg_train.optimizer != "adam" else 0.0,
        grad_clip=cfg_train.grad_clip,
        device_type=device.type,
        amp_dtype=amp_dtype,
        sparse_tables=sparse_tables and bool(tables),
        weight_noise_std=weight_noise_std(cfg_train.weight_noise),
        # the tables are left out: noising a whole table costs a table-sized pass per step,
        # and the rows a batch does not look up would not change its forward anyway
        noisy=dense_parameters(model),
    )


def zero_grads(ctx: StepContext) -> None:
    if not ctx.sparse_tables:
        with without_dynamo_import():
            ctx.optimizer.zero_grad(set_to_none=True)
        return
    table_ids = {id(t) for t in ctx.tables}
    for p in ctx.params:
        if id(p) not in table_ids:
            p.grad = None
        elif p.grad is None or p.grad.is_sparse:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()


def clip_grads(ctx: StepContext) -> None:
    grads = [p.grad for p in ctx.params if p.grad is not None]
    if ctx.device_type != "cpu":
        # no host sync on accelerators: always multiply by min(1, clip / norm) on the device
        nn.utils.clip_grad_norm_(ctx.params, ctx.grad_clip, foreach=True)
        return
    # On the CPU reading the norm costs nothing, and skipping the (rarely needed) rescale
    # saves a pass over the whole table. Same threshold as clip_grad_norm_.
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = ctx.grad_clip / (float(total) + 1e-6)
    if coef < 1.0:
        torch._foreach_mul_(grads, coef)


def train_step(ctx: StepContext, batch: Batch) -> torch.Tensor:
    """One optimizer step; returns the (device) mean BCE of the batch, without a host sync."""
    zero_grads(ctx)
    # Weight noise in its regulariser form (Graves 2011; the seed's section 7.6.2): the
    # gradient is taken at W + eps and applied to W; noise kept in the weights would instead
    # be a random walk of the weights that the optimizer has to undo.
    clean = perturb_weights(ctx.noisy, ctx.weight_noise_std) if ctx.weight_noise_std else None
    with compute_precision(ctx.amp_dtype, ctx.device_type):
        logits = ctx.forward(batch.inputs())
    loss = F.binary_cross_entropy_with_logits(logits.float(), batch.label)
    loss.backward()
    if clean is not None:
        restore_weights(ctx.noisy, clean)
    if ctx.emb_l2 > 0:
        with_grad = [t for t in ctx.tables if t.grad is not None]
        with torch.no_grad():
            torch._foreach_add_([t.grad for t in with_grad], with_grad, alpha=ctx.emb_l2)
    if ctx.grad_clip > 0:
        clip_grads(ctx)
    optimizer_step(ctx.optimizer)
    return loss.detach()
