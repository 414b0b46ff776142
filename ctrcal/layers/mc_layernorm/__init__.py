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

The fused kernels sit below this package, with the layers' other kernels:
:mod:`ctrcal.layers.kernels.mcln_kernel` (C, CPU) and :mod:`ctrcal.layers.kernels.mcln_triton`
(Triton). Where a change of MC-LayerNorm's semantics lands:

* the per-row computation (the subset law, the statistics, the affine): three files,
  :mod:`.definition` and the two kernels (``mcln_kernel.c``, ``mcln_triton.py``), which the
  tests hold to :mod:`.definition`'s formula (``mcln_kernel.py`` too if the C kernel's
  arguments change);
* the subset size ``k``: one function, :func:`ctrcal.core.norm_spec.mc_subset_size` (config
  checks share it);
* when the layer samples (training, one-shot, MC mode): :mod:`.module` alone.

Each name is imported from the module that defines it (``from
ctrcal.layers.mc_layernorm.module import MCLayerNorm``); this file holds no names, so importing
one module of the package runs none of the others.

MC-LayerNorm is the subject of a patent application by IBM (US 2025/0094784).
"""
