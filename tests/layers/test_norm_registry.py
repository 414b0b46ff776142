"""The norm registry, the built-in norms and replace_norms on foreign models."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import ctrcal
from ctrcal.core.errors import ConfigError, CtrcalError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.core.registry import normalize_name
from ctrcal.layers.mc_layernorm.module import MCLayerNorm, mc_mode
from ctrcal.layers.norms import FeatureBatchNorm, NoMorelization
from ctrcal.layers.registry import (
    NORMS,
    available_norms,
    create_norm,
    register_norm,
    replace_norms,
)
from ctrcal.validate import load_config

BUILTINS = ["batchnorm", "identity", "layernorm", "mclayernorm", "nomorelization", "rmsnorm"]


def test_builtins_registered():
    assert set(BUILTINS) <= set(available_norms())
    assert available_norms() == sorted(available_norms())


@pytest.mark.parametrize("name", ["MC_LayerNorm", "mc-layernorm", "mclayernorm", " MC LayerNorm "])
def test_name_normalisation(name):
    assert normalize_name(name) == "mclayernorm"
    assert isinstance(create_norm(name, 8), MCLayerNorm)


@pytest.mark.parametrize(
    ("spec", "cls"),
    [
        ("layernorm", nn.LayerNorm),
        ("mclayernorm", MCLayerNorm),
        ("rmsnorm", nn.RMSNorm),
        ("batchnorm", FeatureBatchNorm),
        ("nomorelization", NoMorelization),
        ("identity", nn.Identity),
        ("none", nn.Identity),
        (None, nn.Identity),
        (NormSpec("none"), nn.Identity),
    ],
)
def test_create_each(spec, cls):
    layer = create_norm(spec, 12)
    assert isinstance(layer, cls)
    x = torch.randn(5, 12)
    assert layer(x).shape == x.shape
    x3 = torch.randn(5, 3, 12)
    assert layer(x3).shape == x3.shape


def test_create_from_normspec_class_and_partial():
    layer = create_norm(NormSpec("mclayernorm", {"fraction": 0.5}), 10)
    assert isinstance(layer, MCLayerNorm) and layer.subset_size == 5
    # call-site kwargs override the spec's
    assert (
        create_norm(NormSpec("mclayernorm", {"fraction": 0.5}), 10, fraction=0.3).subset_size == 3
    )
    assert isinstance(create_norm(nn.LayerNorm, 7), nn.LayerNorm)
    ln = create_norm(functools.partial(nn.LayerNorm, eps=1e-3), 7)
    assert ln.eps == 1e-3 and ln.normalized_shape == (7,)
    assert create_norm("layernorm", (3, 4)).normalized_shape == (3, 4)


def test_unknown_name_lists_all_names():
    with pytest.raises(ValueError) as info:
        create_norm("layrnorm", 8)
    msg = str(info.value)
    assert isinstance(info.value, CtrcalError)
    assert "layrnorm" in msg and "did you mean 'layernorm'" in msg
    for name in BUILTINS:
        assert name in msg


def test_unknown_kwarg_names_valid_ones():
    with pytest.raises(ConfigError, match="unknown argument 'frac'.*fraction"):
        create_norm("mclayernorm", 8, frac=0.5)


def test_bad_specs():
    with pytest.raises(TypeError):
        create_norm(nn.LayerNorm(4), 4)
    with pytest.raises(TypeError):
        create_norm(3.5, 4)


def test_register_custom_and_duplicates():
    class Half(nn.Module):
        def __init__(self, width, scale=0.5):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return x * self.scale

    register_norm("Test-Half-Norm", Half, aliases=("testhalf2",))
    try:
        assert "Test-Half-Norm" in available_norms()  # listed as registered
        assert create_norm("test_half_norm", 4, scale=0.25).scale == 0.25
        assert isinstance(create_norm("TestHalf2", 4), Half)
        with pytest.raises(ValueError, match="already registered"):
            register_norm("testhalfnorm", Half)
        with pytest.raises(ValueError, match="already registered"):
            register_norm("layernorm", Half)
    finally:
        NORMS.unregister("testhalfnorm")
    assert "testhalf2" not in NORMS  # its alias went with it


def test_register_as_decorator():
    try:

        @register_norm("testdecorated")
        class Decorated(nn.Identity):
            pass

        assert isinstance(create_norm("testdecorated", 3), Decorated)
    finally:
        NORMS.unregister("testdecorated")


def test_top_level_exports():
    assert ctrcal.create_norm is create_norm
    assert ctrcal.replace_norms is replace_norms
    assert ctrcal.available_norms is available_norms
    assert ctrcal.MCLayerNorm is MCLayerNorm


def test_config_accepts_registry_names():
    cfg = load_config(overrides=["model.net_norm=MC_LayerNorm"])
    assert isinstance(create_norm(cfg.model.net_norm, 16), MCLayerNorm)
    with pytest.raises(ConfigError, match="unknown norm"):
        load_config(overrides=["model.net_norm=layrnorm"])


# ---------------------------------------------------------------------------------------------
# batchnorm over features


def test_batchnorm_over_last_dim_features():
    torch.manual_seed(0)
    bn = create_norm("batchnorm", 4).train()
    x = torch.randn(32, 6, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 5
    y = bn(x)
    flat = y.reshape(-1, 4)
    torch.testing.assert_close(flat.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(flat.var(0, unbiased=False), torch.ones(4), atol=1e-3, rtol=0)
    # [B, N] is plain BatchNorm1d
    ref = nn.BatchNorm1d(4).train()
    x2 = torch.randn(16, 4)
    torch.testing.assert_close(create_norm("batchnorm", 4).train()(x2), ref(x2))
    with pytest.raises(ValueError, match="expects input"):
        bn(torch.randn(3, 5))


def test_batchnorm_over_tuple_width_and_state_dict():
    bn = create_norm("batchnorm", (3, 4)).train()
    x = torch.randn(64, 3, 4) * 3 + 2
    flat = bn(x).reshape(64, 12)
    torch.testing.assert_close(flat.mean(0), torch.zeros(12), atol=1e-5, rtol=0)
    ref = nn.BatchNorm1d(12)
    ref.load_state_dict(bn.state_dict())  # same names and shapes as BatchNorm1d
    with pytest.raises(ValueError, match="expects input"):
        bn(torch.randn(64, 12))


def test_batchnorm_eval_uses_running_stats():
    bn = create_norm("batchnorm", 3)
    for _ in range(50):
        bn(torch.randn(64, 3) * 2 + 1)
    bn.eval()
    x = torch.full((2, 3), 1.0)
    assert bn(x).abs().max() < 0.3


# ---------------------------------------------------------------------------------------------
# nomorelization


def test_nomorelization_noise_only_in_training():
    layer = create_norm("nomorelization", 8, gamma=0.5)
    assert [n for n, _ in layer.named_parameters()] == ["alpha", "beta"]
    x = torch.randn(1000, 8)
    layer.eval()
    torch.testing.assert_close(layer(x), x)
    layer.train()
    torch.manual_seed(0)
    noise = layer(x) - x
    assert abs(noise.mean().item()) < 0.02
    assert abs(noise.std().item() - 0.5) < 0.02
    with torch.no_grad():
        layer.alpha.fill_(2.0)
        layer.beta.fill_(1.0)
    torch.testing.assert_close(layer.eval()(x), 2 * x + 1)
    with pytest.raises(ConfigError):
        create_norm("nomorelization", 8, gamma=-1.0)


# ---------------------------------------------------------------------------------------------
# replace_norms


def _encoder() -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(
        layer, num_layers=2, norm=nn.LayerNorm(16), enable_nested_tensor=False
    )


def test_replace_norms_on_transformer_encoder():
    torch.manual_seed(0)
    model = _encoder()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    before = {n: p.clone() for n, p in model.named_parameters()}
    x = torch.randn(4, 7, 16)
    model.eval()
    with torch.no_grad():
        ref = model(x)
    n = replace_norms(model, "mclayernorm", fraction=0.5)
    assert n == 5  # 2 layers x (norm1, norm2) + final norm
    lns = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(lns) == 5 and all(isinstance(m, MCLayerNorm) for m in lns)
    after = dict(model.named_parameters())
    assert before.keys() == after.keys()
    for name, p in before.items():
        torch.testing.assert_close(after[name], p)
    # one-shot eval is exactly the old model; MC mode samples (also on the fused fast path)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref)
        with mc_mode(model) as mode:
            assert mode.count == 5
            a, b = model(x), model(x)
        assert not torch.allclose(a, b)
        torch.testing.assert_close(model(x), ref)
    # a second call finds no plain LayerNorm left
    assert replace_norms(model, "mclayernorm") == 0
    # and back, by explicit target type
    assert replace_norms(model, "layernorm", target=MCLayerNorm) == 5
    assert not any(isinstance(m, MCLayerNorm) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref)


def test_replace_norms_keeps_eps_train_flag_sharing_and_state_dict():
    shared = nn.LayerNorm(6, eps=1e-3)
    model = nn.Sequential(nn.Linear(6, 6), shared, nn.ReLU(), nn.ModuleList([shared]))
    model.eval()
    sd = model.state_dict()
    assert replace_norms(model, NormSpec("mclayernorm", {"fraction": 0.5})) == 1
    assert model[1] is model[3][0]
    assert model[1].eps == 1e-3 and not model[1].training
    model.load_state_dict(sd)  # same keys and shapes


def test_replace_norms_to_other_norms():
    model = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6, elementwise_affine=False))
    assert replace_norms(model, "rmsnorm") == 1
    assert isinstance(model[1], nn.RMSNorm) and model[1].weight is None  # inherits no-affine
    model = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6))
    assert replace_norms(model, "none") == 1
    assert isinstance(model[1], nn.Identity)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    assert replace_norms(model, "layernorm", target=nn.BatchNorm1d) == 1
    assert isinstance(model[1], nn.LayerNorm)


def test_replace_norms_leaves_layernorm_subclasses_by_default():
    class ChannelsFirstLN(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x.transpose(1, -1)).transpose(1, -1)

    model = nn.Sequential(ChannelsFirstLN(4), nn.LayerNorm(4))
    assert replace_norms(model, "mclayernorm") == 1
    assert type(model[0]) is ChannelsFirstLN
    assert replace_norms(model, "mclayernorm", target=ChannelsFirstLN) == 1


@pytest.mark.slow
def test_builtin_norms_are_listed_by_import_path_not_registered_by_import():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ctrcal.layers import registry\n"
        "names = registry.available_norms()\n"
        "assert 'mclayernorm' in names and 'groupnorm' in names, names\n"
        "assert 'ctrcal.layers.norms' not in sys.modules\n"
        "assert 'ctrcal.layers.mc_layernorm' not in sys.modules\n"
        "import ctrcal.layers.norms, ctrcal.layers.context\n"
        "assert registry.available_norms() == names  # importing registers nothing\n"
        "for name in names:\n"
        "    assert callable(registry.get_norm(name)), name\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_norm_registered_by_import_path_is_imported_when_built():
    register_norm("plain_ln_by_path", "torch.nn:LayerNorm", overwrite=True)
    assert isinstance(create_norm("plain-ln-by-path", 6), nn.LayerNorm)
    with pytest.raises(ValueError, match="package.module:Name"):
        register_norm("bad_path", "torch.nn.LayerNorm")
