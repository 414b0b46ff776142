"""How the CPU kernels split their work between threads: chunks, torch's OpenMP runtime, and the
thread-pool fallback, which must give the same numbers."""

from __future__ import annotations

import pytest
import torch

from ctrcal.core.batch import Batch
from ctrcal.layers.kernels import chunks as chunks_module
from ctrcal.layers.kernels import cpu_kernels, mcln_kernel
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
    chunks = chunks_module.Chunks(n, 64)
    bounds = chunks.bounds.tolist()
    assert len(bounds) == chunks.count + 1
    assert bounds[0] == 0 and bounds[-1] == n
    assert all(lo < hi for lo, hi in zip(bounds, bounds[1:], strict=False))
    assert chunks.count <= count
    assert all(hi - lo >= 64 for lo, hi in zip(bounds, bounds[1:-1], strict=False))
    assert chunks.partials(5).shape == (chunks.count, 5)


# That the kernel libraries bind to the OpenMP runtime torch loaded (a fresh process maps no
# second one when it loads them) is checked in the fresh process that also trains a CPU step
# with them: test_cpu_training_does_not_import_triton_and_kernels_use_torchs_openmp, in
# tests/layers/test_mc_layernorm.py.


def _masknet_step(norm: str, seed: int = 0):
    torch.manual_seed(seed)
    model = MaskNet(
        [300, 200, 100],
        5,
        embedding_dim=8,
        hidden_units=[96, 64, 48],
        reduction_ratio=0.5,
        dropout=0.2,
        net_norm=norm,
        emb_norm="none" if norm == "layernorm" else norm,
    )
    model.train()
    cat = torch.stack([torch.randint(0, v, (2000,)) for v in (300, 200, 100)], 1)
    num = torch.randn(2000, 5)
    num[::7, 2] = float("nan")
    torch.manual_seed(seed + 1)  # the dropout draws
    logits = model(Batch(cat, num, None))
    logits.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits.detach(), grads


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("norm", ["layernorm", "mclayernorm"])
def test_thread_pool_fallback_gives_the_openmp_numbers(kernels, threads, count, norm, monkeypatch):
    """Every C kernel of a serial MaskNet step -- with LayerNorm: gather, numeric embedding,
    masks' first layers, LayerNorm-ReLU-dropout into the next mask, the head, scatter-add;
    with MC-LayerNorm: its row and per-field kernels too -- chunk for chunk the same partial
    sums whichever thread runs a chunk: bit-identical results."""
    if norm == "mclayernorm" and not mcln_kernel.kernel_available():
        pytest.skip(f"no MC-LayerNorm kernel here: {mcln_kernel.kernel_error()}")
    threads(count)
    reference = _masknet_step(norm)
    monkeypatch.setattr(chunks_module, "runs_chunks_itself", lambda lib: False)
    fallback = _masknet_step(norm)
    assert torch.equal(reference[0], fallback[0])
    for name, grad in reference[1].items():
        assert torch.equal(grad, fallback[1][name]), name
