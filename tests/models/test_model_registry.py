"""The model registry: names, import paths, argument binding, the user-model contract."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
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
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.models.build import create_model
from ctrcal.models.masknet import MaskNet
from ctrcal.models.registry import available_models, register_model, resolve_model
from ctrcal.validate import load_config

TINY_PATH = "tiny_user_model:TinyCTR"


def _fm() -> SimpleNamespace:
    return SimpleNamespace(
        vocab_sizes=[9] * NUM_CATEGORICAL,
        categorical_fields=list(CATEGORICAL_COLUMNS),
        numeric_fields=list(NUMERIC_COLUMNS),
        bucket_boundaries=None,
    )


def _inputs(rows: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    cat = torch.randint(0, 9, (rows, NUM_CATEGORICAL), generator=g)
    return cat, torch.randn(rows, NUM_NUMERIC, generator=g)


def test_builtin_models_are_registered():
    assert {"masknet", "dcnv2", "dnn"} <= set(available_models())
    assert resolve_model("DCN-v2").name == "dcnv2"  # names are normalised


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown model 'dcn_v3'.*did you mean 'dcnv2'"):
        resolve_model("dcn_v3")


def test_masknet_keeps_its_state_dict_keys_and_outputs():
    torch.manual_seed(0)
    direct = MaskNet([9] * NUM_CATEGORICAL, NUM_NUMERIC, embedding_dim=4, hidden_units=[8])
    torch.manual_seed(0)
    built = create_model(ModelConfig(embedding_dim=4, hidden_units=[8]), _fm())
    assert type(built) is MaskNet
    assert list(built.state_dict()) == list(direct.state_dict())
    batch = Batch(*_inputs(), None)
    direct.eval(), built.eval()
    assert torch.equal(direct(batch), built(batch))


def test_user_model_by_import_path_is_built_as_it_is_and_gets_its_kwargs():
    from tiny_user_model import TinyCTR

    model = create_model(ModelConfig(TINY_PATH, hidden=12), _fm())
    assert type(model) is TinyCTR  # no wrapper: the user's module, called as model(batch)
    assert model.net[0].out_features == 12
    out = model(Batch(*_inputs(), None))
    assert out.shape == (5,) and out.dtype == torch.float32


def test_register_model_from_python():
    from tiny_user_model import TinyCTR

    register_model("tiny_registered", TinyCTR, overwrite=True)
    model = create_model("tiny-registered", _fm(), dim=2)
    assert model.tables[0].embedding_dim == 2
    with pytest.raises(ValueError, match="already registered"):
        register_model("tiny_registered", TinyCTR)


def test_net_norm_replaces_every_layernorm_of_a_foreign_model():
    spec = NormSpec("mclayernorm", {"fraction": 0.5})
    model = create_model(ModelConfig(TINY_PATH, net_norm=spec), _fm())
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, MCLayerNorm))]
    assert len(norms) == 2 and all(type(m) is MCLayerNorm for m in norms)
    assert all(m.fraction == 0.5 for m in norms)
    plain = create_model(ModelConfig(TINY_PATH, net_norm="layernorm"), _fm())
    assert sum(type(m) is nn.LayerNorm for m in plain.modules()) == 2


def test_net_norm_on_a_model_without_layernorm_is_an_error():
    with pytest.raises(ConfigError, match="no nn.LayerNorm to replace"):
        create_model(ModelConfig("tiny_user_model:NoLayerNorm", net_norm="mclayernorm"), _fm())


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("tiny_user_model:WrongShape", r"shape \[2, 1\].*expected logits of shape \[B\]"),
        ("tiny_user_model:WrongDtype", r"dtype torch.int64; expected floating-point"),
        ("tiny_user_model:NotAModule", r"not a torch.nn.Module subclass"),
        ("tiny_user_model:TinyCRT", r"has no attribute 'TinyCRT'; did you mean 'TinyCTR'"),
        ("no_such_package.models:Net", r"cannot import module 'no_such_package.models'"),
        ("tiny_user_model", r"unknown model"),
    ],
)
def test_contract_violations_are_clear_errors(path, match):
    with pytest.raises(ConfigError, match=match):
        create_model(ModelConfig(path), _fm())


def test_forward_that_raises_is_reported_as_a_contract_failure():
    class Broken(nn.Module):
        def __init__(self, feature_map):
            super().__init__()

        def forward(self, batch):
            return batch.label.sum()  # labels are not given to models

    with pytest.raises(ConfigError, match="forward on a 2-row probe batch failed"):
        create_model(Broken, _fm())


def test_the_probe_leaves_the_rng_and_training_flag_alone():
    model = create_model(ModelConfig(TINY_PATH), _fm(), check=False)
    from ctrcal.models.build import check_model_output

    model.train()
    torch.manual_seed(3)
    check_model_output(model, _fm())
    after = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(1)) and model.training


def _write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_validate_names_file_and_key_of_a_model_argument_typo(tmp_path):
    path = _write(tmp_path, "model:\n  name: dcnv2\n  num_cross_layer: 2\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: model.num_cross_layer: .*'num_cross_layers'"):
        load_config(path)


def test_validate_checks_model_argument_types_and_choices(tmp_path):
    path = _write(tmp_path, "model:\n  name: dcnv2\n  structure: paralel\n")
    with pytest.raises(ConfigError, match=r"model.structure: .*did you mean 'parallel'"):
        load_config(path)
    path = _write(tmp_path, "model:\n  name: dnn\n  hidden_units: [64, big]\n")
    with pytest.raises(ConfigError, match=r"model.hidden_units\[1\]: expected an integer"):
        load_config(path)


def test_validate_checks_norm_arguments(tmp_path):
    path = _write(tmp_path, "model:\n  name: dnn\n  net_norm: {name: contextnorm}\n")
    with pytest.raises(ConfigError, match=r"model.net_norm: ContextNorm.*argument: 'field'"):
        load_config(path)
    path = _write(tmp_path, "model:\n  name: dnn\n  emb_norm: {name: groupnorm, group: 2}\n")
    with pytest.raises(ConfigError, match=r"model.emb_norm: .*did you mean 'num_groups'"):
        load_config(path)


def test_validate_resolves_import_paths(tmp_path):
    path = _write(tmp_path, "model:\n  name: tiny_user_model:TinyCTR\n  hiden: 3\n")
    with pytest.raises(ConfigError, match=r"model.hiden: .*did you mean 'hidden'"):
        load_config(path)
    cfg = load_config(_write(tmp_path, "model:\n  name: tiny_user_model:TinyCTR\n"))
    assert cfg.model.kwargs == {"dim": 4, "hidden": 16}  # the model's defaults filled in


def test_old_masknet_configs_load_unchanged(tmp_path):
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "criteo_x1.yaml")
    assert cfg.model.name == "masknet" and cfg.model.variant == "serial"
    assert cfg.model.net_norm == NormSpec("layernorm") and cfg.model.hidden_units == [400] * 3
    path = _write(tmp_path, "model:\n  name: dnn\n  variant: serial\n")
    with pytest.raises(ConfigError, match="model 'dnn' has no argument 'variant'"):
        load_config(path)


def test_a_variant_norm_at_a_position_the_model_lacks_is_an_error(tmp_path):
    text = (
        "model: {name: tiny_user_model:TinyCTR}\n"
        "report:\n  variants:\n    - {name: ln, net_norm: layernorm, emb_norm: layernorm}\n"
    )
    with pytest.raises(ConfigError, match=r"report.variants\[0\].emb_norm: .*no emb_norm position"):
        load_config(_write(tmp_path, text))


def test_norm_positions_take_names_mappings_and_classes():
    import functools

    specs = [
        "mclayernorm",
        {"name": "mclayernorm", "fraction": 0.5},
        functools.partial(MCLayerNorm, fraction=0.5),
    ]
    for spec in specs:
        user = create_model(ModelConfig(TINY_PATH, net_norm=spec), _fm())
        dnn = create_model(
            ModelConfig("dnn", embedding_dim=2, hidden_units=[4], net_norm=spec), _fm()
        )
        for model in (user, dnn):
            assert any(type(m) is MCLayerNorm for m in model.modules())


# ---------------------------------------------------------------------------------------------
# A config's import path names a model class, and nothing else is ever called


def _writer_module(tmp_path: Path, monkeypatch) -> Path:
    """A module whose function would write a file if anything called it."""
    marker = tmp_path / "called.txt"
    (tmp_path / "sneaky_models.py").write_text(
        "from pathlib import Path\n"
        f"MARKER = Path({str(marker)!r})\n"
        "def make_model(feature_map, **kwargs):\n"
        "    MARKER.write_text('called')\n"
        "    raise SystemExit('must never run')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize("target", ["os:system", "sneaky_models:make_model"])
def test_validate_and_train_refuse_a_non_module_import_path_uncalled(
    target, tmp_path, monkeypatch, capsys, prepared_dir
):
    from ctrcal.cli import main

    marker = _writer_module(tmp_path, monkeypatch)
    cfg = _write(tmp_path, f"model: {{name: '{target}'}}\n")
    for argv in (
        ["validate", str(cfg)],
        ["train", str(cfg), "--data", str(prepared_dir), "--out", str(tmp_path / "r")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "model.name" in err and "must name an nn.Module subclass" in err, err
        assert "was not called" in err and "Traceback" not in err
    assert not marker.exists()
    assert not (tmp_path / "r" / "checkpoints").exists()
    with pytest.raises(ConfigError, match="nn.Module subclass"):
        create_model(target, _fm())  # from Python too, when named by a path
    assert not marker.exists()


def test_a_python_factory_stays_available_through_register_model(tmp_path, monkeypatch):
    from tiny_user_model import TinyCTR

    marker = _writer_module(tmp_path, monkeypatch)

    def factory(feature_map, hidden: int = 8):
        return TinyCTR(feature_map, hidden=hidden)

    register_model("tiny_factory", factory, overwrite=True)
    model = create_model("tiny_factory", _fm(), hidden=4)
    assert isinstance(model, TinyCTR)
    cfg = load_config(None, ["model.name=tiny_factory", "model.hidden=4"])
    assert cfg.model.kwargs == {"hidden": 4}
    # a function the caller registered may be named by its import path as well
    import sneaky_models

    monkeypatch.setattr(sneaky_models, "make_model", factory)
    register_model("sneaky", "sneaky_models:make_model", overwrite=True)
    assert isinstance(create_model("sneaky_models:make_model", _fm()), TinyCTR)
    assert not marker.exists()


def test_a_factory_given_from_python_is_named_by_its_path_afterwards(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "given_factory.py").write_text(
        "from tiny_user_model import TinyCTR\n"
        "def build(feature_map, hidden: int = 8):\n"
        "    return TinyCTR(feature_map, hidden=hidden)\n"
    )
    import given_factory
    from tiny_user_model import TinyCTR

    with pytest.raises(ConfigError, match="nn.Module subclass"):
        resolve_model("given_factory:build")  # a config cannot name it on its own ...
    entry = resolve_model(given_factory.build)  # ... until Python hands it over
    assert resolve_model("given_factory:build") is entry
    assert isinstance(create_model("given_factory:build", _fm(), hidden=4), TinyCTR)
