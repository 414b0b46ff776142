"""Which library runs float32 matrix products on the CPU during training.

PyTorch sends CPU float32 ``mm``/``addmm`` to its BLAS (MKL in the official wheels). On some
processors that is far from the fastest fp32 GEMM available in the same wheel: on AMD EPYC
CPUs (Zen 4, Zen 5) MKL's sgemm reaches about half of what oneDNN's fp32 matmul does, which
makes a MaskNet training step up to ~1.6x faster with oneDNN.

PyTorch routes fp32 matmuls to oneDNN only when ``torch.backends.mkldnn.matmul.fp32_precision``
allows reduced precision (``"bf16"``). Whether oneDNN then really rounds the inputs to bf16
depends on the processor (bf16 or AMX units) *and on the kernel oneDNN picks for the shape*,
so no global check can vouch for every product. :func:`cpu_matmul` therefore decides per
product: inside it, every float32 ``mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` signature (op,
shapes, strides, scalars) is checked the first time it runs -- random operands of exactly that
signature, computed with bf16 allowed and with PyTorch's exact float32 path -- and goes to
oneDNN only when the result keeps float32 accuracy; every other product (and every op not in
that list) runs with reduced precision disallowed. The arithmetic stays IEEE float32 for every
product, only the library (and with it the summation order) changes.

The accuracy test: for each output element, ``|reduced - exact|`` divided by the l2 norm of
its K products ``sqrt(sum_k a_ik^2 b_kj^2)``, averaged over the elements. Rounding the inputs
to bf16 gives ~1.3e-3 whatever K is (each product is off by ~2^-9 relative); float32
accumulation stays below ~1e-5 even for K = 65536. The threshold sits between the two.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["cpu_matmul", "keeps_float32", "onednn_fp32_is_exact"]

_TOLERANCE = 1e-4

_aten = torch.ops.aten
_GEMMS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}


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


def _run_reduced(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """``func`` with bf16 precision allowed (oneDNN). The one place that permission is given."""
    with _fp32_precision("bf16"):
        return func(*args, **kwargs)


def _run_exact(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    with _fp32_precision("none"):
        return func(*args, **kwargs)


def keeps_float32(func: Any, args: tuple, kwargs: dict | None = None) -> bool:
    """Whether ``func`` on operands of the signature of ``args`` keeps float32 accuracy with
    bf16 precision allowed (random operands of the same shapes and strides; see the module
    docstring for the test)."""
    kwargs = dict(kwargs or {})
    gen = torch.Generator().manual_seed(0)

    def like(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return out.uniform_(-1.0, 1.0, generator=gen)

    probe = tuple(like(a) for a in args)
    try:
        reduced = _run_reduced(func, probe, kwargs)
        exact = _run_exact(func, probe, kwargs)
        squares = tuple(a.square() if isinstance(a, torch.Tensor) else a for a in probe)
        sq_kwargs = {k: (float(v) ** 2 if k in ("alpha", "beta") else v) for k, v in kwargs.items()}
        l2 = _run_exact(func, squares, sq_kwargs).sqrt_()
    except (RuntimeError, ValueError):  # an unsupported setting in this build
        return False
    ok = l2 > 0
    if not bool(ok.any()):
        return True  # nothing is summed (an empty or all-zero product)
    error = ((reduced - exact).abs()[ok] / l2[ok]).mean()
    return bool(error < _TOLERANCE)


def _signature(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """Hashable description of a product, or None when it is not a float32 CPU product."""
    parts: list[Any] = [func]
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype != torch.float32 or a.device.type != "cpu" or a.is_sparse:
                return None
            parts.append((tuple(a.shape), a.stride()))
        else:
            parts.append(a)
    parts.extend(sorted(kwargs.items()))
    return tuple(parts)


class _CheckedOneDNN(TorchDispatchMode):
    """Runs each float32 CPU product on oneDNN once its signature passed :func:`keeps_float32`."""

    def __init__(self) -> None:
        super().__init__()
        self.verdicts: dict[tuple, bool] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in _GEMMS:
            key = _signature(func, args, kwargs)
            if key is not None:
                ok = self.verdicts.get(key)
                if ok is None:
                    ok = self.verdicts[key] = keeps_float32(func, args, kwargs)
                if ok:
                    return _run_reduced(func, args, kwargs)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def onednn_fp32_is_exact() -> bool:
    """Whether oneDNN keeps float32 accuracy on two typical training products (checked once).

    A quick filter: where even these round to bf16 (processors with AMX, for instance),
    :func:`cpu_matmul` does not try oneDNN at all.
    """
    if _precision_prop() is None or not torch.backends.mkldnn.is_available():
        return False
    a, b = torch.empty(600, 512), torch.empty(512, 300)
    return keeps_float32(_aten.mm.default, (a, b)) and keeps_float32(
        _aten.mm.default, (torch.empty(512, 600).t(), b)
    )


@contextlib.contextmanager
def cpu_matmul(choice: str = "auto") -> Iterator[str]:
    """Run fp32 CPU matmuls in the body with ``choice``; yields the backend actually used.

    Args:
        choice: ``default`` (PyTorch's BLAS), ``onednn`` (oneDNN for every product whose
            signature keeps float32 accuracy there, checked the first time it runs; PyTorch's
            BLAS for the others), or ``auto`` (same as ``onednn``).

    Yields:
        ``"onednn"`` when products may go to oneDNN, ``"default"`` otherwise.

    The check holds for the products run in the body by the thread that entered it (autograd
    runs CPU backward passes on that thread); the precision setting outside is untouched.
    """
    if choice not in ("auto", "default", "onednn"):
        raise ValueError(f"unknown cpu_matmul {choice!r} (valid: auto, default, onednn)")
    if choice == "default" or not onednn_fp32_is_exact():
        yield "default"
        return
    with _fp32_precision("none"), _CheckedOneDNN():
        yield "onednn"
