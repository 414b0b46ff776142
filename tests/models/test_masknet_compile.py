"""torch.compile on CPU: MaskNet (with its fused CPU kernels in eager mode) traces as one graph
whose plain torch ops give eager's outputs and gradients, dropout masks included."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch

from ctrcal.config import NormSpec
from ctrcal.models.masknet import MaskNet

VOCAB = [13, 7, 29, 5]
FN = 3


@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_compiled_masknet_is_one_graph_equal_to_eager(variant):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    model = MaskNet(
        VOCAB, FN, embedding_dim=6, variant=variant, hidden_units=[24, 16],
        reduction_ratio=0.5, net_norm=NormSpec("layernorm"), dropout=0.3,
    ).train()  # fmt: skip
    cat, num = random_batch(VOCAB, FN, 32)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    results = []
    for module in (compiled, model):
        torch.manual_seed(5)  # the same dropout draws on both sides
        out = module(cat, num)
        grads = torch.autograd.grad(
            (out * torch.linspace(-1, 1, out.numel())).sum(), list(model.parameters())
        )
        results.append((out, grads))
    assert counter.frame_count == 1
    (out_c, grads_c), (out_e, grads_e) = results
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # dropout is live: another draw gives other outputs
    torch.manual_seed(6)
    assert not torch.allclose(compiled(cat, num), out_e)
