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
:mod:`ctrcal.layers.mcln_triton` (Triton). A change of MC-LayerNorm's semantics touches three
files: :mod:`.definition` and the two kernels (``mcln_kernel.c``, ``mcln_triton.py``), which
the tests hold to :mod:`.definition`'s formula; the subset size ``k`` itself is
:func:`ctrcal.layers.spec.mc_subset_size`.

MC-LayerNorm is the subject of a patent application by IBM (US 2025/0094784).
"""

from ctrcal.layers.mc_layernorm.definition import mc_subset_size
from ctrcal.layers.mc_layernorm.dispatch import BACKENDS, COMPILED_MODES, compiled_mode
from ctrcal.layers.mc_layernorm.functional import (
    grouped_layer_norm,
    mc_grouped_layer_norm,
    mc_layer_norm,
    sample_subset_mask,
)
from ctrcal.layers.mc_layernorm.module import MCLayerNorm, has_mc_layers, mc_mode, set_mc_mode
from ctrcal.layers.mc_layernorm.predict import mc_predict, sample_probabilities
from ctrcal.layers.mcln_kernel import kernel_available

__all__ = [
    "BACKENDS",
    "COMPILED_MODES",
    "MCLayerNorm",
    "compiled_mode",
    "grouped_layer_norm",
    "has_mc_layers",
    "kernel_available",
    "mc_grouped_layer_norm",
    "mc_layer_norm",
    "mc_mode",
    "mc_predict",
    "mc_subset_size",
    "sample_probabilities",
    "sample_subset_mask",
    "set_mc_mode",
]
