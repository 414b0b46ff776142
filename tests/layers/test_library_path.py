"""The library path with another library's model (FuxiCTR's shape of MaskNet): an optimizer
built before ``replace_norms`` keeps training the swapped norms, ``mc_predict`` takes a dict of
feature tensors, and a model returning probabilities is not squashed a second time silently."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import ctrcal
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.layers.mc_layernorm.predict import PLAUSIBLE_ROWS


class _DictMaskNet(nn.Module):
    """A MaskNet-like block called as FuxiCTR calls its models: ``forward(inputs: dict)``;
    the optimizer is built in the constructor, as FuxiCTR builds it."""

    def __init__(self, probs: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.mask = nn.Linear(8, 16)
        self.ln1 = nn.LayerNorm(16)
        self.hidden = nn.Linear(16, 16)
        self.ln2 = nn.LayerNorm(16)
        self.ln3 = nn.LayerNorm(16)
        self.out = nn.Linear(16, 1)
        self.probs = probs
        self.optimizer = torch.optim.Adam(self.parameters(), lr=0.05)

    def forward(self, inputs: dict) -> torch.Tensor:
        x = torch.cat([self.emb(inputs["C1"]), inputs["I1"]], dim=-1)
        h = self.ln3(torch.relu(self.ln2(self.hidden(self.ln1(self.mask(x))))))
        z = self.out(h).squeeze(-1)
        return torch.sigmoid(z) if self.probs else z


def _inputs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"C1": torch.randint(0, 10, (n,), generator=g), "I1": torch.randn(n, 4, generator=g)}


def test_an_optimizer_built_before_the_swap_trains_the_swapped_norms():
    torch.manual_seed(0)
    model = _DictMaskNet()
    norms_before = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    params_before = [p for m in norms_before for p in m.parameters()]
    assert len(params_before) == 6
    assert ctrcal.replace_norms(model, "mclayernorm", fraction=0.8) == 3
    swapped = [m for m in model.modules() if isinstance(m, MCLayerNorm)]
    assert len(swapped) == 3
    in_optimizer = {id(p) for g in model.optimizer.param_groups for p in g["params"]}
    kept = [p for m in swapped for p in m.parameters()]
    assert sum(id(p) in in_optimizer for p in kept) == 6  # was 0 of 6
    before = swapped[0].weight.detach().clone()
    x = _inputs(64)
    y = torch.randint(0, 2, (64,)).float()
    model.train()
    loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
    model.optimizer.zero_grad()
    loss.backward()
    model.optimizer.step()
    assert not torch.equal(swapped[0].weight.detach(), before)


def test_mc_predict_takes_a_dict_and_a_tuple_of_batch_first_tensors():
    torch.manual_seed(1)
    model = _DictMaskNet()
    ctrcal.replace_norms(model, "mclayernorm", fraction=1.0)  # exact: every pass the same
    x = _inputs(9, seed=2)
    model.eval()
    with torch.no_grad():
        ref = torch.sigmoid(model(x))
    for max_rows in (None, 4, 1):
        mean, std = ctrcal.mc_predict(model, x, n_samples=3, max_rows=max_rows)
        torch.testing.assert_close(mean, ref)
        assert std.abs().max() < 1e-6

    class _Pair(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pair: tuple) -> torch.Tensor:
            return self.inner({"C1": pair[0], "I1": pair[1]})

    mean, _ = ctrcal.mc_predict(_Pair(model), (x["C1"], x["I1"]), n_samples=3, max_rows=4)
    torch.testing.assert_close(mean, ref)
    with pytest.raises(ValueError, match="same batch size"):
        ctrcal.mc_predict(model, {"C1": x["C1"], "I1": x["I1"][:3]})


def test_a_model_returning_probabilities_warns_unless_told():
    torch.manual_seed(3)
    model = _DictMaskNet(probs=True)
    ctrcal.replace_norms(model, "mclayernorm", fraction=1.0)
    x = _inputs(PLAUSIBLE_ROWS, seed=4)
    with pytest.warns(
        UserWarning, match=rf"all {PLAUSIBLE_ROWS} rows' outputs lie in \[0, 1\].*outputs='probs'"
    ):
        ctrcal.mc_predict(model, x, n_samples=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, _ = ctrcal.mc_predict(model, x, n_samples=2, outputs="probs")
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(mean, model(x))  # averaged as they are, no second sigmoid
    # a logit model is not warned about, and its logits are refused as probabilities
    logits = _DictMaskNet()
    with torch.no_grad():
        logits.out.bias.fill_(-3.0)  # click logits: negative, as a CTR model's are
    ctrcal.replace_norms(logits, "mclayernorm", fraction=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctrcal.mc_predict(logits, x, n_samples=2)
    with pytest.raises(ValueError, match=r"outputs='probs': the model returned values outside"):
        ctrcal.mc_predict(logits, x, n_samples=2, outputs="probs")
    with pytest.raises(ValueError, match="outputs: expected one of"):
        ctrcal.mc_predict(logits, x, outputs="probabilities")
    # fewer rows than PLAUSIBLE_ROWS: too few to tell, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctrcal.mc_predict(model, _inputs(PLAUSIBLE_ROWS // 4), n_samples=2)
