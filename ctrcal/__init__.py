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
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (or (module, name there))
_EXPORTS: dict[str, str | tuple[str, str]] = {
    # normalization layers (ctrcal.layers)
    "MCLayerNorm": "ctrcal.layers.mc_layernorm",
    "mc_layer_norm": "ctrcal.layers.mc_layernorm",
    "mc_mode": "ctrcal.layers.mc_layernorm",
    "mc_predict": "ctrcal.layers.mc_layernorm",
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
    "Batch": "ctrcal.batch",
    # the jobs: prepare, train, evaluate, report
    "prepare": "ctrcal.data.prepare",
    "evaluate": ("ctrcal.train.evaluate", "evaluate_run"),
    "load_run": "ctrcal.train.trainer",
    "Run": "ctrcal.train.results",
    "predict_logits": "ctrcal.train.predict",
    "shift_report": "ctrcal.eval.api",
    "ShiftReportSummary": "ctrcal.eval.api",
    # data
    "FeatureMap": "ctrcal.data.feature_map",
    "FeaturePipeline": "ctrcal.data.features",
    "read_criteo": "ctrcal.data.parse",
    "DatasetSchema": "ctrcal.data.schema",
    "register_schema": "ctrcal.data.schema",
    # evaluation
    "GaussianShift": "ctrcal.eval.shifts",
    "CategoricalCorruption": "ctrcal.eval.shifts",
    "create_shift": "ctrcal.eval.shifts",
    "register_shift": "ctrcal.eval.shifts",
    "available_shifts": "ctrcal.eval.shifts",
    "TemperatureScaling": "ctrcal.calibration.scaling",
    "PlattScaling": "ctrcal.calibration.scaling",
    "IsotonicCalibration": "ctrcal.calibration.isotonic",
    "FieldAwareCalibration": "ctrcal.calibration.field_aware",
    "smooth_ece": "ctrcal.eval.smooth_ece",
    "calibration_slope_intercept": "ctrcal.eval.recalibration",
    "bootstrap_ci": "ctrcal.eval.bootstrap",
    "paired_bootstrap": "ctrcal.eval.bootstrap",
    "risk_coverage": "ctrcal.eval.risk_coverage",
    "calibration_over_time": "ctrcal.eval.windows",
    "read_predictions": "ctrcal.predictions_file",
    "calibration_report": "ctrcal.calibration_report",
    # config
    "Config": "ctrcal.config",
    "ModelConfig": "ctrcal.config",
    "NormSpec": "ctrcal.config",
    "load_config": "ctrcal.config_load",
}
# `ctrcal.train` is the training package, callable as the training job (see its docstring)
_SUBMODULES = {"metrics": "ctrcal.metrics", "train": "ctrcal.train"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


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
