"""ctrcal: calibrated click-through-rate prediction that stays trustworthy under data shift.

The public API is importable from the top level; modules load on first use, so that
``import ctrcal`` (and the CLI's config checks) stay fast and torch-free until needed::

    import ctrcal
    norm = ctrcal.create_norm("mclayernorm", 400, fraction=0.8)
    n = ctrcal.replace_norms(my_model, "mclayernorm", fraction=0.8)
    shifted = ctrcal.GaussianShift(stds, intensity=0.25, seed=0)(numeric)
    ctrcal.metrics.ece(probs, labels)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
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
    "build_model": "ctrcal.models.masknet",
    "DCNv2": "ctrcal.models.dcnv2",
    "DNN": "ctrcal.models.dnn",
    "register_model": "ctrcal.models.registry",
    "create_model": "ctrcal.models.build",
    "available_models": "ctrcal.models.registry",
    "ContextNorm": "ctrcal.layers.context",
    "bind_contexts": "ctrcal.layers.context",
    "FeatureGroupNorm": "ctrcal.layers.norms",
    # training and prediction (the loop itself is ctrcal.train.trainer.train)
    "load_run": "ctrcal.train.trainer",
    "predict_logits": "ctrcal.train.predict",
    "shift_report": "ctrcal.eval.api",
    "ShiftReportSummary": "ctrcal.eval.api",
    # data
    "Batch": "ctrcal.data.loader",
    "FeaturePipeline": "ctrcal.data.features",
    "read_criteo": "ctrcal.data.criteo",
    # evaluation
    "GaussianShift": "ctrcal.eval.shift",
    "create_shift": "ctrcal.eval.shifts",
    "register_shift": "ctrcal.eval.shifts",
    "available_shifts": "ctrcal.eval.shifts",
    "TemperatureScaling": "ctrcal.eval.calibration",
    "PlattScaling": "ctrcal.eval.calibration",
    "IsotonicCalibration": "ctrcal.eval.calibration",
    "FieldAwareCalibration": "ctrcal.eval.field_aware",
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
    "load_config": "ctrcal.config",
}
_SUBMODULES = {"metrics": "ctrcal.eval.metrics"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ctrcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
