"""The one prediction loop: a split through one model or an ensemble, one-shot or with MC passes.

:func:`predict_split` runs one or more models (the members of a deep ensemble, or one run)
over a split batch by batch; ``ctrcal evaluate`` (:func:`predict_probs`), the validation of
every epoch (:func:`predict_logits` and the labels) and the shift report call it. The shift is
applied once per batch where the batch lives (before it moves to the model's device), so a
seeded shift draws the same noise whatever device the model runs on, and every member and
every MC pass sees the same shifted rows. Per row it returns the mean click probability over
all members × passes and, when there is more than one sample, their standard deviation (the
predictive std whose AUROC at telling shifted from clean rows the report measures).

Stochastic passes come from the model's own layers:

* MC-LayerNorm (any module with an ``mc_sampling`` flag, :func:`ctrcal.layers.mc_layernorm.
  module.mc_mode`) keeps sampling its subsets;
* MC-Dropout: every ``nn.Dropout`` module of the model, whatever the model, is kept in training
  mode (:func:`dropout_modules`).

The passes of one batch are :func:`ctrcal.layers.mc_layernorm.predict.sample_probabilities`,
the loop :func:`~ctrcal.layers.mc_layernorm.mc_predict` runs too: all passes of a batch as one
forward over its rows repeated ``passes`` times where that fits :data:`MC_FORWARD_BYTES`
(:func:`forward_rows`), and only the layers from the first stochastic one on replayed for the
built-in models (:mod:`ctrcal.models.replay`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.layers.mc_layernorm.module import mc_mode
from ctrcal.layers.mc_layernorm.predict import sample_probabilities
from ctrcal.train.precision import compute_precision

__all__ = [
    "MC_FORWARD_BYTES",
    "Prediction",
    "ShiftedBatches",
    "dropout_modules",
    "ensemble_prediction",
    "forward_rows",
    "iter_batches",
    "mc_dropout",
    "predict_logits",
    "predict_probs",
    "predict_split",
]

NumericTransform = Callable[[torch.Tensor], torch.Tensor]

MC_FORWARD_BYTES = {"cpu": 256 << 20, "cuda": None}
"""Most bytes the activations of one forward of MC passes may take, by :func:`forward_rows`'s
bound, per device type: a batch's passes run as one forward where they fit, as several
otherwise. On the CPU a larger forward runs slower per row, not faster: its activations leave
the caches (10 passes of 16384 rows of a BARS-sized MaskNet as one forward cost 1.3-1.5x the
same passes one by one on a shared 2-core Xeon). On a GPU (None): a quarter of the free
memory."""


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


@dataclass(frozen=True)
class ShiftedBatches:
    """A split's batches with a shift applied, drawn once and kept for several predictions.

    :func:`predict_split` reads them as they are: the same batches (and so the same numbers) as
    it would draw from the split and the shift itself, without drawing the shift or copying the
    rows again for every model that predicts them.

    Attributes:
        batches: the shifted batches in row order (labels kept).
        rows: one [B] bool tensor per batch, True = the shift acted on the row.
        batch_size: rows per batch they were cut into.
    """

    batches: list[Batch]
    rows: list[torch.Tensor]
    batch_size: int

    @classmethod
    def of(cls, data: Any, batch_size: int, shift: Any = None) -> ShiftedBatches:
        """The batches of ``data`` (a split or a Batch) of ``batch_size`` rows, each shifted by
        ``shift`` (``apply(batch) -> (batch, rows)``) when given."""
        pairs = list(_shifted_batches(data, batch_size, shift))
        return cls([b for b, _ in pairs], [r for _, r in pairs], batch_size)

    @property
    def nbytes(self) -> int:
        """Bytes their tensors hold."""
        tensors = [t for b in self.batches for t in (b.categorical, b.numeric, b.label)]
        tensors += self.rows
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _shifted_batches(
    data: Any, batch_size: int, shift: Any
) -> Iterator[tuple[Batch, torch.Tensor]]:
    """(batch, rows the shift acted on) in row order: from kept :class:`ShiftedBatches`, or
    drawn from a split or a Batch with ``shift`` applied to each batch."""
    if isinstance(data, ShiftedBatches):
        if shift is not None or batch_size != data.batch_size:
            raise ValueError(
                f"ShiftedBatches are already shifted and cut into {data.batch_size} rows: "
                f"predict them with shift=None and batch_size={data.batch_size}"
            )
        yield from zip(data.batches, data.rows, strict=True)
        return
    for batch in iter_batches(data, batch_size):
        rows = torch.ones(len(batch), dtype=torch.bool)
        if shift is not None:
            batch, rows = shift.apply(batch)
        yield batch, rows


@dataclass
class Prediction:
    """Predictions on a split (row order), on the host.

    Attributes:
        probs: [n] float64 click probabilities (mean over members and passes).
        logits: [n] float64 logits of a single deterministic prediction, else None.
        std: [n] float64 per-row std of the probability over samples, or None (one sample).
        rows: [n] bool, True = the shift acted on the row.
        labels: [n] float32 labels as the split stores them (NaN where unlabelled).
    """

    probs: np.ndarray
    logits: np.ndarray | None
    std: np.ndarray | None
    rows: np.ndarray
    labels: np.ndarray


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


def forward_rows(model: nn.Module, rows: int, device: torch.device) -> int:
    """Most rows in one forward of MC passes over a batch of ``rows`` on ``device``: its
    :data:`MC_FORWARD_BYTES` over a bound of a row's activations, and at least the batch (one
    pass).

    The bound counts every linear layer's output and the embedding once, as if all were held
    at the same time (a forward without autograd frees most of them as it goes)."""
    budget = MC_FORWARD_BYTES.get(device.type, MC_FORWARD_BYTES["cpu"])
    if budget is None:
        budget = torch.cuda.mem_get_info(device)[0] // 4
    widths = sum(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    widths += int(getattr(getattr(model, "embedding", None), "output_dim", 0))
    param = next(model.parameters(), None)
    size = param.element_size() if param is not None else 4
    return max(rows, budget // max(1, size * widths))


@torch.no_grad()
def predict_split(
    models: Sequence[nn.Module],
    data: Any,
    *,
    batch_size: int,
    device: Any = None,
    shift: Any = None,
    mc_samples: int = 0,
    mc_dropout_on: bool = False,
    precision: torch.dtype | None = None,
) -> Prediction:
    """Predict a split with one model or an ensemble, optionally shifted and with MC passes.

    Args:
        models: the runs to average (one = a single model), on ``device``; they run in eval
            mode (each one's training flag is restored afterwards).
        data: a :class:`~ctrcal.data.loader.ParquetCTRData`, a Batch, or
            :class:`ShiftedBatches` (then ``shift`` is None and ``batch_size`` theirs).
        batch_size: rows per batch.
        device: where the models run (default: the device of the first one's parameters).
        shift: ``apply(batch) -> (batch, rows [B] bool)`` applied to every batch, e.g. a shift
            from :func:`~ctrcal.shifts.registry.create_shift`, or None.
        mc_samples: passes per model with the stochastic layers on (0 = one deterministic pass).
        mc_dropout_on: keep dropout sampling during the passes (MC-Dropout).
        precision: the dtype the models compute in (``torch.bfloat16``: autocast, as the run
            was trained, :mod:`ctrcal.train.precision`); None: float32.

    Returns:
        :class:`Prediction`; ``logits`` only for a single deterministic model, ``std`` whenever
        there is more than one sample per row.
    """
    if not models:
        raise ValueError("predict_split needs at least one model")
    if device is None:
        param = next(models[0].parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    device = torch.device(device)
    passes = max(1, int(mc_samples))
    stochastic = mc_samples > 0
    single = len(models) == 1 and not stochastic
    means, stds, logits, masks, labels = [], [], [], [], []
    with contextlib.ExitStack() as stack:
        for m in models:
            stack.callback(m.train, m.training)
            m.eval()
            if stochastic:
                stack.enter_context(mc_mode(m))
                if mc_dropout_on:
                    stack.enter_context(mc_dropout(m))
        stack.enter_context(compute_precision(precision, device.type))
        for batch, rows in _shifted_batches(data, batch_size, shift):
            masks.append(rows.cpu())
            label = batch.label
            labels.append(
                torch.full((len(batch),), torch.nan) if label is None else label.float().cpu()
            )
            inputs = batch.inputs().to(device, non_blocking=True)
            if single:
                z = models[0](inputs).float().reshape(-1)
                logits.append(z.double().cpu())
                means.append(torch.sigmoid(z).double().cpu())
                continue
            limit = forward_rows(models[0], len(inputs), device) if stochastic else None
            p = torch.cat([sample_probabilities(m, [inputs], passes, limit) for m in models])
            std, mean = _spread(p)
            means.append(mean.cpu())
            stds.append(std.cpu())
    return Prediction(
        probs=torch.cat(means).numpy() if means else np.zeros(0),
        logits=(torch.cat(logits).numpy() if logits else np.zeros(0)) if single else None,
        std=torch.cat(stds).numpy() if stds else None,
        rows=torch.cat(masks).numpy() if masks else np.zeros(0, dtype=bool),
        labels=torch.cat(labels).numpy() if labels else np.zeros(0, dtype=np.float32),
    )


def _spread(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row std and mean ``([B], [B])`` float64 of samples ``p`` [S, B] float32."""
    return torch.std_mean(p.double(), dim=0, correction=0)


def ensemble_prediction(members: Sequence[Prediction], batch_size: int) -> Prediction:
    """The one-shot prediction of a deep ensemble from its members' one-shot predictions.

    The numbers :func:`predict_split` gives the members together (bit for bit: each member's
    float32 probabilities, spread per batch of ``batch_size`` rows), for a caller that has the
    members' own predictions already and need not run the models again.

    Args:
        members: one-shot predictions of single models (``logits`` set) on the same batches.
        batch_size: the rows per batch they were predicted in.
    """
    if len(members) < 2 or any(m.logits is None for m in members):
        raise ValueError("ensemble_prediction needs the one-shot predictions of 2+ single models")
    # a member's probs are its float32 sigmoids widened to float64: narrowing is exact
    p = torch.from_numpy(np.stack([m.probs for m in members])).float()
    means, stds = [], []
    for start in range(0, p.shape[1], batch_size):
        std, mean = _spread(p[:, start : start + batch_size].contiguous())
        means.append(mean)
        stds.append(std)
    first = members[0]
    return Prediction(
        probs=torch.cat(means).numpy() if means else np.zeros(0),
        logits=None,
        std=torch.cat(stds).numpy() if stds else None,
        rows=first.rows,
        labels=first.labels,
    )


@dataclass(frozen=True)
class _NumericShift:
    """A ``numeric [B, Fn] -> numeric`` transform as a shift of every row."""

    transform: NumericTransform

    def apply(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        moved = Batch(batch.categorical, self.transform(batch.numeric), batch.label)
        return moved, torch.ones(len(batch), dtype=torch.bool)


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
    shift = None if transform is None else _NumericShift(transform)
    pred = predict_split([model], data, batch_size=batch_size, device=device, shift=shift)
    return torch.from_numpy(pred.logits).float()


def predict_probs(
    model: nn.Module,
    data: Any,
    batch_size: int = 16384,
    device: torch.device | str | None = None,
    transform: NumericTransform | None = None,
    mc_samples: int = 0,
    precision: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Click probabilities and labels ``([N], [N])`` float32; ``mc_samples > 0`` averages that
    many MC passes, ``precision`` as in :func:`predict_split`."""
    shift = None if transform is None else _NumericShift(transform)
    pred = predict_split(
        [model],
        data,
        batch_size=batch_size,
        device=device,
        shift=shift,
        mc_samples=mc_samples,
        precision=precision,
    )
    return torch.from_numpy(pred.probs).float(), torch.from_numpy(pred.labels)
