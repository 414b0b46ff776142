"""Predictions of a report variant on a (shifted) split: one-shot, MC passes, ensembles.

:func:`predict_split` runs one or more models (the members of a deep ensemble, or one run)
over a split batch by batch. The shift is applied once per batch where the batch lives, so
every member and every MC pass sees the same shifted rows. Per row it returns the mean click
probability over all members × passes and, when there is more than one sample, their
standard deviation (the predictive std whose AUROC at telling shifted from clean rows the
report measures).

Stochastic passes come from the model's own layers:

* MC-LayerNorm (any module with an ``mc_sampling`` flag, :func:`ctrcal.layers.mc_layernorm.
  module.mc_mode`) keeps sampling its subsets;
* MC-Dropout: every ``nn.Dropout`` module of the model, whatever the model, is kept in training
  mode (:func:`dropout_modules`).

The passes of one batch are :func:`ctrcal.layers.mc_layernorm.predict.sample_probabilities`,
the loop :func:`~ctrcal.layers.mc_layernorm.predict.mc_predict` runs too: one forward over the batch
repeated ``passes`` times (at most ``4 * batch_size`` rows a pass), no Python loop per sample
for small batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrcal.layers.mc_layernorm.module import mc_mode
from ctrcal.layers.mc_layernorm.predict import sample_probabilities

__all__ = ["Prediction", "dropout_modules", "mc_dropout", "predict_split"]


@dataclass
class Prediction:
    """Predictions on a split (row order), on the host.

    Attributes:
        probs: [n] float64 click probabilities (mean over members and passes).
        logits: [n] float64 logits of a single deterministic prediction, else None.
        std: [n] float64 per-row std of the probability over samples, or None (one sample).
        rows: [n] bool, True = the shift acted on the row.
    """

    probs: np.ndarray
    logits: np.ndarray | None
    std: np.ndarray | None
    rows: np.ndarray


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """The dropout layers of any model (``nn.Dropout`` and its 1d/2d/3d/alpha relatives, p > 0)."""
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
    return [m for m in model.modules() if isinstance(m, kinds) and float(m.p) > 0.0]


@contextlib.contextmanager
def mc_dropout(model: nn.Module) -> Iterator[int]:
    """Keep the model's dropout layers sampling while the rest stays in eval mode.

    Yields:
        The number of dropout layers switched on.

    Raises:
        ValueError: the model has no dropout layer with p > 0 (MC-Dropout would be one-shot).
    """
    layers = dropout_modules(model)
    if not layers:
        raise ValueError(
            f"MC-Dropout: {type(model).__name__} has no dropout layer with p > 0 "
            "(train it with dropout, e.g. model.dropout > 0)"
        )
    before = [m.training for m in layers]
    try:
        for m in layers:
            m.train(True)
        yield len(layers)
    finally:
        for m, was in zip(layers, before, strict=True):
            m.train(was)


@torch.no_grad()
def predict_split(
    models: Sequence[nn.Module],
    data: Any,
    *,
    batch_size: int,
    device: Any,
    shift: Any = None,
    mc_samples: int = 0,
    mc_dropout_on: bool = False,
) -> Prediction:
    """Predict a split with one model or an ensemble, optionally shifted and with MC passes.

    Args:
        models: the runs to average (one = a single model); in eval mode on ``device``.
        data: a :class:`~ctrcal.data.loader.ParquetCTRData` or a Batch.
        batch_size: rows per batch.
        device: where the models run.
        shift: a shift from :func:`~ctrcal.shifts.registry.create_shift` (``apply(batch)``),
            or None.
        mc_samples: passes per model with the stochastic layers on (0 = one deterministic pass).
        mc_dropout_on: keep dropout sampling during the passes (MC-Dropout).

    Returns:
        :class:`Prediction`; ``logits`` only for a single deterministic model, ``std`` whenever
        there is more than one sample per row.
    """
    from ctrcal.train.predict import iter_batches

    if not models:
        raise ValueError("predict_split needs at least one model")
    passes = max(1, int(mc_samples))
    stochastic = mc_samples > 0
    single = len(models) == 1 and not stochastic
    means, stds, logits, masks = [], [], [], []
    with contextlib.ExitStack() as stack:
        for m in models:
            m.eval()
            if stochastic:
                stack.enter_context(mc_mode(m))
                if mc_dropout_on:
                    stack.enter_context(mc_dropout(m))
        for batch in iter_batches(data, batch_size):
            rows = torch.ones(len(batch), dtype=torch.bool)
            if shift is not None:
                batch, rows = shift.apply(batch)
            masks.append(rows.cpu())
            inputs = batch.inputs().to(device, non_blocking=True)
            if single:
                z = models[0](inputs).float().reshape(-1)
                logits.append(z.double().cpu())
                means.append(torch.sigmoid(z).double().cpu())
                continue
            p = torch.cat(
                [sample_probabilities(m, [inputs], passes, 4 * batch_size) for m in models]
            )
            std, mean = torch.std_mean(p.double(), dim=0, correction=0)
            means.append(mean.cpu())
            stds.append(std.cpu())
    probs = torch.cat(means).numpy() if means else np.zeros(0)
    return Prediction(
        probs=probs,
        logits=torch.cat(logits).numpy() if single and logits else None,
        std=torch.cat(stds).numpy() if stds else None,
        rows=torch.cat(masks).numpy() if masks else np.zeros(0, dtype=bool),
    )
