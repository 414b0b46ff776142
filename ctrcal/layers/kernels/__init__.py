"""The fused kernels under the layers, and the rule for when a layer may use one.

=====================  =========================================================================
:mod:`.chunks`         how a C kernel splits a call between threads (``chunks.h``'s Python side)
:mod:`.fusion`         when a stock module may be replaced by a fused CPU kernel
:mod:`.cpu_kernels`    the small CPU kernels of training (``cpu_kernels.c``)
:mod:`.mcln_kernel`    MC-LayerNorm's fused CPU kernel (``mcln_kernel.c``)
:mod:`.mcln_triton`    MC-LayerNorm's Triton kernel (GPU)
=====================  =========================================================================

They import no layer: :mod:`ctrcal.layers.mc_layernorm` and the other layers call them, so
the layers and MC-LayerNorm's package depend on them one way.
"""
