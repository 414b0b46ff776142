"""Scoring: the validation score that drives the schedule, and a run's metrics on a split."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ctrcal.core.errors import DataError

__all__ = [
    "EPOCH_METRICS",
    "evaluate_run",
    "monitor_value",
    "score_split",
    "training_monitor",
    "valid_metrics",
]

EPOCH_METRICS = ("auc", "logloss", "ece", "pcoc")  # validation metrics kept for every epoch


def monitor_value(name: str, auc: float, logloss: float) -> float:
    """``train.monitor`` as a score to maximise (a NaN score counts as the worst)."""
    value = {"auc": auc, "logloss": -logloss, "auc_logloss": auc - logloss}[name]
    return value if math.isfinite(value) else -math.inf


def training_monitor(name: str, feature_map: Any, data_dir: Any) -> tuple[str, str | None]:
    """The validation score training selects epochs by, and why when it is not ``name``.

    The AUC of a split with a single class is undefined: with ``train.monitor`` ``auc`` or
    ``auc_logloss`` on such a validation split no epoch would ever count as best. Training
    then monitors ``logloss`` instead and says so (returned as the second element).
    """
    rate = ((feature_map.splits or {}).get("valid") or {}).get("positive_rate")
    if name == "logloss" or rate not in (0.0, 1.0):
        return name, None
    what = "no clicks" if rate == 0 else "only clicks"
    return "logloss", (
        f"{data_dir}/valid has {what}, so its AUC is undefined: train.monitor {name} falls "
        "back to logloss (set train.monitor: logloss to say so, or prepare a validation split "
        "with both classes)"
    )


def valid_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """:data:`EPOCH_METRICS` of logits [N] against labels [N]; NaN where undefined (the AUC
    of a single class, the PCOC of a split without a click)."""
    from ctrcal.metrics import auc, ece, logloss, pcoc

    probs = torch.sigmoid(logits)
    return {
        "auc": float(auc(probs, labels)),
        "logloss": float(logloss(probs, labels)),
        "ece": float(ece(probs, labels)),
        "pcoc": float(pcoc(probs, labels)),
    }


def score_split(
    model: Any,
    data: Any,
    batch_size: int,
    device: torch.device,
    mc_samples: int = 0,
    precision: torch.dtype | None = None,
) -> dict[str, float]:
    """All metrics (:func:`ctrcal.metrics.compute_all`) of ``model`` on a split, computed in
    ``precision`` (:func:`ctrcal.train.predict.predict_split`)."""
    from ctrcal.metrics import compute_all
    from ctrcal.train.predict import predict_probs

    probs, labels = predict_probs(
        model, data, batch_size, device, mc_samples=mc_samples, precision=precision
    )
    if torch.isnan(labels).any():  # a partly labelled split: never score NaN labels
        raise DataError("the split has rows without labels; it cannot be scored")
    return compute_all(probs, labels)


DEFAULT_MC_SEED = 0


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    data_dir: str | Path | None = None,
    mc_samples: int = 0,
    device: str = "auto",
    batch_size: int | None = None,
    seed: int = DEFAULT_MC_SEED,
) -> dict[str, float]:
    """All metrics (:func:`ctrcal.metrics.compute_all`) of a run's best model on a split.

    Args:
        run_dir: a run directory written by :func:`~ctrcal.train.trainer.train`.
        split: ``train``, ``valid`` or ``test``.
        data_dir: the prepared directory (default: the one the run was trained on); its
            feature identity (vocabularies, transforms, schema) must be the run's.
        mc_samples: > 0 averages that many MC-LayerNorm sampling passes per row.
            One-shot and MC passes compute in the precision the run was trained in
            (:func:`ctrcal.train.results.run_precision`).
        device: ``auto``, ``cpu``, ``cuda``, ...
        batch_size: rows per pass (default: the run's ``train.eval_batch_size``).
        seed: seeds the MC passes' subsets, so the same call gives the same numbers bit for
            bit (on one device and thread count); the caller's RNG state is left as it was.

    Raises:
        DataError: the data is encoded with another feature map than the run's, has moved,
            or the split has no labels (checked before the model is loaded).
    """
    from ctrcal.train.results import open_run
    from ctrcal.train.splits import open_split, require_labelled, resolve_data_mode

    def labelled(data_dir: Path, feature_map: Any) -> None:
        require_labelled(feature_map, split, data_dir, "evaluate")

    run = open_run(
        run_dir, "evaluate", data_dir, device=device, mc_samples=mc_samples, check=labelled
    )
    dev = run.device
    # the MC passes are seeded: the caller's RNG is left as it was
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        mode = resolve_data_mode(run.config.train.data_mode, dev, run.data)
        data = open_split(run.data_dir, split, mode, dev)
        torch.manual_seed(seed)
        batch_size = batch_size or run.config.train.eval_batch_size
        return score_split(run.model, data, batch_size, dev, mc_samples, run.precision)
