"""A run's outcome (:class:`TrainResult`, ``result.json``) and its model, read back.

The file names are :mod:`ctrcal.runs`'s; the checkpoint format is
:mod:`ctrcal.train.checkpoint`'s.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from ctrcal.config import Config
from ctrcal.errors import CtrcalError
from ctrcal.runs import (
    FEATURE_MAP_FILE,
    METRICS_FILE,
    RESULT_FILE,
    load_run_config,
    require_run_dir,
)
from ctrcal.utils import write_json_atomic, write_text_atomic

__all__ = ["Run", "TrainResult", "load_run", "read_result", "write_history", "write_result"]


@dataclass
class TrainResult:
    """What :func:`train` returns (and writes as ``result.json``, ``model`` excluded).

    Attributes:
        run_dir: the run directory.
        best_epoch: 1-based epoch whose weights were kept (0: no epoch finished).
        epochs_completed: epochs trained in total (resumed runs included).
        stopped_early: whether patience ran out before ``train.epochs``.
        valid: validation metrics of the best epoch (``auc``, ``logloss``, ``monitor``).
        test: metrics of the best weights on the test split (None without one).
        train_rows_per_s: mean training throughput over the epochs of this process.
        history: one dict per epoch (the lines of ``metrics.jsonl``).
        oracle: for synthetic data, the metrics of the true click probabilities on the test
            split (the best any model can do); None otherwise.
        model: the trained model with the best weights, on the training device.
    """

    run_dir: Path
    best_epoch: int
    epochs_completed: int
    stopped_early: bool
    valid: dict[str, float]
    test: dict[str, float] | None
    train_rows_per_s: float
    history: list[dict[str, Any]] = field(default_factory=list)
    oracle: dict[str, float] | None = None
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        """A few lines for the command line."""
        lines = [
            f"run {self.run_dir}: {self.epochs_completed} epochs"
            + (" (stopped early)" if self.stopped_early else "")
            + f", best epoch {self.best_epoch}, {self.train_rows_per_s:,.0f} training rows/s",
        ]
        if self.valid:
            lines.append(f"valid: AUC {self.valid['auc']:.4f}  logloss {self.valid['logloss']:.4f}")
        if self.test:
            lines.append(
                f"test:  AUC {self.test['auc']:.4f}  logloss {self.test['logloss']:.4f}  "
                f"ECE {self.test['ece']:.4f}"
            )
        if self.oracle:
            lines.append(
                f"oracle (true probabilities on test): AUC {self.oracle['auc']:.4f}  "
                f"logloss {self.oracle['logloss']:.4f}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("model")
        out["run_dir"] = str(self.run_dir)
        return out


def read_result(run_dir: str | Path) -> TrainResult:
    """The :class:`TrainResult` of a finished run (from ``result.json``; no model)."""
    path = Path(run_dir) / RESULT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CtrcalError(f"{path}: the run has not finished (no result.json)") from None
    data["run_dir"] = Path(run_dir)
    return TrainResult(**data)


class Run(NamedTuple):
    """A trained run read back by :func:`load_run` (unpacks as ``model, config, fm``).

    Attributes:
        model: the best model, on the CPU, in eval mode: ``model(categorical, numeric)``
            returns logits ``[B]``.
        config: the run's validated config snapshot.
        feature_map: the :class:`~ctrcal.data.feature_map.FeatureMap` it was trained on.
    """

    model: nn.Module
    config: Config
    feature_map: Any


def load_run(run_dir: str | Path) -> Run:
    """The best model of a run (CPU, eval mode), its config and its feature map.

    Works on finished and on interrupted runs (whatever ``checkpoints/best.pt`` holds).
    """
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.models.build import create_model
    from ctrcal.train.checkpoint import load_best

    run_dir = require_run_dir(run_dir)
    cfg = load_run_config(run_dir)
    feature_map = FeatureMap.load(run_dir / FEATURE_MAP_FILE)
    state = load_best(run_dir)
    if state is None:  # checked above; gone since
        raise CtrcalError(f"{run_dir}: no trained weights yet (no best checkpoint)")
    model = create_model(cfg.model, feature_map, check=False)
    model.load_state_dict(state["model"])
    model.eval()
    return Run(model, cfg, feature_map)


def write_result(run_dir: Path, result: TrainResult) -> None:
    """``result.json``: written last, its presence marks the run finished."""
    write_json_atomic(Path(run_dir) / RESULT_FILE, result.to_json())


def write_history(run_dir: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.jsonl``: one line per finished epoch (rewritten whole, atomically)."""
    write_text_atomic(Path(run_dir) / METRICS_FILE, "".join(json.dumps(h) + "\n" for h in history))
