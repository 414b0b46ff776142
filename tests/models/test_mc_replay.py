"""MC passes that compute the deterministic prefix once (``mc_replay``) give, bit for bit, the
probabilities of full forward passes over the repeated rows: every built-in model, MC-LayerNorm
where it can sit, MC-Dropout, and every registered norm."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ctrcal.core.batch import Batch
from ctrcal.layers.context import bind_contexts
from ctrcal.layers.mc_layernorm.module import mc_mode
from ctrcal.layers.mc_layernorm.predict import sample_probabilities
from ctrcal.layers.registry import available_norms
from ctrcal.models.dcnv2 import DCNv2
from ctrcal.models.dnn import DNN
from ctrcal.models.masknet import MaskNet
from ctrcal.train.predict import mc_dropout

VOCAB = [40, 25, 12]
NUMERIC = 3


def _masknet_serial(emb, net, p):
    return MaskNet(
        VOCAB,
        NUMERIC,
        4,
        "serial",
        hidden_units=[16, 12],
        reduction_ratio=0.5,
        emb_norm=emb,
        net_norm=net,
        dropout=p,
        embedding_init_std=0.3,
    )


def _masknet_parallel(emb, net, p):
    return MaskNet(
        VOCAB,
        NUMERIC,
        4,
        "parallel",
        num_blocks=2,
        block_dim=8,
        mlp_hidden_units=[16, 8],
        emb_norm=emb,
        net_norm=net,
        dropout=p,
        embedding_init_std=0.3,
    )


def _dnn(emb, net, p):
    return DNN(
        VOCAB, NUMERIC, 4, [16, 8], net_norm=net, emb_norm=emb, dropout=p, embedding_init_std=0.3
    )


def _dcnv2(emb, net, p):
    return DCNv2(
        VOCAB,
        NUMERIC,
        4,
        "stacked_parallel",
        num_cross_layers=2,
        stacked_dnn_hidden_units=[16, 8],
        parallel_dnn_hidden_units=[12],
        net_norm=net,
        emb_norm=emb,
        dropout=p,
        embedding_init_std=0.3,
    )


KINDS = {
    "masknet_serial": _masknet_serial,
    "masknet_parallel": _masknet_parallel,
    "dnn": _dnn,
    "dcnv2": _dcnv2,
}
SETUPS = {  # emb_norm, net_norm, MC-Dropout
    "mcln_blocks": ("layernorm", "mclayernorm", False),
    "mcln_everywhere": ("mclayernorm", "mclayernorm", False),
    "mc_dropout": ("layernorm", "layernorm", True),
    "mcln_and_dropout": ("none", "mclayernorm", True),
}


def _batch(rows: int = 48) -> Batch:
    g = torch.Generator().manual_seed(1)
    cat = torch.stack([torch.randint(0, v, (rows,), generator=g) for v in VOCAB], dim=1)
    num = torch.randn(rows, NUMERIC, generator=g)
    num[::5, 1] = float("nan")
    return Batch(cat, num, None)


def _build(kind, emb, net, dropout):
    torch.manual_seed(0)
    model = KINDS[kind](emb, net, dropout)
    with torch.no_grad():  # norms away from their initial affine
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
    return model.eval()


def _passes(model, batch, n, max_rows, shared, dropout_on):
    """``[n, B]`` probabilities; ``shared=False`` hides the hook (full forward passes)."""
    fn = model if shared else (lambda b: model(b))
    with torch.no_grad(), mc_mode(model), contextlib.ExitStack() as stack:
        if dropout_on:
            stack.enter_context(mc_dropout(model))
        torch.manual_seed(3)
        return sample_probabilities(fn, [batch], n, max_rows)


def _check(model, dropout_on, n=5):
    """Shared-prefix passes equal full passes; returns them and whether the prefix was shared
    (the embedding ran once per chunk of rows, not once per forward)."""
    batch = _batch()
    calls = []
    model.embedding.register_forward_hook(lambda *_: calls.append(1))
    # all passes in one forward; and chunks of 40 and 8 rows, with 1 and then 5 passes per
    # forward (5 + 1 forwards)
    replayed = []
    for max_rows, chunks, forwards in ((None, 1, 1), (40, 2, 6)):
        calls.clear()
        shared = _passes(model, batch, n, max_rows, True, dropout_on)
        assert len(calls) in (chunks, forwards)
        replayed.append(len(calls) == chunks and chunks < forwards)
        calls.clear()
        full = _passes(model, batch, n, max_rows, False, dropout_on)
        assert len(calls) == forwards
        assert torch.equal(shared, full)
    return shared, replayed[1]


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("kind", KINDS)
def test_shared_prefix_equals_full_passes(kind, setup):
    emb, net, dropout_on = SETUPS[setup]
    model = _build(kind, emb, net, 0.2 if dropout_on else 0.0)
    probs, replayed = _check(model, dropout_on)
    assert replayed  # the embedding ran once per chunk, not once per forward
    assert (probs.std(0) > 0).any()  # the passes sampled


@pytest.mark.parametrize("norm", available_norms())
@pytest.mark.parametrize("kind", KINDS)
def test_every_norm_with_mc_dropout(kind, norm):
    spec = {"name": norm, "field": 0} if norm == "contextnorm" else norm
    model = _build(kind, "none", spec, 0.2)
    # a context norm's ids come from a hook on the model itself, which must see every
    # forward: that model runs full passes, the others share their prefix
    hooked = bind_contexts(model, None) > 0
    probs, replayed = _check(model, True)
    assert replayed != hooked
    assert (probs.std(0) > 0).any()


class _Shifted(MaskNet):
    """A subclass with its own forward: the inherited replay cannot vouch for it."""

    def forward(self, batch: Batch) -> torch.Tensor:
        return super().forward(batch) + 1.0


def test_a_model_with_its_own_forward_runs_full_passes():
    torch.manual_seed(0)
    model = _Shifted(VOCAB, NUMERIC, 4, hidden_units=[8], net_norm="mclayernorm").eval()
    assert model.mc_replay(_batch()) is None
    probs, replayed = _check(model, False)
    assert not replayed
    plain = MaskNet(VOCAB, NUMERIC, 4, hidden_units=[8], net_norm="mclayernorm").eval()
    plain.load_state_dict(model.state_dict())
    base = _passes(plain, _batch(), 5, None, True, False)
    # the subclass's logits, pass by pass: the base model's plus one
    assert float((torch.logit(probs) - torch.logit(base) - 1.0).abs().max()) < 1e-4
