"""ctrcal: calibrated click-through-rate prediction that stays trustworthy under data shift.

The public API is importable from the top level; modules load on first use, so that
``import ctrcal`` stays fast and torch-free until needed::

    import ctrcal
    cfg = ctrcal.load_config("configs/demo.yaml", overrides=["train.epochs=2"])
    prepared = ctrcal.prepare(None, "prepared/", cfg)          # synthetic data by default
    result = ctrcal.train(cfg, "prepared/", "runs/demo")
    run = ctrcal.load_run("runs/demo")                         # Run(model, config, feature_map)
    metrics = ctrcal.evaluate("runs/demo", "test", mc_samples=10)
    norm = ctrcal.create_norm("mclayernorm", 400, fraction=0.8)
    ctrcal.metrics.ece(probs, labels)                          # also: import ctrcal.metrics
    ctrcal.export(my_model, example_inputs, "model.onnx", format="onnx")   # or pt2, aoti
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (or (module, name there))
_EXPORTS: dict[str, str | tuple[str, str]] = {
    # normalization layers (ctrcal.layers)
    "MCLayerNorm": "ctrcal.layers.mc_layernorm.module",
    "mc_layer_norm": "ctrcal.layers.mc_layernorm.functional",
    "mc_mode": "ctrcal.layers.mc_layernorm.module",
    "mc_predict": "ctrcal.layers.mc_layernorm.predict",
    "create_norm": "ctrcal.layers.registry",
    "register_norm": "ctrcal.layers.registry",
    "available_norms": "ctrcal.layers.registry",
    "replace_norms": "ctrcal.layers.registry",
    # models
    "MaskNet": "ctrcal.models.masknet",
    "MaskBlock": "ctrcal.layers.mask_block",
    "FeatureEmbedding": "ctrcal.layers.embedding",
    "DCNv2": "ctrcal.models.dcnv2",
    "DNN": "ctrcal.models.dnn",
    "register_model": "ctrcal.models.registry",
    "create_model": "ctrcal.models.build",
    "available_models": "ctrcal.models.registry",
    "ContextNorm": "ctrcal.layers.context",
    "bind_contexts": "ctrcal.layers.context",
    "FeatureGroupNorm": "ctrcal.layers.norms",
    "Batch": "ctrcal.core.batch",
    # the jobs: prepare, train, evaluate, report
    "prepare": "ctrcal.api",
    "evaluate": ("ctrcal.train.evaluate", "evaluate_run"),
    "load_run": "ctrcal.train.results",
    "Run": "ctrcal.train.results",
    "predict_logits": "ctrcal.train.predict",
    "export": ("ctrcal.serving.export", "export_module"),
    "shift_report": "ctrcal.api",
    "ShiftReportSummary": "ctrcal.api",
    # data
    "FeatureMap": "ctrcal.data.feature_map",
    "FeaturePipeline": "ctrcal.preparation.features",
    "DatasetSchema": "ctrcal.data.schema",
    "register_schema": "ctrcal.data.schema",
    # evaluation
    "GaussianShift": "ctrcal.shifts.builtin",
    "CategoricalCorruption": "ctrcal.shifts.builtin",
    "create_shift": "ctrcal.shifts.registry",
    "register_shift": "ctrcal.shifts.registry",
    "available_shifts": "ctrcal.shifts.registry",
    "TemperatureScaling": "ctrcal.calibration.scaling",
    "PlattScaling": "ctrcal.calibration.scaling",
    "IsotonicCalibration": "ctrcal.calibration.isotonic",
    "FieldAwareCalibration": "ctrcal.calibration.field_aware",
    "smooth_ece": "ctrcal.metrics",
    "calibration_slope_intercept": "ctrcal.metrics",
    "bootstrap_ci": "ctrcal.metrics",
    "paired_bootstrap": "ctrcal.metrics",
    "risk_coverage": "ctrcal.metrics",
    "brier_decomposition": "ctrcal.metrics",
    "label_free_estimates": "ctrcal.metrics",
    "worst_segments": "ctrcal.metrics",
    "calibration_over_time": "ctrcal.reports.shift.windows",
    "read_predictions": "ctrcal.reports.calibration.predictions_file",
    "calibration_report": "ctrcal.reports.calibration.report",
    # config
    "Config": "ctrcal.config",
    "ModelConfig": "ctrcal.config",
    "NormSpec": "ctrcal.core.norm_spec",
    "load_config": "ctrcal.validate",
}
_SUBMODULES = {"metrics": "ctrcal.metrics"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "train", "__version__"])


class _TrainJob:
    """``ctrcal.train``: the training job, :func:`ctrcal.api.train`.

    ``ctrcal.train`` also names the training package, and importing any ``ctrcal.train.*``
    module binds that package to the name on ``ctrcal``. This object keeps the name the job's
    while attribute access reaches the package, so ``import ctrcal.train.trainer as t`` and
    ``ctrcal.train.step`` work as for any package.
    """

    def __call__(self, cfg: Any, data_dir: Any, run_dir: Any, resume: bool = False) -> Any:
        return importlib.import_module("ctrcal.api").train(cfg, data_dir, run_dir, resume)

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("ctrcal.train"), name)

    def __repr__(self) -> str:
        return "<the training job ctrcal.train (ctrcal.api.train)>"


class _Ctrcal(types.ModuleType):
    """The ``ctrcal`` module: ``train`` stays the training job when the package is imported."""

    @property
    def train(self) -> _TrainJob:
        return _TRAIN

    @train.setter
    def train(self, value: Any) -> None:
        pass  # the import system binding the subpackage: the name stays the job


_TRAIN = _TrainJob()
sys.modules[__name__].__class__ = _Ctrcal


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name in _EXPORTS:
        target = _EXPORTS[name]
        module, attr = target if isinstance(target, tuple) else (target, name)
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'ctrcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
