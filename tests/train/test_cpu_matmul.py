"""The CPU fp32 matmul backend switch: float32 accuracy, restored global state."""

from __future__ import annotations

import pytest
import torch

from ctrcal.train.cpu_matmul import cpu_matmul, onednn_fp32_is_exact


def _setting():
    return torch.backends.mkldnn.matmul.fp32_precision


def test_default_changes_nothing():
    before = _setting()
    with cpu_matmul("default") as backend:
        assert backend == "default" and _setting() == before
    assert _setting() == before


def test_onednn_keeps_float32_accuracy_and_restores_the_setting():
    before = _setting()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 200, generator=gen), torch.randn(200, 100, generator=gen)
    ref = a.double() @ b.double()
    with cpu_matmul("auto") as backend:
        assert backend == ("onednn" if onednn_fp32_is_exact() else "default")
        out = a @ b
        grad = torch.randn(300, 100, generator=gen)
        x = a.clone().requires_grad_()
        (x @ b).backward(grad)
    assert _setting() == before
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, grad @ b.t(), rtol=1e-5, atol=1e-4)


def test_unknown_choice():
    with pytest.raises(ValueError, match="cpu_matmul"), cpu_matmul("fast"):
        pass
