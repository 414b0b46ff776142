"""MC-LayerNorm: LayerNorm whose statistics come from a random subset of the features.

Each row normalises all its features by the mean and variance of its own uniform random
subset of exactly ``k = max(2, floor(f * N))`` of them while training (and in MC mode at
evaluation); evaluation is plain LayerNorm by default, the paper's one-shot approximation.

One job per module:

=====================  =========================================================================
:mod:`.definition`     the semantics: the formula over a subset mask and the torch sampler
:mod:`.dispatch`       which backend (C, Triton, torch) normalises a call's rows, and running it
:mod:`.functional`     the functional API: :func:`mc_layer_norm`, :func:`mc_grouped_layer_norm`,
                       :func:`grouped_layer_norm`, :func:`sample_subset_mask`
:mod:`.module`         the layer :class:`MCLayerNorm` and :func:`mc_mode` / :func:`set_mc_mode`
:mod:`.predict`        Monte Carlo prediction: the one loop of passes and :func:`mc_predict`
=====================  =========================================================================

The fused kernels sit beside this package: :mod:`ctrcal.layers.mcln_kernel` (C, CPU) and
:mod:`ctrcal.layers.mcln_triton` (Triton). Where a change of MC-LayerNorm's semantics lands:

* the per-row computation (the subset law, the statistics, the affine): three files,
  :mod:`.definition` and the two kernels (``mcln_kernel.c``, ``mcln_triton.py``), which the
  tests hold to :mod:`.definition`'s formula (``mcln_kernel.py`` too if the C kernel's
  arguments change);
* the subset size ``k``: one function, :func:`ctrcal.core.norm_spec.mc_subset_size` (config
  checks share it);
* when the layer samples (training, one-shot, MC mode): :mod:`.module` alone.

Names are loaded on first use: importing one module of the package runs none of the others.

MC-LayerNorm is the subject of a patent application by IBM (US 2025/0094784).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it; loaded on first use, so that importing one
# module of the package (``.module`` imports ``.functional``, ``.dispatch``, ``.definition``)
# never runs the others through this file, and no module imports its own package back
_EXPORTS = {
    "BACKENDS": "ctrcal.layers.mc_layernorm.dispatch",
    "COMPILED_MODES": "ctrcal.layers.mc_layernorm.dispatch",
    "MCLayerNorm": "ctrcal.layers.mc_layernorm.module",
    "compiled_mode": "ctrcal.layers.mc_layernorm.dispatch",
    "grouped_layer_norm": "ctrcal.layers.mc_layernorm.functional",
    "has_mc_layers": "ctrcal.layers.mc_layernorm.module",
    "kernel_available": "ctrcal.layers.mcln_kernel",
    "mc_grouped_layer_norm": "ctrcal.layers.mc_layernorm.functional",
    "mc_layer_norm": "ctrcal.layers.mc_layernorm.functional",
    "mc_mode": "ctrcal.layers.mc_layernorm.module",
    "mc_predict": "ctrcal.layers.mc_layernorm.predict",
    "mc_subset_size": "ctrcal.core.norm_spec",
    "sample_probabilities": "ctrcal.layers.mc_layernorm.predict",
    "sample_subset_mask": "ctrcal.layers.mc_layernorm.functional",
    "set_mc_mode": "ctrcal.layers.mc_layernorm.module",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
