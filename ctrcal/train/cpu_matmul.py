"""Which library runs float32 matrix products on the CPU during training.

PyTorch sends CPU float32 ``mm``/``addmm`` to its BLAS (MKL in the official wheels). On some
processors that is far from the fastest fp32 GEMM available in the same wheel: on an AMD EPYC
(Zen 5) CPU, MKL's sgemm reaches ~90 GFLOP/s per core while
oneDNN's fp32 matmul reaches ~205 GFLOP/s, which makes a MaskNet training step ~1.6x faster.

PyTorch routes fp32 matmuls to oneDNN only when ``torch.backends.mkldnn.matmul.fp32_precision``
allows reduced precision (``"bf16"``). On processors without native bf16 matrix units oneDNN
still computes in float32 then; on processors with them it may round the inputs to bf16. So
:func:`onednn_fp32_is_exact` checks on this machine, once, that products computed that way have
float32 accuracy (relative error ~1e-7, where bf16 inputs would give ~1e-3), and
:func:`cpu_matmul` uses oneDNN only when they do: the arithmetic stays IEEE float32, only the
library (and with it the summation order) changes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

__all__ = ["cpu_matmul", "onednn_fp32_is_exact"]

# float32 products of K=512 terms stay within ~1e-6 of float64 relative to sum |a||b|; inputs
# rounded to bf16 are off by ~1e-3. The threshold sits safely between the two.
_TOLERANCE = 1e-4


def _precision_prop():
    matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    return matmul if matmul is not None and hasattr(matmul, "fp32_precision") else None


@contextlib.contextmanager
def _fp32_precision(value: str) -> Iterator[None]:
    prop = _precision_prop()
    old = prop.fp32_precision
    prop.fp32_precision = value
    try:
        yield
    finally:
        prop.fp32_precision = old


@functools.lru_cache(maxsize=1)
def onednn_fp32_is_exact() -> bool:
    """Whether oneDNN fp32 matmuls on this machine keep float32 accuracy (checked once)."""
    if _precision_prop() is None or not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    # the layouts a training step uses: x @ W^T, g @ W, g^T @ x
    cases = [((600, 512), (512, 300), False), ((512, 600), (512, 300), True)]
    try:
        with _fp32_precision("bf16"):
            for shape_a, shape_b, transpose_a in cases:
                a = torch.randn(*shape_a, generator=gen)
                b = torch.randn(*shape_b, generator=gen)
                lhs = a.t() if transpose_a else a
                out = lhs @ b
                ref = lhs.double() @ b.double()
                scale = lhs.double().abs() @ b.double().abs()
                if ((out.double() - ref).abs() / scale).max().item() > _TOLERANCE:
                    return False
    except (RuntimeError, ValueError):  # an unsupported setting in this build
        return False
    return True


@contextlib.contextmanager
def cpu_matmul(choice: str = "auto") -> Iterator[str]:
    """Run fp32 CPU matmuls in the body with ``choice``; yields the backend actually used.

    Args:
        choice: ``default`` (PyTorch's BLAS), ``onednn`` (oneDNN, only where it keeps float32
            accuracy on this machine, else the default), or ``auto`` (same as ``onednn``).

    The setting is process-global; it is restored when the body exits.
    """
    if choice not in ("auto", "default", "onednn"):
        raise ValueError(f"unknown cpu_matmul {choice!r} (valid: auto, default, onednn)")
    if choice == "default" or not onednn_fp32_is_exact():
        yield "default"
        return
    with _fp32_precision("bf16"):
        yield "onednn"
