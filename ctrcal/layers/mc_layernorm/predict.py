"""Monte Carlo prediction: the one loop of stochastic forward passes, and :func:`mc_predict`.

Eq. 6 of the paper: the predictive probability is the mean of ``sigmoid(logits)`` over
forward passes with the MC layers sampling (probabilities are averaged, not logits).
:func:`sample_probabilities` runs those passes for any model -- a ctrcal model called as
``model(batch)`` with a :class:`~ctrcal.core.batch.Batch`, or any module called with batch-first
tensors -- with the rows repeated along dim 0 so one forward pass yields many samples; it is
the loop of :func:`mc_predict` and of the shift report's predictions
(:func:`ctrcal.train.predict.predict_split`, which adds MC-Dropout and ensembles around it).
Which layers sample is the caller's choice (:func:`~ctrcal.layers.mc_layernorm.module.mc_mode`).

The contract: a model returns **logits** ``[B]`` or ``[B, 1]`` (ctrcal's models do; the sigmoid
is applied here). A model that returns probabilities (FuxiCTR's output activation, for one) is
called with ``outputs="probs"``: its values are averaged as they are, and one outside [0, 1]
is refused. With ``outputs="logits"``, :func:`mc_predict` warns when every output of at least
:data:`PLAUSIBLE_ROWS` rows lies in [0, 1]: for click logits that is implausible, for
probabilities it is what they look like. Inputs are a :class:`~ctrcal.core.batch.Batch`, or
tensors, dicts, tuples or lists of tensors with the batch dimension first (a dict of feature
tensors, as FuxiCTR's models take): every tensor is cut and repeated along its first dim.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ctrcal.core.batch import Batch
from ctrcal.layers.kernels.fusion import unhooked
from ctrcal.layers.mc_layernorm.module import mc_mode

__all__ = ["mc_predict", "sample_probabilities"]

Input = Tensor | Batch | Mapping[str, Any] | Sequence[Any]
OUTPUTS = ("logits", "probs")
PLAUSIBLE_ROWS = 64
"""Rows whose logits all lying in [0, 1] make :func:`mc_predict` warn (chance: ~2^-64)."""


def _rows_of(x: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` applied to every batch-first tensor of ``x`` (a tensor, a Batch, or dicts,
    tuples and lists of them); anything else, a 0-dim tensor included, passes as it is."""
    if isinstance(x, Batch):
        return x.map(fn)
    if isinstance(x, Tensor):
        return fn(x) if x.dim() > 0 else x
    if isinstance(x, Mapping):
        return {k: _rows_of(v, fn) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_rows_of(v, fn) for v in x)
    return x


def _batch_sizes(x: Any) -> list[int]:
    """The first dim of every batch-first tensor of ``x`` (as :func:`_rows_of` walks it)."""
    sizes: list[int] = []

    def note(t: Tensor) -> Tensor:
        sizes.append(int(t.shape[0]))
        return t

    _rows_of(x, note)
    return sizes


def _batch_size(x: Any) -> int:
    sizes = _batch_sizes(x)
    if not sizes:
        raise ValueError(f"MC passes need batch-first tensors, got {type(x).__name__}")
    return sizes[0]


