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
@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_compiled_masknet_is_one_graph_with_seeded_dropout_and_equals_eager(variant):
    """Training mode: one graph whose dropout masks are live and follow torch's seed.
    Evaluation mode turns the dropout off: one more graph, whose outputs are eager's. It has
    the operators a model built without dropout trains with (no dropout module there; here
    the evaluating dropout is skipped and the fused tails take a plain ReLU), so for the
    serial variant its gradients are compared with eager's too: a dropout-free training
    graph checked without a third compile."""
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
    model.eval()
    if variant == "serial":
        out_c, grads_c = _run(compiled, model)
        out_e, grads_e = _run(model, model)
        for g_c, g_e in zip(grads_c, grads_e, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)
    else:  # the forward only: tracing a backward too costs its compile about 0.7 s more
        with torch.no_grad():
            batch = Batch(*random_batch(VOCAB, FN, 32), None)
            out_c, out_e = compiled(batch), model(batch)
    assert counter.frame_count == 2  # one more graph, for evaluation mode
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-6)
