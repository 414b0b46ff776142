"""Monte Carlo prediction: the one loop of stochastic forward passes, and :func:`mc_predict`.

Eq. 6 of the paper: the predictive probability is the mean of ``sigmoid(logits)`` over
forward passes with the MC layers sampling (probabilities are averaged, not logits).
:func:`sample_probabilities` runs those passes for any model, with the batch repeated along
dim 0 so one forward pass yields many samples; it is the loop of :func:`mc_predict` and of
the shift report's predictions (:func:`ctrcal.eval.predictive.predict_split`, which adds
MC-Dropout and ensembles around it). Which layers sample is the caller's choice
(:func:`~ctrcal.layers.mc_layernorm.module.mc_mode`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ctrcal.layers.mc_layernorm.module import mc_mode

__all__ = ["mc_predict", "sample_probabilities"]


def sample_probabilities(
    model: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    n_samples: int,
    max_rows: int | None = None,
) -> Tensor:
    """``sigmoid(model(*inputs))`` of ``n_samples`` forward passes, in the model's mode.

    Each forward pass takes the rows of a chunk repeated ``s`` times (``s`` samples per pass):
    a chunk has at most ``max_rows`` rows, and a pass at most ``max_rows`` rows in all (at
    least one sample of one row). A pass of one sample takes the rows as they are.

    Args:
        model: returns logits ``[B]`` or ``[B, 1]`` for batch-first inputs.
        inputs: tensors with the batch dimension B first, all of one batch size.
        n_samples: passes per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).

    Returns:
        Probabilities ``[n_samples, B]`` in float32.

    Raises:
        ValueError: logits of another shape.
    """
    batch = inputs[0].shape[0]
    limit = n_samples * batch if max_rows is None else int(max_rows)
    step = max(1, min(batch, limit))
    chunks: list[Tensor] = []
    for start in range(0, batch, step):
        chunk = [t[start : start + step] for t in inputs]
        rows = chunk[0].shape[0]
        per_pass = max(1, limit // max(rows, 1))
        parts = []
        done = 0
        while done < n_samples:
            s = min(per_pass, n_samples - done)
            rep = chunk if s == 1 else [t.repeat(s, *([1] * (t.dim() - 1))) for t in chunk]
            logits = model(*rep)
            if logits.numel() != s * rows:
                raise ValueError(
                    f"MC passes expect logits [B] or [B, 1], got {list(logits.shape)}"
                )
            parts.append(torch.sigmoid(logits.float().reshape(s, rows)))
            done += s
        chunks.append(torch.cat(parts, dim=0))
    if not chunks:
        return inputs[0].new_zeros((n_samples, 0), dtype=torch.float32)
    return torch.cat(chunks, dim=1)


@torch.no_grad()
def mc_predict(
    model: nn.Module,
    *inputs: Tensor,
    n_samples: int = 10,
    max_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Monte Carlo prediction: mean and std of ``sigmoid(model(*inputs))`` over samples.

    The model runs in eval mode with every MC layer sampling (its training flag is restored
    afterwards); the passes are :func:`sample_probabilities`'s, ``max_rows`` bounding the
    rows of one pass.

    Args:
        model: module whose forward takes batch-first tensors and returns logits [B] or [B, 1].
        *inputs: tensors with the batch dimension first (e.g. categorical [B, Fc] and
            numeric [B, Fn]).
        n_samples: number of MC samples per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).

    Returns:
        (mean_prob [B], std_prob [B]) in float32; std is the population std over samples.
    """
    if not inputs:
        raise ValueError("mc_predict needs at least one input tensor")
    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if max_rows is not None and int(max_rows) < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    batch = inputs[0].shape[0]
    for t in inputs:
        if t.shape[0] != batch:
            raise ValueError(
                f"all inputs need the same batch size, got {[t.shape[0] for t in inputs]}"
            )
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