def sample_probabilities(
    model: Callable[..., Tensor],
    inputs: Sequence[Input],
    n_samples: int,
    max_rows: int | None = None,
    outputs: str = "logits",
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
            tensors (or dicts, tuples, lists of them) with the batch dimension B first, all of
            one batch size.
        n_samples: passes per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).
        outputs: ``"logits"`` (the sigmoid is applied) or ``"probs"`` (taken as they are).

    Returns:
        Probabilities ``[n_samples, B]`` in float32.

    Raises:
        ValueError: outputs of another shape, or ``"probs"`` outside [0, 1].
    """
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs: expected one of {OUTPUTS}, got {outputs!r}")
    inputs = [x.inputs() if isinstance(x, Batch) else x for x in inputs]
    batch = _batch_size(inputs[0])
    limit = n_samples * batch if max_rows is None else int(max_rows)
    step = max(1, min(batch, limit))
    replays = _replays(model, inputs, n_samples)
    chunks: list[Tensor] = []
    for start in range(0, batch, step):
        chunk = [_rows_of(x, lambda t, a=start: t[a : a + step]) for x in inputs]
        rows = _batch_size(chunk[0])
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
            if not isinstance(logits, Tensor):
                raise ValueError(
                    f"MC passes expect the model to return a tensor [B] or [B, 1], got "
                    f"{type(logits).__name__}"
                    + (
                        f" with keys {sorted(map(str, logits))}"
                        if isinstance(logits, Mapping)
                        else ""
                    )
                    + "; wrap the model so that its forward returns that tensor"
                )
            if logits.numel() != s * rows:
                raise ValueError(f"MC passes expect logits [B] or [B, 1], got {list(logits.shape)}")
            out = logits.float().reshape(s, rows)
            if outputs == "probs":
                if out.numel() and not bool(((out >= 0) & (out <= 1)).all()):
                    raise ValueError(
                        "outputs='probs': the model returned values outside [0, 1] "
                        f"(min {out.min().item():.4g}, max {out.max().item():.4g}); "
                        "for logits use outputs='logits'"
                    )
                parts.append(out)
            else:
                parts.append(torch.sigmoid(out))
            done += s
        chunks.append(torch.cat(parts, dim=0))
    if not chunks:
        return torch.zeros((n_samples, 0), dtype=torch.float32)
    return torch.cat(chunks, dim=1)


_SIGMOID_1 = 0.731059  # sigmoid(1) = 0.7310586, a hair above for float32 rounding


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
    outputs: str = "logits",
) -> tuple[Tensor, Tensor]:
    """Monte Carlo prediction: mean and std of ``sigmoid(model(*inputs))`` over samples.

    The model runs in eval mode with every MC layer sampling (its training flag is restored
    afterwards); the passes are :func:`sample_probabilities`'s, ``max_rows`` bounding the
    rows of one pass.

    Args:
        model: module returning logits [B] or [B, 1]: a ctrcal model (``model(batch)``) or any
            module whose forward takes batch-first tensors.
        *inputs: a :class:`~ctrcal.core.batch.Batch` for a ctrcal model (its label is not passed
            on), or tensors with the batch dimension first (e.g. ``x`` [B, N]), or dicts,
            tuples or lists of such tensors (e.g. ``{"C1": [B], "I1": [B]}``).
        n_samples: number of MC samples per row (>= 1).
        max_rows: most rows per forward pass (default: all ``n_samples * B`` at once).
        outputs: what the model returns: ``"logits"`` (the contract; the sigmoid is applied
            here, and outputs of at least :data:`PLAUSIBLE_ROWS` rows all in [0, 1] warn) or
            ``"probs"`` (averaged as they are; a value outside [0, 1] raises).

    Returns:
        (mean_prob [B], std_prob [B]) in float32; std is the population std over samples
        (a model without MC layers warns, runs one pass and gets a std of exactly zero).
    """
    if not inputs:
        raise ValueError("mc_predict needs an input: a Batch or batch-first tensors")
    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if max_rows is not None and int(max_rows) < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs: expected one of {OUTPUTS}, got {outputs!r}")
    parts = [(x.categorical, x.numeric) if isinstance(x, Batch) else x for x in inputs]
    sizes = _batch_sizes(parts)
    if not sizes:
        raise ValueError("mc_predict needs batch-first tensors (or a Batch, or dicts of them)")
    if any(n != sizes[0] for n in sizes):
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
                # one pass, so the std is exactly zero: n copies of a row in one batch can
                # differ in the last bit (a matrix product's tail rows take another path)
                n_samples = 1
            p = sample_probabilities(model, inputs, int(n_samples), max_rows, outputs)
    finally:
        model.train(was_training)
    # logits in [0, 1] are probabilities in [0.5, sigmoid(1)]: seen on every row, the model
    # most likely returns probabilities already and they were squashed a second time
    if outputs == "logits" and p.shape[1] >= PLAUSIBLE_ROWS:
        if float(p.min()) >= 0.5 and float(p.max()) <= _SIGMOID_1:
            warnings.warn(
                f"mc_predict: all {p.shape[1]} rows' outputs lie in [0, 1], which looks like "
                "probabilities, not logits; the sigmoid made them 0.5-0.73. If the model "
                "returns probabilities, pass outputs='probs'",
                stacklevel=3,
            )
    std, mean = torch.std_mean(p, dim=0, correction=0)
    return mean, std
