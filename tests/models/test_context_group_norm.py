"""GroupNorm over features and Context Normalization, and how a context norm gets its ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.config import ModelConfig
from ctrcal.core.batch import Batch
from ctrcal.core.criteo_schema import (
    CATEGORICAL_COLUMNS,
    NUM_CATEGORICAL,
    NUM_NUMERIC,
    NUMERIC_COLUMNS,
)
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.layers.context import ContextNorm, bind_contexts
from ctrcal.layers.norms import FeatureGroupNorm
from ctrcal.layers.registry import create_norm, replace_norms
from ctrcal.models.build import create_model


def test_groupnorm_normalizes_each_group_of_features():
    norm = create_norm("groupnorm", 6, num_groups=3)
    assert isinstance(norm, FeatureGroupNorm)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(4, 5, 6) * 3 + 1
    groups = x.view(4, 5, 3, 2)
    mean = groups.mean(-1, keepdim=True)
    var = groups.var(-1, unbiased=False, keepdim=True)
    expected = ((groups - mean) / torch.sqrt(var + 1e-5)).view(4, 5, 6) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), expected, atol=1e-4, rtol=1e-4)


def test_groupnorm_with_one_group_is_layernorm():
    norm = create_norm("groupnorm", 8, num_groups=1)
    x = torch.randn(3, 8)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (8,)))


def test_groupnorm_groups_must_divide_the_width():
    with pytest.raises(ConfigError, match=r"num_groups must divide the width 10.*1, 2, 5, 10"):
        create_norm("groupnorm", 10, num_groups=4)


def test_context_norm_starts_as_the_identity_and_learns_per_context_statistics():
    norm = ContextNorm(4, field=0, num_contexts=2)
    x = torch.randn(6, 4)
    ids = torch.tensor([3, 3, 4, 4, 0, 1])
    norm.set_context(ids)
    torch.testing.assert_close(norm(x), x, atol=1e-4, rtol=0)
    with torch.no_grad():
        norm.mean_weight.normal_()
    y = norm(x)
    shift = x - y  # mean of the row's context (scale still 1)
    assert torch.allclose(shift[0], shift[1], atol=1e-4)
    assert not torch.allclose(shift[0], shift[2], atol=1e-3)


def test_rare_and_unseen_values_share_the_oov_context():
    norm = ContextNorm(4, field=0, num_contexts=2)
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 900])
    assert norm.context_index(ids).tolist() == [0, 1, 2, 3, 4, 2, 2]


def test_a_context_norm_without_ids_says_how_to_bind_it():
    with pytest.raises(RuntimeError, match="bind_contexts"):
        ContextNorm(4, field="C14")(torch.randn(2, 4))


def _fm():
    return SimpleNamespace(
        vocab_sizes=[40] * NUM_CATEGORICAL,
        categorical_fields=list(CATEGORICAL_COLUMNS),
        numeric_fields=list(NUMERIC_COLUMNS),
        bucket_boundaries=None,
    )


SPEC = NormSpec("contextnorm", {"field": "C3", "num_contexts": 4})


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig("masknet", embedding_dim=4, hidden_units=[8], net_norm=SPEC, emb_norm=SPEC),
        ModelConfig("dnn", embedding_dim=4, hidden_units=[8, 8], net_norm=SPEC, emb_norm=SPEC),
        ModelConfig(
            "dcnv2", embedding_dim=4, parallel_dnn_hidden_units=[8], net_norm=SPEC, emb_norm=SPEC
        ),
        ModelConfig("tiny_user_model:TinyCTR", net_norm=SPEC),
    ],
    ids=["masknet", "dnn", "dcnv2", "user"],
)
def test_context_norm_in_every_position_of_every_model(cfg):
    model = create_model(cfg, _fm())  # the contract probe runs through the context norms
    norms = [m for m in model.modules() if isinstance(m, ContextNorm)]
    assert norms and all(n.field_index_ == CATEGORICAL_COLUMNS.index("C3") for n in norms)
    g = torch.Generator().manual_seed(0)
    cat = torch.randint(0, 40, (8, NUM_CATEGORICAL), generator=g)
    num = torch.randn(8, NUM_NUMERIC, generator=g)
    with torch.no_grad():
        for n in norms:
            n.mean_weight.normal_()
    out = model(Batch(cat, num, None))
    assert out.shape == (8,) and all(n._ids is None for n in norms)  # cleared after the pass
    # the context column changes the output; an unrelated column's values do not reach norms
    cat2 = cat.clone()
    cat2[:, CATEGORICAL_COLUMNS.index("C3")] = (cat2[:, 2] + 1) % 7
    assert not torch.allclose(model(Batch(cat2, num, None)), out)


def test_replace_norms_then_bind_on_a_foreign_model():
    class Foreign(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.norm = nn.LayerNorm(4)
            self.out = nn.Linear(4, 1)

        def forward(self, batch):
            return self.out(self.norm(self.emb(batch.categorical[:, 0]))).squeeze(-1)

    model = Foreign()
    assert replace_norms(model, "contextnorm", field="C2") == 1
    with pytest.raises(ConfigError, match="field 'C2' is not a categorical field"):
        bind_contexts(model, ["C1", "C3"])
    assert bind_contexts(model, ["C1", "C2"]) == 1
    assert bind_contexts(model, ["C1", "C2"]) == 1  # idempotent: one hook
    assert len(model._forward_pre_hooks) == 1
    cat = torch.tensor([[1, 3], [1, 7]])
    out = model(Batch(cat, torch.zeros(2, 0), None))
    assert out.shape == (2,)
    with pytest.raises(RuntimeError, match=r"called as model\(batch\)"):
        model(cat)  # the ids come from batch.categorical
