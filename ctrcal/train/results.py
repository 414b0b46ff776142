"""A run's outcome (:class:`TrainResult`, ``result.json``) and its model, read back.

The file names are :mod:`ctrcal.train.runs`'s; the checkpoint format is
:mod:`ctrcal.train.checkpoint`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from ctrcal.config import Config
from ctrcal.core.errors import CtrcalError
from ctrcal.core.utils import json_dumps, write_json_atomic, write_text_atomic
from ctrcal.data.feature_map import FEATURE_MAP_FILE
from ctrcal.train.runs import METRICS_FILE, RESULT_FILE, load_run_config, require_run_dir

__all__ = [
    "OpenRun",
    "Run",
    "TrainResult",
    "load_run",
    "open_run",
    "read_result",
    "run_precision",
    "write_history",
    "write_result",
]


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
        monitor: the validation score that chose the best epoch (``train.monitor``, or
            ``logloss`` where the validation AUC is undefined, see ``monitor_note``).
        monitor_note: why ``monitor`` is not ``train.monitor``; None when it is.
        epoch_choice: one sentence when the chosen epoch's validation logloss or ECE is worse
            than another epoch's (the trade-off the monitor made); None otherwise.
        precision: what ``train.precision`` resolved to, ``fp32`` or ``bf16``: the arithmetic
            every later scoring of the run (``evaluate``, ``predict``, the shift report)
            computes in, so none of them probes again.

    Every epoch's validation AUC, logloss, ECE and PCOC are in ``history`` (``valid_*``);
    ``result.json`` writes an undefined one as ``null``.
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
    monitor: str = ""
    monitor_note: str | None = None
    epoch_choice: str | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.epoch_choice is None:
            self.epoch_choice = epoch_tradeoff(self.history, self.best_epoch, self.monitor)

    def describe(self) -> str:
        """The command line's last lines: every epoch's validation metrics, then the kept
        epoch's, the test split's, and the trade-off the monitor made, if any."""
        lines = [
            f"run {self.run_dir}: {self.epochs_completed} epochs"
            + (" (stopped early)" if self.stopped_early else "")
            + f", best epoch {self.best_epoch}, {self.train_rows_per_s:,.0f} training rows/s",
        ]
        if self.history:
            lines += epoch_table(self.history, self.best_epoch)
        if self.valid:
            lines.append(
                f"valid: AUC {_num(self.valid.get('auc'))}  logloss "
                f"{_num(self.valid.get('logloss'))}"
            )
        if self.test:
            lines.append(
                f"test:  AUC {_num(self.test.get('auc'))}  logloss "
                f"{_num(self.test.get('logloss'))}  ECE {_num(self.test.get('ece'))}  PCOC "
                f"{_num(self.test.get('pcoc'))}"
            )
        if self.oracle:
            lines.append(
                f"oracle (true probabilities on test): AUC {_num(self.oracle.get('auc'))}  "
                f"logloss {_num(self.oracle.get('logloss'))}"
            )
        if self.monitor_note:
            lines.append(f"note: {self.monitor_note}")
        if self.epoch_choice:
            lines.append(f"note: {self.epoch_choice}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("model")
        out["run_dir"] = str(self.run_dir)
        return out


def _num(value: Any, digits: int = 4) -> str:
    """A metric for the terminal; an undefined one (None, NaN) is ``n/a``."""
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    return f"{float(value):.{digits}f}"


def epoch_table(history: list[dict[str, Any]], best_epoch: int) -> list[str]:
    """One line per epoch: validation AUC, logloss, ECE, PCOC; ``*`` marks the kept one."""
    lines = ["epoch  valid AUC  logloss   ECE      PCOC"]
    for h in history:
        mark = "*" if h.get("epoch") == best_epoch else " "
        lines.append(
            f"{mark}{h.get('epoch', '?'):>4}  {_num(h.get('valid_auc')):>9}  "
            f"{_num(h.get('valid_logloss')):>7}  {_num(h.get('valid_ece')):>7}  "
            f"{_num(h.get('valid_pcoc')):>6}"
        )
    return lines


def epoch_tradeoff(history: list[dict[str, Any]], best_epoch: int, monitor: str) -> str | None:
    """One sentence when the kept epoch's validation logloss or ECE is worse than another
    epoch's (strictly: the numbers are given, the reader judges the size); else None.

    Selecting by AUC can keep a worse calibrated epoch: a calibration toolkit shows it.
    """
    by_epoch = {h.get("epoch"): h for h in history}
    kept = by_epoch.get(best_epoch)
    if kept is None:
        return None
    parts = []
    for key, name in (("valid_logloss", "logloss"), ("valid_ece", "ECE")):
        mine = kept.get(key)
        others = [
            (h[key], h["epoch"])
            for h in history
            if _finite(h.get(key)) and h.get("epoch") != best_epoch
        ]
        if not _finite(mine) or not others:
            continue
        value, epoch = min(others)
        if value < mine:
            a, b = _num(mine), _num(value)
            if a == b:
                a, b = f"{mine:.6g}", f"{value:.6g}"
            parts.append(f"{name} {a} is worse than epoch {epoch}'s {b}")
    if not parts:
        return None
    return (
        f"{f'train.monitor {monitor}' if monitor else 'the monitored metric'} kept epoch "
        f"{best_epoch}, whose validation " + " and whose ".join(parts)
    )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def read_result(run_dir: str | Path) -> TrainResult:
    """The :class:`TrainResult` of a finished run (from ``result.json``; no model)."""
    path = Path(run_dir) / RESULT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CtrcalError(f"{path}: the run has not finished (no result.json)") from None
    except (OSError, ValueError) as exc:
        raise CtrcalError(f"{path}: unreadable ({exc}); resume the run to write it again") from None
    data["run_dir"] = Path(run_dir)
    return TrainResult(**data)


class Run(NamedTuple):
    """A trained run read back by :func:`load_run` (unpacks as ``model, config, fm``).

    Attributes:
        model: the best model, on the CPU, in eval mode: ``model(batch)`` returns logits
            ``[B]``.
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


