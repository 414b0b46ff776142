"""Strict YAML configs: every shipped file validates; mistakes name file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrcal.config import (
    Config,
    NormSpec,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
)
from ctrcal.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_shipped_configs_exist():
    assert any(p.name == "demo.yaml" for p in SHIPPED)


def test_defaults_without_file():
    cfg = load_config(None)
    assert cfg.train.batch_size > 0
    assert cfg.model.net_norm == NormSpec("layernorm")


def test_unknown_key_names_file_key_and_closest(tmp_path):
    path = write(tmp_path, "typo.yaml", "model:\n  hiden_units: [8, 8]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "model.hiden_units" in msg
    assert "hidden_units" in msg and "did you mean" in msg


def test_unknown_section(tmp_path):
    path = write(tmp_path, "typo.yaml", "trian:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"trian.*did you mean 'train'"):
        load_config(path)


def test_wrong_type_names_expected(tmp_path):
    path = write(tmp_path, "bad.yaml", "train:\n  batch_size: lots\n")
    with pytest.raises(ConfigError, match=r"train\.batch_size: expected an integer, got 'lots'"):
        load_config(path)


def test_bool_is_not_an_int(tmp_path):
    path = write(tmp_path, "bad.yaml", "train:\n  epochs: true\n")
    with pytest.raises(ConfigError, match="train.epochs"):
        load_config(path)


def test_int_accepted_for_float_and_yaml11_exponent(tmp_path):
    path = write(tmp_path, "ok.yaml", "train:\n  lr: 1\n  min_lr: 1e-6\n")
    cfg = load_config(path)
    assert cfg.train.lr == 1.0 and cfg.train.min_lr == pytest.approx(1e-6)


def test_literal_choice_suggests(tmp_path):
    path = write(tmp_path, "bad.yaml", "model:\n  variant: paralel\n")
    with pytest.raises(ConfigError, match=r"model\.variant.*did you mean 'parallel'"):
        load_config(path)


def test_missing_required_key(tmp_path):
    path = write(tmp_path, "bad.yaml", "report:\n  variants:\n    - net_norm: layernorm\n")
    with pytest.raises(ConfigError, match=r"report\.variants\[0\]\.name: missing required key"):
        load_config(path)


def test_unknown_norm_name_lists_choices(tmp_path):
    pytest.importorskip("ctrcal.layers.registry")
    path = write(tmp_path, "bad.yaml", "model:\n  net_norm: layernrom\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "model.net_norm" in msg and "layernorm" in msg and "mclayernorm" in msg


def test_norm_spec_mapping(tmp_path):
    path = write(tmp_path, "ok.yaml", "model:\n  net_norm: {name: mclayernorm, fraction: 0.5}\n")
    cfg = load_config(path)
    assert cfg.model.net_norm == NormSpec("mclayernorm", {"fraction": 0.5})


def test_extends_merges_and_reports_the_right_file(tmp_path):
    write(tmp_path, "base.yaml", "train:\n  lr: 0.5\n  epochs: 3\nmodel:\n  dropout: 0.1\n")
    (tmp_path / "sub").mkdir()
    child = write(tmp_path / "sub", "child.yaml", "extends: ../base.yaml\ntrain:\n  epochs: 7\n")
    cfg = load_config(child)
    assert cfg.train.lr == 0.5 and cfg.train.epochs == 7 and cfg.model.dropout == 0.1

    write(tmp_path, "base.yaml", "train:\n  lrr: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(child)
    assert "base.yaml" in str(err.value) and "train.lrr" in str(err.value)


def test_extends_cycle_and_missing_base(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path, "c.yaml", "extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_config(tmp_path / "c.yaml")


def test_overrides_parse_yaml_values(tmp_path):
    path = write(tmp_path, "ok.yaml", "train:\n  lr: 0.5\n")
    cfg = load_config(path, ["train.lr=1e-4", "model.hidden_units=[8,8]", "train.compile=true"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.model.hidden_units == [8, 8]
    assert cfg.train.compile is True


def test_override_errors(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match=r"override.*train\.lrr.*did you mean 'lr'"):
        load_config(None, ["train.lrr=0.1"])


def test_invalid_yaml_names_line(tmp_path):
    path = write(tmp_path, "broken.yaml", "train:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml.*line \d+.*invalid YAML"):
        load_config(path)


def test_unsafe_yaml_rejected(tmp_path):
    path = write(tmp_path, "evil.yaml", "train: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)


def test_snapshot_round_trip(tmp_path):
    cfg = load_config(None, ["model.net_norm={name: mclayernorm, fraction: 0.25}"])
    again = config_from_dict(config_to_dict(cfg))
    assert again == cfg
    path = write(tmp_path, "snap.yaml", dump_config(cfg))
    assert load_config(path) == cfg
