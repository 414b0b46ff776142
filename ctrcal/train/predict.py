"""Batched prediction over a data split or one in-memory batch (the shift hooks in here).

``transform(numeric) -> numeric`` is applied to every batch's numeric tensor where the batch
lives (before it moves to the model's device), so a seeded shift draws the same noise
whatever device the model runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ctrcal.data.loader import Batch

__all__ = ["iter_batches", "predict_logits", "predict_probs"]

NumericTransform = Callable[[torch.Tensor], torch.Tensor]


def iter_batches(data: Any, batch_size: int) -> Iterator[Batch]:
    """Batches in row order from a :class:`~ctrcal.data.loader.ParquetCTRData` or a Batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(data, Batch):
        n = len(data)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            yield data.map(lambda t, a=start, b=stop: t[a:b])
        return
    if not hasattr(data, "batches"):
        raise TypeError(f"expected a Batch or ParquetCTRData, got {type(data).__name__}")
    yield from data.batches(batch_size, shuffle=False)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@torch.no_grad()
def predict_with_labels(
    model: nn.Module,
    data: Any,
    batch_size: int = 16384,
    device: torch.device | str | None = None,
    transform: NumericTransform | None = None,
    mc_samples: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outputs [N], labels [N])`` on the CPU in row order.

    ``outputs`` are logits, or with ``mc_samples > 0`` the MC-averaged click probabilities
    (:func:`ctrcal.layers.mc_layernorm.mc_predict`).
    """
    device = torch.device(device) if device is not None else _model_device(model)
    was_training = model.training
    model.eval()
    outs: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    try:
        for batch in iter_batches(data, batch_size):
            numeric = batch.numeric if transform is None else transform(batch.numeric)
            inputs = Batch(batch.categorical, numeric, None).to(device, non_blocking=True)
            if mc_samples > 0:
                from ctrcal.layers.mc_layernorm import mc_predict

                out, _ = mc_predict(model, inputs, n_samples=mc_samples, max_rows=batch_size)
            else:
                out = model(inputs)
            outs.append(out.float().reshape(-1).cpu())
            labels.append(batch.label.float().cpu())
    finally:
        model.train(was_training)
    if not outs:
        empty = torch.zeros(0, dtype=torch.float32)
        return empty, empty.clone()
    return torch.cat(outs), torch.cat(labels)


def predict_logits(
    model: nn.Module,
    data: Any,
    batch_size: int = 16384,
    device: torch.device | str | None = None,
    transform: NumericTransform | None = None,
) -> torch.Tensor:
    """Logits ``[N]`` (float32, CPU, row order) of ``model`` on a split or a Batch.

    Args:
        model: any module ``model(batch) -> logits [B]``; run in eval mode
            (its training flag is restored afterwards), so MC layers use their one-shot form
            unless the caller wraps this in ``mc_mode``.
        data: a :class:`~ctrcal.data.loader.ParquetCTRData` or a :class:`Batch`.
        batch_size: rows per forward pass.
        device: where the model runs (default: the device of its parameters).
        transform: ``numeric [B, Fn] -> numeric`` applied to every batch (e.g. a
            :class:`~ctrcal.shifts.builtin.GaussianShift`).
    """
    return predict_with_labels(model, data, batch_size, device, transform)[0]


def predict_probs(
    model: nn.Module,
    data: Any,
    batch_size: int = 16384,
    device: torch.device | str | None = None,
    transform: NumericTransform | None = None,
    mc_samples: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Click probabilities and labels ``([N], [N])``; ``mc_samples > 0`` averages MC passes."""
    out, labels = predict_with_labels(model, data, batch_size, device, transform, mc_samples)
    return (out if mc_samples > 0 else torch.sigmoid(out)), labels
