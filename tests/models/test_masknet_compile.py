"""torch.compile on CPU: MaskNet, whose eager mode runs fused CPU kernels, traces as one graph
of plain torch ops that gives eager's outputs and gradients (dropout aside: compiled graphs
draw their own masks)."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch

from ctrcal.core.batch import Batch
from ctrcal.core.norm_spec import NormSpec
from ctrcal.models.masknet import MaskNet

VOCAB = [13, 7, 29, 5]
FN = 3


def _model(variant: str, dropout: float) -> MaskNet:
    torch.manual_seed(0)
    return MaskNet(
        VOCAB,
        FN,
        embedding_dim=6,
        variant=variant,
        hidden_units=[24, 16],
        reduction_ratio=0.5,
        net_norm=NormSpec("layernorm"),
        dropout=dropout,
    ).train()


def _run(module, model: MaskNet, seed: int = 5):
    cat, num = random_batch(VOCAB, FN, 32)
    torch.manual_seed(seed)
    out = module(Batch(cat, num, None))
    grads = torch.autograd.grad(
        (out * torch.linspace(-1, 1, out.numel())).sum(), list(model.parameters())
    )
    return out.detach(), grads


# One graph is dynamo's verdict, whatever the backend; aot_eager also runs the traced forward
# and backward through AOT autograd. Inductor's generated code is checked where it is used:
# tests/train/test_trainer.py trains a MaskNet with train.compile and compares it with eager.
@pytest.mark.slow
def test_compiled_masknet_is_one_graph_equal_to_eager():
    from torch._dynamo.testing import CompileCounterWithBackend

    model = _model("serial", dropout=0.0)
    counter = CompileCounterWithBackend("aot_eager")
    out_c, grads_c = _run(torch.compile(model, backend=counter, fullgraph=True), model)
    out_e, grads_e = _run(model, model)
    assert counter.frame_count == 1
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_compiled_dropout_is_live_and_seeded(variant):
    from torch._dynamo.testing import CompileCounterWithBackend

    model = _model(variant, dropout=0.3)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    a, _ = _run(compiled, model, seed=5)
    b, _ = _run(compiled, model, seed=5)
    c, _ = _run(compiled, model, seed=6)
    assert counter.frame_count == 1
    assert torch.equal(a, b)  # torch.manual_seed fixes the compiled masks
    assert not torch.allclose(a, c)  # and another seed draws other ones
    with torch.no_grad():
        model.eval()
        batch = Batch(*random_batch(VOCAB, FN, 32), None)
        torch.testing.assert_close(compiled(batch), model(batch), rtol=1e-5, atol=1e-6)
