"""MaskNet's fused mask first layers: the same model as running the blocks one by one."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch

import ctrcal.models.masknet as masknet_module
from ctrcal.core.batch import Batch
from ctrcal.layers.mask_block import mask_hidden_layers
from ctrcal.models.masknet import MaskNet

VOCAB = [11, 5, 7]
FN = 4
D = 6


def _inputs(b: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB, FN, b, seed)


def _pair(dtype: torch.dtype, **kwargs) -> tuple[MaskNet, MaskNet]:
    torch.manual_seed(0)
    args = {
        "vocab_sizes": VOCAB,
        "num_numeric": FN,
        "embedding_dim": D,
        "hidden_units": [16, 12, 9],
        "reduction_ratio": 0.5,
        "embedding_init_std": 0.5,
        **kwargs,
    }
    a = MaskNet(**args).to(dtype)
    b = MaskNet(**args).to(dtype)
    b.load_state_dict(a.state_dict())  # the same checkpoint drives both paths
    with torch.no_grad():  # non-zero biases, so a bias mixed up between blocks would show
        for m in (a, b):
            torch.manual_seed(1)
            for blk in m.blocks:
                blk.mask_layer[0].bias.normal_()
    return a, b


def _run(model: MaskNet, fused: bool, monkeypatch, dtype) -> tuple[torch.Tensor, dict]:
    with monkeypatch.context() as mp:
        if not fused:
            mp.setattr(masknet_module, "mask_hidden_layers", lambda blocks, v: None)
        cat, num = _inputs()
        out = model(Batch(cat, num.to(dtype), None))
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", ["serial", "parallel"])
@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_fused_equals_block_by_block(variant, dtype, tol, monkeypatch):
    # float64 pins the arithmetic down (only the summation order may differ); float32 shows
    # the reassociation stays at float32 rounding
    fused_model, plain_model = _pair(
        dtype, variant=variant, num_blocks=3, block_dim=10, mlp_hidden_units=[9]
    )
    out_f, grads_f = _run(fused_model.eval(), True, monkeypatch, dtype)
    out_p, grads_p = _run(plain_model.eval(), False, monkeypatch, dtype)
    torch.testing.assert_close(out_f, out_p, rtol=tol, atol=tol)
    assert grads_f.keys() == grads_p.keys()
    for name in grads_p:
        torch.testing.assert_close(grads_f[name], grads_p[name], rtol=tol, atol=tol, msg=name)
    firsts = [n for n in grads_f if n.endswith("mask_layer.0.weight")]
    assert len(firsts) == 3 and all(grads_f[n].abs().sum() > 0 for n in firsts)


def test_fused_path_is_taken_and_splits_per_block():
    _, model = _pair(torch.float32)
    v_emb = torch.randn(5, model.embedding.output_dim)
    hidden = mask_hidden_layers(model.blocks, v_emb)
    assert hidden is not None
    assert [h.shape for h in hidden] == [(5, b.mask_layer[0].out_features) for b in model.blocks]
    for h, blk in zip(hidden, model.blocks, strict=True):
        torch.testing.assert_close(h, torch.relu(blk.mask_layer[0](v_emb)))


def test_a_hooked_or_replaced_first_layer_runs_block_by_block():
    _, model = _pair(torch.float32)
    calls = []
    model.blocks[1].mask_layer[0].register_forward_hook(lambda *a: calls.append(1))
    cat, num = _inputs()
    model(Batch(cat, num, None))
    assert calls == [1]  # the hook saw its layer run
    assert mask_hidden_layers(model.blocks, torch.randn(2, model.embedding.output_dim)) is None
    _, model = _pair(torch.float32)
    model.blocks[0].mask_layer[1] = torch.nn.GELU()
    assert mask_hidden_layers(model.blocks, torch.randn(2, model.embedding.output_dim)) is None
    cat, num = _inputs()
    with_gelu = model(Batch(cat, num, None))
    model.blocks[0].mask_layer[1] = torch.nn.ReLU()
    assert not torch.allclose(with_gelu, model(Batch(cat, num, None)))  # the GELU really ran


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_first_layers_match_torch_in_float32(threads, monkeypatch):
    # the C pass (bias, ReLU, split; joined gradients, ReLU mask, bias sum) against the same
    # layers in torch, split into row chunks for 1 or 3 threads
    torch.manual_seed(0)
    blocks = MaskNet(VOCAB, FN, D, hidden_units=[16, 12, 9], reduction_ratio=0.5).blocks
    for blk in blocks:
        torch.nn.init.normal_(blk.mask_layer[0].bias)
    v_emb = torch.randn(700, blocks[0].input_dim)
    weights = [torch.randn(700, blk.mask_layer[0].out_features) for blk in blocks]

    def grads_of(hidden, v):
        loss = sum((h * w).sum() for h, w in zip(hidden, weights, strict=True))
        params = [p for blk in blocks for p in blk.mask_layer[0].parameters()]
        return torch.autograd.grad(loss, [v, *params])

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    v = v_emb.clone().requires_grad_(True)
    fused = mask_hidden_layers(blocks, v)
    assert all(h.is_contiguous() for h in fused)
    assert fused[0].grad_fn is not None and "MaskHidden" in type(fused[0].grad_fn).__name__
    fused_grads = grads_of(fused, v)
    v_ref = v_emb.clone().requires_grad_(True)
    ref = [torch.relu(blk.mask_layer[0](v_ref)) for blk in blocks]
    ref_grads = grads_of(ref, v_ref)
    for got, want in zip(fused, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(fused_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_fused_first_layers_pass_nan_like_relu():
    _, model = _pair(torch.float32)
    v_emb = torch.randn(4, model.embedding.output_dim)
    v_emb[1, 0] = float("nan")
    fused = mask_hidden_layers(model.blocks, v_emb)
    for h, blk in zip(fused, model.blocks, strict=True):
        ref = torch.relu(blk.mask_layer[0](v_emb))
        torch.testing.assert_close(h, ref, equal_nan=True)


def _train_step_grads(model: MaskNet, seed: int) -> tuple[torch.Tensor, dict]:
    cat, num = _inputs(b=300)
    torch.manual_seed(seed)  # the dropout masks' draws
    out = model(Batch(cat, num, None))
    (out * torch.linspace(-1, 1, out.numel())).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _modules_only(blocks, head, v_emb, v_in, hidden):
    h = v_in
    for blk, m in zip(blocks, hidden, strict=True):
        h = blk(v_emb, h, mask_hidden=m)
    return head(h).squeeze(-1)


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_serial_chain_equals_the_modules_in_training(threads, monkeypatch):
    # every block's LayerNorm, ReLU and dropout fused with the next block's masked input, the
    # last one's with the head: the same logits and gradients as the modules, with the same
    # dropout masks from the same draws, whatever the row chunks per thread
    fused_model, plain_model = _pair(torch.float32, dropout=0.3)
    fused_model.train()
    plain_model.train()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    out_f, grads_f = _train_step_grads(fused_model, 5)
    with monkeypatch.context() as mp:
        mp.setattr(masknet_module, "serial_logits", _modules_only)
        out_p, grads_p = _train_step_grads(plain_model, 5)
    torch.testing.assert_close(out_f, out_p, rtol=1e-5, atol=1e-5)
    for name in grads_p:
        torch.testing.assert_close(grads_f[name], grads_p[name], rtol=1e-4, atol=1e-5, msg=name)
    assert grads_f["head.weight"].abs().sum() > 0 and grads_f["blocks.2.norm.bias"].abs().sum() > 0


def test_a_hooked_last_block_runs_as_a_module():
    _, model = _pair(torch.float32, dropout=0.3)
    seen = []
    model.blocks[-1].register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    cat, num = _inputs()
    assert model.train()(Batch(cat, num, None)).shape == (16,)
    assert seen == [(16, 9)]
