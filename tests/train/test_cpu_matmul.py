"""The CPU fp32 matmul backend switch: no product the model runs is rounded to bf16."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ctrcal.core.batch import Batch
from ctrcal.models.masknet import MaskNet
from ctrcal.train import cpu_matmul as cm
from ctrcal.train.cpu_matmul import cpu_matmul, keeps_float32, onednn_fp32_is_exact

_aten = torch.ops.aten


def _setting():
    return torch.backends.mkldnn.matmul.fp32_precision


def _bf16(t):
    return t.to(torch.bfloat16).float() if isinstance(t, torch.Tensor) else t


def _rounding_run_reduced(rounds):
    """A stand-in for a processor whose oneDNN rounds the inputs of some products to bf16."""
    real = cm._run_reduced

    def run(func, args, kwargs):
        if rounds(func, args):
            return func(*(_bf16(a) for a in args), **kwargs)
        return real(func, args, kwargs)

    return run


class _RoundEveryProduct(TorchDispatchMode):
    """What a global bf16 permission does on such a processor: every product rounded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in cm._GEMMS:
            args = tuple(_bf16(a) for a in args)
        return func(*args, **(kwargs or {}))


def _masknet_grads(dtype, context):
    torch.manual_seed(0)
    model = MaskNet(
        [50, 40, 30],
        4,
        embedding_dim=8,
        hidden_units=[64, 48],
        reduction_ratio=0.5,
        embedding_init_std=0.5,
    )
    model = model.to(dtype)
    g = torch.Generator().manual_seed(1)
    cat = torch.stack([torch.randint(0, v, (256,), generator=g) for v in (50, 40, 30)], 1)
    num = torch.randn(256, 4, generator=g).to(dtype)
    label = (torch.rand(256, generator=g) < 0.3).to(dtype)
    with context:
        logits = model(Batch(cat, num, None))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label)
        loss.backward()
    return {n: p.grad.detach().double() for n, p in model.named_parameters()}


def _worst_relative_error(grads, ref):
    return max(float((grads[n] - ref[n]).norm() / ref[n].norm()) for n in ref if ref[n].any())


def test_every_product_of_a_training_step_keeps_float32_accuracy(monkeypatch):
    """Forward and backward of a MaskNet under cpu_matmul('auto') match float64 to float32
    accuracy, also where oneDNN would round some of the products' shapes to bf16."""
    ref = _masknet_grads(torch.float64, torch.enable_grad())
    fp32 = _masknet_grads(torch.float32, torch.enable_grad())
    rounded = _masknet_grads(torch.float32, _RoundEveryProduct())
    baseline = _worst_relative_error(fp32, ref)
    # the measure separates float32 from bf16 products by a wide margin
    assert baseline < 1e-4 < _worst_relative_error(rounded, ref)
    with cpu_matmul("auto"):
        checked = _masknet_grads(torch.float32, torch.enable_grad())
    assert _worst_relative_error(checked, ref) < 1e-4
    # a processor whose oneDNN rounds the products with an inner dimension of 64 (the
    # second MaskBlock's input and the backward products through it)
    cm.onednn_fp32_is_exact.cache_clear()
    monkeypatch.setattr(
        cm,
        "_run_reduced",
        _rounding_run_reduced(
            lambda func, args: any(
                isinstance(a, torch.Tensor) and a.dim() == 2 and 64 in a.shape for a in args
            )
        ),
    )
    try:
        with cpu_matmul("auto") as backend:
            guarded = _masknet_grads(torch.float32, torch.enable_grad())
    finally:
        cm.onednn_fp32_is_exact.cache_clear()
    assert backend == ("onednn" if onednn_fp32_is_exact() else "default")
    assert _worst_relative_error(guarded, ref) < 1e-4


def test_only_products_that_keep_float32_go_to_onednn(monkeypatch):
    calls = []
    real = _rounding_run_reduced(lambda func, args: args[0].shape[0] == 37)

    def run(func, args, kwargs):
        calls.append(args[0].shape[0])
        return real(func, args, kwargs)

    monkeypatch.setattr(cm, "_run_reduced", run)
    cm.onednn_fp32_is_exact.cache_clear()
    gen = torch.Generator().manual_seed(0)
    a37, a50 = torch.randn(37, 300, generator=gen), torch.randn(50, 300, generator=gen)
    b = torch.randn(300, 20, generator=gen)
    try:
        with cpu_matmul("auto") as backend:
            if backend != "onednn":
                pytest.skip("oneDNN fp32 products are not available in this build")
            calls.clear()
            out37 = a37 @ b
            out37_again = a37 @ b
            out50 = a50 @ b
    finally:
        cm.onednn_fp32_is_exact.cache_clear()
    torch.testing.assert_close(out37.double(), a37.double() @ b.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out37_again, out37)
    torch.testing.assert_close(out50.double(), a50.double() @ b.double(), rtol=1e-5, atol=1e-5)
    # 37: probed once (rounded -> rejected), then never sent to oneDNN; 50: probed, then used
    assert calls.count(37) == 1
    assert calls.count(50) == 2


def test_keeps_float32_tells_bf16_rounding_from_float32():
    a, b = torch.empty(200, 4096), torch.empty(4096, 30)
    assert keeps_float32(_aten.mm.default, (a, b)) or not onednn_fp32_is_exact()
    # a product computed from bf16-rounded inputs is rejected, whatever K
    real = cm._run_reduced
    try:
        cm._run_reduced = _rounding_run_reduced(lambda func, args: True)
        for k in (16, 4096, 65536):
            assert not keeps_float32(_aten.mm.default, (torch.empty(8, k), torch.empty(k, 8)))
    finally:
        cm._run_reduced = real


def test_default_changes_nothing():
    before = _setting()
    with cpu_matmul("default") as backend:
        assert backend == "default" and _setting() == before
        torch.randn(3, 4) @ torch.randn(4, 5)
    assert _setting() == before


def test_setting_restored_and_non_float32_products_untouched():
    before = _setting()
    with cpu_matmul("auto"):
        x = torch.randn(20, 30, dtype=torch.float64) @ torch.randn(30, 4, dtype=torch.float64)
        y = torch.randn(20, 30).to(torch.bfloat16) @ torch.randn(30, 4).to(torch.bfloat16)
    assert _setting() == before
    assert x.dtype == torch.float64 and y.dtype == torch.bfloat16


def test_unknown_choice():
    with pytest.raises(ValueError, match="cpu_matmul"), cpu_matmul("fast"):
        pass
