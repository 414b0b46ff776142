"""The Python wrappers of the jobs: check the config (:mod:`ctrcal.validate`), then run the job.

``ctrcal.prepare``, ``ctrcal.train`` and ``ctrcal.shift_report`` are these functions; the jobs
below them (:func:`ctrcal.preparation.prepare.prepare`, :func:`ctrcal.train.trainer.train`,
:func:`ctrcal.reports.shift.report.run_shift_report`) take a config that is already valid.
``shift_report`` runs the whole shift-robustness protocol from Python, for notebooks: same
protocol as ``ctrcal run CONFIG`` (prepare if needed, train every variant and seed or reuse
finished runs, evaluate the shift grid, write the report), with the model given as a Python
object if wanted::

    import ctrcal
    summary = ctrcal.shift_report("configs/demo.yaml", model=MyModel, model_kwargs={"hidden": 64})
    summary.verdict
    summary.table          # one row per variant x intensity x metric (mean, SE, ...)
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ctrcal.config import Config, ModelConfig
from ctrcal.config.load import config_from_dict
from ctrcal.core.errors import ConfigError
from ctrcal.validate import load_config, validate_config

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ctrcal.preparation.result import PrepareResult
    from ctrcal.train.results import TrainResult

__all__ = ["ShiftReportSummary", "prepare", "shift_report", "train"]


def prepare(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]] | None,
    out_dir: str | Path,
    cfg: Config | None = None,
    on_bad_row: str | None = None,
    *,
    resplit: bool = False,
    force: bool = False,
    chunk_bytes: int | None = None,
    threads: int | None = None,
) -> PrepareResult:
    """Prepare raw data by ``cfg``'s ``data`` and ``features`` sections (defaults if None).

    The arguments are those of :func:`ctrcal.preparation.prepare.prepare`, which takes the
    two sections themselves.
    """
    from ctrcal.preparation.prepare import prepare as prepare_sections

    cfg = cfg if cfg is not None else Config()
    return prepare_sections(
        inputs,
        out_dir,
        cfg.data,
        cfg.features,
        on_bad_row,
        resplit=resplit,
        force=force,
        chunk_bytes=chunk_bytes,
        threads=threads,
    )


def train(
    cfg: Config, data_dir: str | Path, run_dir: str | Path, resume: bool = False
) -> TrainResult:
    """Check ``cfg`` as a run's config (every check but the report's), then
    :func:`ctrcal.train.trainer.train` it (same arguments, same result).

    Raises:
        ConfigError: every problem of ``cfg`` at once, before anything is written.
    """
    from ctrcal.train.trainer import train as train_run

    # a Config built in Python skipped load_config's checks; the report section is not the run's
    validate_config(cfg, skip=("report",))
    return train_run(cfg, data_dir, run_dir, resume)


@dataclass
class ShiftReportSummary:
    """What :func:`shift_report` returns: the report's ``summary.json``, ready to use.

    Attributes:
        out_dir: the report directory (``report.md``, ``results.csv``, figures, ``runs/``).
        verdict: the report's verdict: one sentence saying what survives the correction.
        table: mean / standard error per variant, intensity and metric.
        paired: paired differences against the baseline (with p-values and significance).
        data: the whole ``summary.json`` mapping.
        paths: the files written (:class:`~ctrcal.reports.shift.render.ReportPaths`).
    """

    out_dir: Path
    verdict: str
    table: pd.DataFrame
    paired: pd.DataFrame
    data: dict[str, Any]
    paths: Any


def _model_config(model: Any, model_kwargs: dict[str, Any] | None) -> ModelConfig:
    """A ModelConfig naming ``model`` so that a saved run can rebuild it."""
    from ctrcal.models.registry import qualified_name, register_model, resolve_model

    kwargs = dict(model_kwargs or {})
    if isinstance(model, ModelConfig):
        return model.replace(**kwargs) if kwargs else model
    if isinstance(model, dict):
        spec = dict(model)
        name = spec.pop("name", None)
        if not isinstance(name, str):
            raise ConfigError("model: a mapping needs 'name: <model or package.module:Class>'")
        return ModelConfig(name, **spec, **kwargs)
    if isinstance(model, str):
        resolve_model(model)  # unknown names and bad import paths fail here
        return ModelConfig(model, **kwargs)
    entry = resolve_model(model)  # a class or factory: not an nn.Module class fails here
    path = qualified_name(model)
    if _importable(path, model):  # an import path: every process (and later session) can load
        return ModelConfig(path, **kwargs)
    if ":" not in entry.name:  # registered already
        return ModelConfig(entry.name, **kwargs)
    # defined where no other process can import it (a notebook's __main__): register it in
    # this process; runs trained here can be read back here
    key = "".join(ch for ch in getattr(model, "__qualname__", "model") if ch.isalnum() or ch == "_")
    register_model(key, model, overwrite=True)
    return ModelConfig(key, **kwargs)


def _importable(path: str, obj: Any) -> bool:
    module_name, _, attr = path.partition(":")
    if module_name == "__main__":
        return False
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return False
    return target is obj


def shift_report(
    config_or_path: str | Path | Config | dict[str, Any],
    model: Any = None,
    *,
    model_kwargs: dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    seeds: int | None = None,
    workers: int | None = None,
    devices: str | list[str] | None = None,
    progress: bool | None = None,
) -> ShiftReportSummary:
    """Run the shift-robustness protocol and return its summary.

    Args:
        config_or_path: a YAML path, a :class:`~ctrcal.config.Config` or a plain mapping.
        model: replaces the config's model: a registered name, an import path
            ``"pkg.mod:Class"``, a mapping ``{name: ..., <kwargs>}``, or a class / factory that
            follows the user-model contract (``Model(feature_map, **kwargs)``,
            ``forward(batch) -> logits [B]``). None keeps the config's ``model:``.
        model_kwargs: the model's keyword arguments (with ``model``).
        out_dir: the report directory (default: the config's ``out_dir``).
        data_dir: prepared data (default: ``data.prepared_dir``, else prepared from ``data:``
            into ``out_dir/data``).
        overrides: ``section.key=value`` strings, as on the command line (for a path).
        seeds, workers, devices: override ``report.seeds`` / ``workers`` / ``devices``.
        progress: progress bars (default: ``train.progress``).

    Returns:
        A :class:`ShiftReportSummary`.

    Raises:
        ConfigError: a bad config or model, before anything trains.
    """
    from ctrcal.reports.shift.report import run_shift_report
    from ctrcal.train.runs import with_model_defaults

    checked = not isinstance(config_or_path, (Config, dict))
    if isinstance(config_or_path, Config):
        cfg = copy.deepcopy(config_or_path)
    elif isinstance(config_or_path, dict):
        cfg = with_model_defaults(config_from_dict(config_or_path, "config"))
    else:
        cfg = load_config(config_or_path, overrides)  # every check
    if model is not None or model_kwargs:
        cfg.model = _model_config(model if model is not None else cfg.model, model_kwargs)
        checked = False
    if not checked:
        validate_config(cfg)  # binds the model's arguments, fills its defaults, plans
    out = Path(out_dir) if out_dir is not None else Path(cfg.out_dir)
    paths = run_shift_report(
        cfg,
        out,
        data_dir,
        seeds=seeds,
        workers=workers,
        devices=devices,
        progress=cfg.train.progress if progress is None else progress,
    )
    data = json.loads(Path(paths.summary_json).read_text())
    return ShiftReportSummary(
        out_dir=out,
        verdict=data.get("verdict", ""),
        table=pd.DataFrame(data.get("summary", [])),
        paired=pd.DataFrame(data.get("paired", [])),
        data=data,
        paths=paths,
    )
