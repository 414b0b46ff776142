"""Monte Carlo prediction: the one loop of stochastic forward passes, and :func:`mc_predict`.

Eq. 6 of the paper: the predictive probability is the mean of ``sigmoid(logits)`` over
forward passes with the MC layers sampling (probabilities are averaged, not logits).
:func:`sample_probabilities` runs those passes for any model -- a ctrcal model called as
``model(batch)`` with a :class:`~ctrcal.core.batch.Batch`, or any module called with batch-first
tensors -- with the rows repeated along dim 0 so one forward pass yields many samples; it is
the loop of :func:`mc_predict` and of the shift report's predictions
(:func:`ctrcal.train.predict.predict_split`, which adds MC-Dropout and ensembles around it).
Which layers sample is the caller's choice (:func:`~ctrcal.layers.mc_layernorm.module.mc_mode`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ctrcal.core.batch import Batch
from ctrcal.layers.kernels.fusion import unhooked
from ctrcal.layers.mc_layernorm.module import mc_mode

__all__ = ["mc_predict", "sample_probabilities"]

Input = Tensor | Batch


def _rows_of(x: Input, fn: Callable[[Tensor], Tensor]) -> Input:
    """``fn`` applied to a tensor, or to each tensor of a batch."""
    return x.map(fn) if isinstance(x, Batch) else fn(x)


def sample_probabilities(
    model: Callable[..., Tensor],
    inputs: Sequence[Input],
    n_samples: int,
    max_rows: int | None = None,
) -> Tensor:
    """``sigmoid(model(*inputs))`` of ``n_samples`` forward passes, in the model's mode.

    Each forward pass takes the rows of a chunk repeated ``s`` times (``s`` samples per pass):
    a chunk has at most ``max_rows`` rows, and a pass at most ``max_rows`` rows in all (at
    least one sample of one row). A pass of one sample takes the rows as they are. A model
    with an ``mc_replay`` hook (the built-in ones, :mod:`ctrcal.models.replay`) computes the
    part of its forward before its first stochastic layer once per chunk and replays only
    the rest: the same logits as its full passes, for a fraction of their cost.

    Args:
        model: returns logits ``[B]`` or ``[B, 1]`` for batch-first inputs.
        inputs: a :class:`~ctrcal.core.batch.Batch` (the model sees it with ``label=None``) or
            tensors with the batch dimension B first, all of one batch size.
        n_samples: passes per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).

    Returns:
        Probabilities ``[n_samples, B]`` in float32.

    Raises:
        ValueError: logits of another shape.
    """
    inputs = [x.inputs() if isinstance(x, Batch) else x for x in inputs]
    batch = len(inputs[0])
    limit = n_samples * batch if max_rows is None else int(max_rows)
    step = max(1, min(batch, limit))
    replays = _replays(model, inputs, n_samples)
    chunks: list[Tensor] = []
    for start in range(0, batch, step):
        chunk = [_rows_of(x, lambda t, a=start: t[a : a + step]) for x in inputs]
        rows = len(chunk[0])
        per_pass = max(1, limit // max(rows, 1))
        replay = replays(chunk[0]) if replays is not None else None
        parts = []
        done = 0
        while done < n_samples:
            s = min(per_pass, n_samples - done)
            if replay is not None:
                logits = replay(s)
            else:
                tile = lambda t, s=s: t.repeat(s, *([1] * (t.dim() - 1)))  # noqa: E731
                logits = model(*(chunk if s == 1 else [_rows_of(x, tile) for x in chunk]))
            if logits.numel() != s * rows:
                raise ValueError(f"MC passes expect logits [B] or [B, 1], got {list(logits.shape)}")
            parts.append(torch.sigmoid(logits.float().reshape(s, rows)))
            done += s
        chunks.append(torch.cat(parts, dim=0))
    if not chunks:
        return torch.zeros((n_samples, 0), dtype=torch.float32)
    return torch.cat(chunks, dim=1)


def _replays(
    model: Callable[..., Tensor], inputs: Sequence[Input], n_samples: int
) -> Callable[[Batch], Callable[[int], Tensor] | None] | None:
    """The model's ``mc_replay`` where the passes may share its deterministic prefix: several
    passes of a model called with one Batch that defines the hook (see
    :mod:`ctrcal.models.replay`) and has no hook of its own that must see it called."""
    replay = getattr(model, "mc_replay", None)
    if replay is None or n_samples < 2 or len(inputs) != 1 or not isinstance(inputs[0], Batch):
        return None
    if isinstance(model, nn.Module) and not unhooked(model):
        return None
    return replay


@torch.no_grad()
def mc_predict(
    model: nn.Module,
    *inputs: Input,
    n_samples: int = 10,
    max_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Monte Carlo prediction: mean and std of ``sigmoid(model(*inputs))`` over samples.

    The model runs in eval mode with every MC layer sampling (its training flag is restored
    afterwards); the passes are :func:`sample_probabilities`'s, ``max_rows`` bounding the
    rows of one pass.

    Args:
        model: module returning logits [B] or [B, 1]: a ctrcal model (``model(batch)``) or any
            module whose forward takes batch-first tensors.
        *inputs: a :class:`~ctrcal.core.batch.Batch` for a ctrcal model (its label is not passed
            on), or tensors with the batch dimension first (e.g. ``x`` [B, N]).
        n_samples: number of MC samples per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).

    Returns:
        (mean_prob [B], std_prob [B]) in float32; std is the population std over samples.
    """
    if not inputs:
        raise ValueError("mc_predict needs an input: a Batch or batch-first tensors")
    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if max_rows is not None and int(max_rows) < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    batch = len(inputs[0])
    parts = [(x.categorical, x.numeric) if isinstance(x, Batch) else (x,) for x in inputs]
    sizes = [len(t) for tensors in parts for t in tensors]
    if any(n != batch for n in sizes):
        raise ValueError(f"all inputs need the same batch size, got {sizes}")
    was_training = model.training
    model.eval()
    try:
        with mc_mode(model) as mode:
            if mode.count == 0:
                warnings.warn(
                    "mc_predict: the model has no MC layers; all samples are identical",
                    stacklevel=3,
                )
            p = sample_probabilities(model, inputs, int(n_samples), max_rows)
    finally:
        model.train(was_training)
    std, mean = torch.std_mean(p, dim=0, correction=0)
    return mean, std
