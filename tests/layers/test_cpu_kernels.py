"""How the CPU kernels split their work between threads: chunks, torch's OpenMP runtime, and the
thread-pool fallback, which must give the same numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ctrcal.layers import cpu_kernels
from ctrcal.models.masknet import MaskNet


@pytest.fixture
def kernels():
    if cpu_kernels.cpu_kernels() is None:
        pytest.skip(f"no C kernel here: {cpu_kernels.kernel_error()}")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 1000, 1001])
@pytest.mark.parametrize("count", [1, 3])
def test_chunks_cover_the_range_once_in_order(n, count, threads):
    threads(count)
    chunks = cpu_kernels.Chunks(n, 64)
    bounds = chunks.bounds.tolist()
    assert len(bounds) == chunks.count + 1
    assert bounds[0] == 0 and bounds[-1] == n
    assert all(lo < hi for lo, hi in zip(bounds, bounds[1:], strict=False))
    assert chunks.count <= count
    assert all(hi - lo >= 64 for lo, hi in zip(bounds, bounds[1:-1], strict=False))
    assert chunks.partials(5).shape == (chunks.count, 5)


def test_one_openmp_runtime_in_the_process(kernels):
    if not sys.platform.startswith("linux") or not cpu_kernels.torch_uses_loaded_openmp():
        pytest.skip("torch does not run on a loaded GNU OpenMP here")
    assert cpu_kernels.kernels_use_openmp()
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) == 1, runtimes  # the kernels run on torch's threads, not a second team


def _masknet_step(seed: int = 0):
    torch.manual_seed(seed)
    model = MaskNet([300, 200, 100], 5, embedding_dim=8, hidden_units=[96, 64, 48],
                    reduction_ratio=0.5, dropout=0.2)  # fmt: skip
    model.train()
    cat = torch.stack([torch.randint(0, v, (2000,)) for v in (300, 200, 100)], 1)
    num = torch.randn(2000, 5)
    num[::7, 2] = float("nan")
    torch.manual_seed(seed + 1)  # the dropout draws
    logits = model(cat, num)
    logits.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits.detach(), grads


@pytest.mark.parametrize("count", [2, 3])
def test_thread_pool_fallback_gives_the_openmp_numbers(kernels, threads, count, monkeypatch):
    """Every fused kernel of a serial MaskNet step (gather, numeric embedding, masks' first
    layers, LayerNorm-ReLU-dropout into the next mask, the head, scatter-add), chunk for chunk
    the same partial sums whichever thread runs a chunk: bit-identical results."""
    threads(count)
    reference = _masknet_step()
    monkeypatch.setattr(cpu_kernels, "kernels_use_openmp", lambda: False)
    fallback = _masknet_step()
    assert torch.equal(reference[0], fallback[0])
    for name, grad in reference[1].items():
        assert torch.equal(grad, fallback[1][name]), name
