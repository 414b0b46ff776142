"""Noise injection during training: a shift on the training batches, noise on the weights.

Two regularisers of the seed survey (section 7.6), each the baseline MC-LayerNorm is weighed
against under a shift:

* **Input noise** (``train.train_shift``): a registered shift (:mod:`ctrcal.shifts`),
  ``gaussian_numeric`` in either space or ``categorical_corruption``, applied to every
  training batch at one intensity, with fresh noise on every batch. Validation and test
  batches are never shifted (the trainer applies it in its training loop only).
* **Weight noise** (``train.weight_noise`` = η): every step draws ε ~ N(0, η) (variance η,
  std √η) for each dense weight, runs the forward and backward pass at W + ε, restores W
  exactly and only then lets the optimizer step with the gradient taken at W + ε.

Determinism follows the mechanism that already makes dropout masks and MC-LayerNorm subsets
reproducible: torch's global generators, seeded from ``train.seed`` at the start of a run,
captured in ``last.pt`` at the end of every epoch and restored on resume (re-seeded per
(epoch, rank) under DDP). Weight noise draws from them directly; the training shift takes one
seed per epoch from the global CPU generator and draws the epoch's batches from its own
stream. The same seed therefore gives the same noise sequence, and a resumed run continues it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.shifts.registry import create_shift
from ctrcal.train.noise_options import check_noise_options, train_shift_spec

__all__ = ["TrainShift", "perturb_weights", "restore_weights", "weight_noise_std"]

# seeds drawn for the per-epoch shift stream lie in [0, 2**62)
_SEED_HIGH = 2**62


class TrainShift:
    """A registered shift applied to training batches, re-seeded from torch's RNG per epoch.

    Args:
        spec: the :class:`~ctrcal.config.TrainShiftConfig` (checked here).
        feature_map: the feature map of the data trained on.

    Example::

        noise = TrainShift(cfg.train.train_shift, feature_map)
        noise.start_epoch()                  # one seed drawn from torch's global generator
        for batch in batches:
            loss = train_step(ctx, noise(batch))
    """

    def __init__(self, spec: Any, feature_map: Any) -> None:
        check_noise_options(spec, None, "train")
        self.spec = spec
        self._feature_map = feature_map
        self._shift: Any = None
        self.start_epoch(seed=0)  # builds the shift once: a bad feature map fails here

    def start_epoch(self, seed: int | None = None) -> None:
        """Start the epoch's noise stream from ``seed`` (default: drawn from torch's global
        CPU generator, so ``train.seed`` and the checkpointed RNG state decide it)."""
        if seed is None:
            seed = int(torch.randint(0, _SEED_HIGH, (), dtype=torch.int64))
        self._shift = create_shift(
            train_shift_spec(self.spec),
            self._feature_map,
            intensity=float(self.spec.intensity),
            seed=seed,
        )

    def __call__(self, batch: Batch) -> Batch:
        """The shifted copy of a training batch (``batch`` is not modified)."""
        return self._shift(batch)


def weight_noise_std(eta: float) -> float:
    """The std √η of weight noise of variance η."""
    return float(eta) ** 0.5


def perturb_weights(params: list[nn.Parameter], std: float) -> list[torch.Tensor]:
    """Add N(0, std²) to every tensor in ``params`` in place; return the weights it replaced.

    One ``randn_like`` per parameter tensor (torch's global generator on its device), no host
    sync. The returned copies are what :func:`restore_weights` writes back, bit for bit (a
    subtraction of the noise would round).
    """
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p in params:
            p.add_(torch.randn_like(p), alpha=std)
    return saved


def restore_weights(params: list[nn.Parameter], saved: list[torch.Tensor]) -> None:
    """Write the weights saved by :func:`perturb_weights` back (gradients are left as they are)."""
    with torch.no_grad():
        torch._foreach_copy_(params, saved)
