"""Scoring: the validation score that drives the schedule, and a run's metrics on a split."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ctrcal.errors import ConfigError, DataError

__all__ = ["evaluate_run", "monitor_value", "score_split", "valid_metrics"]


def monitor_value(name: str, auc: float, logloss: float) -> float:
    """``train.monitor`` as a score to maximise (a NaN score counts as the worst)."""
    value = {"auc": auc, "logloss": -logloss, "auc_logloss": auc - logloss}[name]
    return value if math.isfinite(value) else -math.inf


def valid_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """``(AUC, logloss)`` of logits [N] against labels [N]."""
    from ctrcal.eval.metrics import auc, logloss

    probs = torch.sigmoid(logits)
    return float(auc(probs, labels)), float(logloss(probs, labels))


def score_split(
    model: Any, data: Any, batch_size: int, device: torch.device, mc_samples: int = 0
) -> dict[str, float]:
    """All metrics (:func:`ctrcal.eval.metrics.compute_all`) of ``model`` on a split."""
    from ctrcal.eval.metrics import compute_all
    from ctrcal.train.predict import predict_probs

    probs, labels = predict_probs(model, data, batch_size, device, mc_samples=mc_samples)
    if torch.isnan(labels).any():  # a partly labelled split: never score NaN labels
        raise DataError("the split has rows without labels; it cannot be scored")
    return compute_all(probs, labels)


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    data_dir: str | Path | None = None,
    mc_samples: int = 0,
    device: str = "auto",
    batch_size: int | None = None,
) -> dict[str, float]:
    """All metrics (:func:`ctrcal.eval.metrics.compute_all`) of a run's best model on a split.

    Args:
        run_dir: a run directory written by :func:`~ctrcal.train.trainer.train`.
        split: ``train``, ``valid`` or ``test``.
        data_dir: the prepared directory (default: the one the run was trained on).
        mc_samples: > 0 averages that many MC-LayerNorm sampling passes per row.
        device: ``auto``, ``cpu``, ``cuda``, ...
        batch_size: rows per pass (default: the run's ``train.eval_batch_size``).

    Raises:
        DataError: the data's feature map is not the run's, or the split has no labels
            (checked before the model is loaded).
    """
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.layers.mc_layernorm import has_mc_layers
    from ctrcal.runs import require_run_dir, run_data_dir
    from ctrcal.train.results import load_run
    from ctrcal.train.splits import open_split, require_labelled, resolve_data_mode
    from ctrcal.utils import resolve_device

    require_run_dir(run_dir)
    data_dir = Path(data_dir) if data_dir is not None else run_data_dir(run_dir)
    current = FeatureMap.load(data_dir)
    require_labelled(current, split, data_dir, "evaluate")
    model, cfg, feature_map = load_run(run_dir)
    if mc_samples > 0 and not has_mc_layers(model):
        raise ConfigError(
            f"{run_dir}: its model has no MC-LayerNorm layer, so MC passes would all be equal; "
            "drop --mc-samples (mc_samples) or evaluate a run trained with mclayernorm"
        )
    if list(current.vocab_sizes) != list(feature_map.vocab_sizes) or list(
        current.numeric_fields
    ) != list(feature_map.numeric_fields):
        raise DataError(f"{data_dir}: its feature map differs from the one {run_dir} used")
    dev = resolve_device(device)
    model.to(dev)
    mode = resolve_data_mode(cfg.train.data_mode, dev, current)
    data = open_split(data_dir, split, mode, dev)
    return score_split(model, data, batch_size or cfg.train.eval_batch_size, dev, mc_samples)
