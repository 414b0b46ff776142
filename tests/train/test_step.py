"""The optimizer step that leaves torch's compiler unimported is torch's step, bit for bit."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from ctrcal.train.step import optimizer_step, without_dynamo_import


def _model_and_grads(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 1))
    model(torch.randn(32, 6)).square().mean().backward()
    return model


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_step_is_torchs_step(cls, fused):
    ours, theirs = _model_and_grads(0), _model_and_grads(0)
    opt_ours = cls(ours.parameters(), lr=0.01, weight_decay=0.1, fused=fused)
    opt_theirs = cls(theirs.parameters(), lr=0.01, weight_decay=0.1, fused=fused)
    for _ in range(3):
        optimizer_step(opt_ours)
        opt_theirs.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert str(opt_ours.state_dict()) == str(opt_theirs.state_dict())
    assert all(not p.requires_grad or p.grad_fn is None for p in ours.parameters())


def test_a_registered_step_hook_still_runs():
    model = _model_and_grads(1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    seen = []
    handle = opt.register_step_post_hook(lambda optimizer, args, kwargs: seen.append(1))
    optimizer_step(opt)
    handle.remove()
    assert seen == [1]


def test_the_plain_methods_are_lent_for_the_block_only(monkeypatch):
    # as in a process that never imported dynamo (the module object itself stays untouched)
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    plain = torch.optim.Optimizer.zero_grad.__wrapped__
    before = getattr(plain, "__dynamo_disable", None)
    model = _model_and_grads(2)
    with without_dynamo_import():
        lent = getattr(plain, "__dynamo_disable", None)
        torch.optim.Adam(model.parameters()).zero_grad()
    assert "torch._dynamo" not in sys.modules
    # torch's own wrapper, where one was cached already, is never replaced
    assert lent is (plain if before is None else before)
    assert getattr(plain, "__dynamo_disable", None) is before


def test_a_step_replaced_on_the_instance_is_the_one_called():
    opt = torch.optim.Adam(_model_and_grads(3).parameters(), lr=0.01)
    calls = []
    opt.step = lambda *args, **kwargs: calls.append(1)
    optimizer_step(opt)
    assert calls == [1]
