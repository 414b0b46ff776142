"""DCNv2 and DNN: shapes, the cross formulas, norm positions, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.core.criteo_schema import NUM_CATEGORICAL, NUM_NUMERIC
from ctrcal.layers.cross import CrossNet
from ctrcal.layers.embedding import FieldNorm
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.layers.norms import FeatureBatchNorm
from ctrcal.layers.registry import replace_norms
from ctrcal.models.dcnv2 import STRUCTURES, DCNv2
from ctrcal.models.dnn import DNN

VOCAB = [11] * NUM_CATEGORICAL


def _inputs(rows: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cat = torch.randint(0, 11, (rows, NUM_CATEGORICAL), generator=g)
    num = torch.randn(rows, NUM_NUMERIC, generator=g)
    num[0, 0] = float("nan")
    return cat, num


@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize(("low_rank", "experts"), [(0, 1), (4, 1), (4, 3)])
def test_dcnv2_returns_finite_logits_of_shape_b(structure, low_rank, experts):
    model = DCNv2(
        VOCAB,
        NUM_NUMERIC,
        embedding_dim=4,
        structure=structure,
        num_cross_layers=2,
        low_rank=low_rank,
        num_experts=experts,
        stacked_dnn_hidden_units=[8],
        parallel_dnn_hidden_units=[8, 8],
    )
    out = model(Batch(*_inputs(), None))
    assert out.shape == (6,) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.cross.parameters().__next__().grad is not None


def test_full_rank_cross_layers_follow_the_formula():
    net = CrossNet(5, 2)
    x0 = torch.randn(3, 5)
    x = x0
    for lin in net.layers:
        x = x0 * (x @ lin.weight.T + lin.bias) + x
    torch.testing.assert_close(net(x0), x)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("layers", [1, 3])
def test_fused_full_rank_cross_equals_the_autograd_layers(threads, layers, monkeypatch):
    """The C pass each way (CPU, float32) against the same layers through autograd: outputs
    and the gradients of x0 (used by every layer), every weight and every bias."""
    from ctrcal.layers import cross as cross_module
    from ctrcal.layers.kernels.cpu_kernels import cpu_kernels, kernel_error

    if cpu_kernels() is None:
        pytest.skip(f"no C kernel here: {kernel_error()}")
    torch.manual_seed(0)
    net = CrossNet(39, layers)
    with torch.no_grad():
        for lin in net.layers:
            lin.bias.normal_()
    base = torch.randn(700, 41)
    g = torch.randn(700, 39)
    results = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fused in (True, False):
            if not fused:
                monkeypatch.setattr(cross_module, "_fusable", lambda x0, layers: False)
            net.zero_grad()
            x0 = base[:, 1:40].clone().requires_grad_(True)  # not contiguous in base
            y = net(x0)
            (y * g).sum().backward()
            results.append([y.detach(), x0.grad] + [p.grad.clone() for p in net.parameters()])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):  # sums over 700 rows of terms ~1, in other orders
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_mixture_of_experts_matches_a_loop_over_experts():
    torch.manual_seed(0)
    net = CrossNet(6, 2, low_rank=3, num_experts=4)
    x0 = torch.randn(5, 6)
    x = x0
    for i in range(2):
        outs, gates = [], []
        for e in range(4):
            v = torch.tanh(x @ net.V[i][:, e * 3 : (e + 1) * 3])
            v = torch.tanh(v @ net.C[i, e])
            outs.append(x0 * (v @ net.U[i, e] + net.bias[i]))
            gates.append(x @ net.gate[i][:, e])
        g = torch.softmax(torch.stack(gates, 1), dim=1)
        x = (torch.stack(outs, 1) * g.unsqueeze(-1)).sum(1) + x
    torch.testing.assert_close(net(x0), x)


def test_low_rank_single_expert_is_u_v_transposed():
    net = CrossNet(6, 1, low_rank=2)
    x0 = torch.randn(4, 6)
    expected = x0 * (x0 @ net.V[0] @ net.U[0, 0] + net.bias[0]) + x0
    torch.testing.assert_close(net(x0), expected)


def test_dcnv2_norms_at_every_deep_layer_and_per_field():
    model = DCNv2(
        VOCAB,
        NUM_NUMERIC,
        embedding_dim=4,
        structure="stacked_parallel",
        stacked_dnn_hidden_units=[8, 8],
        parallel_dnn_hidden_units=[8],
        net_norm={"name": "mclayernorm", "fraction": 0.5},
        emb_norm="layernorm",
    )
    mc = [m for m in model.modules() if isinstance(m, MCLayerNorm)]
    assert len(mc) == 3  # two stacked + one parallel hidden layer
    assert isinstance(model.emb_norm, FieldNorm)
    assert len(model.emb_norm.norms) == NUM_CATEGORICAL + NUM_NUMERIC
    assert replace_norms(model, "rmsnorm") == NUM_CATEGORICAL + NUM_NUMERIC  # the field norms


def test_dnn_norm_per_hidden_layer_and_none_adds_no_module():
    model = DNN(VOCAB, NUM_NUMERIC, embedding_dim=4, hidden_units=[8, 6, 4], net_norm="batchnorm")
    assert sum(isinstance(m, FeatureBatchNorm) for m in model.modules()) == 3
    bare = DNN(VOCAB, NUM_NUMERIC, embedding_dim=4, hidden_units=[8, 6], net_norm="none")
    kinds = [type(m) for m in bare.mlp.layers]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert model(Batch(*_inputs(), None)).shape == (6,)


@pytest.mark.slow
@pytest.mark.parametrize("factory", [DNN, DCNv2])
def test_models_learn_a_simple_rule(factory):
    torch.manual_seed(0)
    kwargs = {"hidden_units": [16]} if factory is DNN else {"parallel_dnn_hidden_units": [16]}
    model = factory(VOCAB, NUM_NUMERIC, embedding_dim=4, net_norm="layernorm", **kwargs)
    cat, num = _inputs(512, seed=1)
    num = torch.nan_to_num(num)
    y = ((cat[:, 0] % 2 == 0) ^ (num[:, 1] > 0)).float()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(Batch(cat, num, None)), y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.3


def test_bad_structure_and_widths_are_errors():
    with pytest.raises(ValueError, match="unknown DCNv2 structure 'paralel'"):
        DCNv2(VOCAB, NUM_NUMERIC, structure="paralel")
    with pytest.raises(ValueError, match="needs low_rank > 0"):
        DCNv2(VOCAB, NUM_NUMERIC, num_experts=2)
    # each refusal names the argument, so validate can name the config key
    with pytest.raises(ValueError, match=r"^hidden_units\[0\]: expected an integer >= 1, got 0"):
        DNN(VOCAB, NUM_NUMERIC, hidden_units=[0])
    with pytest.raises(ValueError, match=r"^parallel_dnn_hidden_units\[1\]: "):
        DCNv2(VOCAB, NUM_NUMERIC, parallel_dnn_hidden_units=[4, -1])
    with pytest.raises(ValueError, match=r"^dropout: "):
        DCNv2(VOCAB, NUM_NUMERIC, dropout=1.0)