class OpenRun(NamedTuple):
    """A run opened to score data with (:func:`open_run`).

    Attributes:
        run_dir: the run directory.
        data_dir: the prepared directory it scores (the run's own, or ``--data``).
        data: the :class:`~ctrcal.data.feature_map.FeatureMap` of ``data_dir`` (the run's
            feature identity: same vocabularies, transforms and schema).
        model: the best model, in eval mode, on ``device``: ``model(batch)`` returns logits
            ``[B]``.
        config: the run's validated config snapshot.
        device: where the model is.
        precision: the autocast dtype the run was trained and scored in (``torch.bfloat16``),
            or None for float32 (:func:`run_precision`).
    """

    run_dir: Path
    data_dir: Path
    data: Any
    model: nn.Module
    config: Config
    device: Any
    precision: Any = None


def open_run(
    run_dir: str | Path,
    what: str,
    data_dir: str | Path | None = None,
    *,
    device: str = "cpu",
    mc_samples: int = 0,
    check: Callable[[Path, Any], None] | None = None,
) -> OpenRun:
    """Open a run to score data with: the one route of ``evaluate``, ``predict`` and ``export``.

    In order, each before anything heavier: the run directory and its best checkpoint, the
    prepared directory (``data_dir``, else the run's own), that directory's feature identity
    against the run's, the caller's own ``check``; then the model is built and loaded (the
    caller's RNG state is left as it was: building draws initial weights) and moved to
    ``device``.

    Args:
        run_dir: a run directory written by :func:`~ctrcal.train.trainer.train`.
        what: the command, for messages (``"evaluate"``).
        data_dir: the prepared directory to score (default: the one the run was trained on).
        device: ``auto``, ``cpu``, ``cuda``, ...
        mc_samples: > 0 requires a model with MC-LayerNorm layers (MC passes of a model
            without them would all be equal).
        check: ``check(data_dir, feature_map)``, called before the model is loaded (an empty
            split, a missing file).

    Raises:
        CtrcalError: no run or no checkpoint; DataError: data gone, moved or of another
            feature map; ConfigError: ``mc_samples`` on a model without MC-LayerNorm.
    """
    import torch

    from ctrcal.core.devices import resolve_device
    from ctrcal.core.errors import ConfigError
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.layers.mc_layernorm.module import has_mc_layers
    from ctrcal.train.runs import check_same_features, run_data

    run_dir = require_run_dir(run_dir)
    data_dir = run_data(run_dir, data_dir)
    check_same_features(run_dir, data_dir, what)
    data = FeatureMap.load(data_dir)
    if check is not None:
        check(data_dir, data)
    dev = resolve_device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        model, cfg, _ = load_run(run_dir)
    if mc_samples > 0 and not has_mc_layers(model):
        raise ConfigError(
            f"{run_dir}: its model has no MC-LayerNorm layer, so MC passes would all be equal; "
            "drop --mc-samples (mc_samples) or use a run trained with mclayernorm"
        )
    precision = run_precision(run_dir, cfg, dev)
    return OpenRun(run_dir, data_dir, data, model.to(dev).eval(), cfg, dev, precision)


def run_precision(run_dir: str | Path, cfg: Config, device: Any) -> Any:
    """The autocast dtype a run is scored in: the precision its training resolved to, as
    ``result.json`` records it; for a run without that record (unfinished, or written before
    it existed), ``train.precision`` resolved without the start-up probe (``auto`` is
    float32 on a CPU, bf16 on CUDA).

    Returns:
        ``torch.bfloat16``, or None for float32.
    """
    import torch

    from ctrcal.train.precision import resolve_precision

    try:
        recorded = json.loads((Path(run_dir) / RESULT_FILE).read_text()).get("precision")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded in ("fp32", "bf16"):
        return torch.bfloat16 if recorded == "bf16" else None
    return resolve_precision(cfg.train.precision, device)


def write_result(run_dir: Path, result: TrainResult) -> None:
    """``result.json``: written last, its presence marks the run finished."""
    write_json_atomic(Path(run_dir) / RESULT_FILE, result.to_json())


def write_history(run_dir: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.jsonl``: one line per finished epoch (rewritten whole, atomically); an
    undefined metric is ``null``."""
    write_text_atomic(Path(run_dir) / METRICS_FILE, "".join(json_dumps(h) + "\n" for h in history))
