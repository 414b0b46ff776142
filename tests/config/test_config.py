"""Strict YAML configs: shipped files load to the same values; mistakes name file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ctrcal.config import config_to_dict, dump_config
from ctrcal.config.load import config_from_dict
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.validate import load_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))
# every shipped config as it loaded before the config modules were split (same values since)
SNAPSHOTS = Path(__file__).resolve().parent / "config_snapshots"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _same_values(expected, got, key: str = "") -> list[str]:
    """Keys whose value differs; keys added since (a new option's default) are not compared."""
    if isinstance(expected, dict) and isinstance(got, dict):
        return [
            d
            for k, v in expected.items()
            for d in (
                _same_values(v, got[k], f"{key}.{k}".lstrip("."))
                if k in got
                else [f"{key}.{k} missing"]
            )
        ]
    return [] if expected == got else [f"{key}: {expected!r} -> {got!r}"]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_loads_to_the_same_values(path):
    # read with the model's defaults, without the checks (tests/test_validate.py runs them)
    expected = yaml.safe_load((SNAPSHOTS / path.name).read_text())
    got = config_to_dict(load_config(path, check_names=False))
    # report.variants are re-expressed by the calibration spec; compared by their own tests
    expected.pop("report"), got.pop("report")
    assert _same_values(expected, got) == []


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


# ---------------------------------------------------------------------------------------------
# Another model starts from its own defaults; an inherited key can be removed


def test_extends_with_another_model_starts_from_its_defaults(tmp_path):
    child = write(
        tmp_path,
        "dcn.yaml",
        f"extends: {CONFIG_DIR / 'demo.yaml'}\n"
        "model: {name: dcnv2, structure: stacked, dropout: 0.1}\n",
    )
    cfg = load_config(child)  # before: "model 'dcnv2' has no argument 'variant'"
    assert cfg.model.name == "dcnv2" and cfg.model.structure == "stacked"
    assert "variant" not in cfg.model.kwargs and "hidden_units" not in cfg.model.kwargs
    fresh = load_config(
        None, ["model.name=dcnv2", "model.structure=stacked", "model.dropout=0.1"]
    ).model
    assert cfg.model == fresh  # exactly DCNv2's defaults, nothing of the MaskNet base
    assert cfg.train == load_config(CONFIG_DIR / "demo.yaml").train  # the rest is inherited


def test_overriding_the_model_name_starts_from_its_defaults():
    demo = CONFIG_DIR / "demo.yaml"
    cfg = load_config(demo, ["model.name=dcnv2", "model.dropout=0.1"])
    assert cfg.model == load_config(None, ["model.name=dcnv2", "model.dropout=0.1"]).model
    # arguments set by other overrides are kept, in either order
    for order in (
        ["model.name=dnn", "model.hidden_units=[4]", "model.dropout=0.1"],
        ["model.hidden_units=[4]", "model.dropout=0.1", "model.name=dnn"],
    ):
        assert load_config(demo, order).model.hidden_units == [4]
    # the same model under another spelling keeps the base's arguments
    assert load_config(demo, ["model.name=MaskNet"]).model.hidden_units == [128, 128]


def test_another_norm_name_drops_the_base_norm_arguments(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  net_norm: {name: mclayernorm, fraction: 0.5}\n")
    top = write(
        tmp_path,
        "top.yaml",
        "extends: base.yaml\nmodel:\n  net_norm: {name: groupnorm, num_groups: 2}\n",
    )
    assert load_config(top).model.net_norm == NormSpec("groupnorm", {"num_groups": 2})
    same = write(
        tmp_path,
        "same.yaml",
        "extends: base.yaml\nmodel:\n  net_norm: {name: mclayernorm, eps: 1.0e-6}\n",
    )
    assert load_config(same).model.net_norm.kwargs == {"fraction": 0.5, "eps": 1e-6}


def test_delete_removes_an_inherited_key(tmp_path):
    write(
        tmp_path,
        "base.yaml",
        "model:\n  variant: parallel\n  block_dim: 8\n"
        "train:\n  finetune_from: runs/old\n  epochs: 3\n",
    )
    top = write(
        tmp_path,
        "top.yaml",
        "extends: base.yaml\nmodel:\n  variant: !delete\ntrain:\n  finetune_from: !delete\n",
    )
    cfg = load_config(top)
    assert cfg.model.variant == "serial"  # MaskNet's default again
    assert cfg.model.block_dim == 8 and cfg.train.epochs == 3  # the rest is inherited
    assert cfg.train.finetune_from is None
    # the same from the command line, two spellings
    base = tmp_path / "base.yaml"
    for item in ("~model.variant", "model.variant=!delete"):
        assert load_config(base, [item]).model.variant == "serial"
    # null is a value, not a removal
    assert load_config(base, ["model.emb_norm=null"]).model.emb_norm == NormSpec("none")


def test_deleting_a_key_of_the_model_being_replaced_is_fine(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  variant: parallel\n")
    top = write(
        tmp_path, "top.yaml", "extends: base.yaml\nmodel:\n  name: dnn\n  variant: !delete\n"
    )
    assert "variant" not in load_config(top).model.kwargs


def test_deleting_what_nothing_set_is_an_error(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  variant: parallel\n")
    top = write(tmp_path, "top.yaml", "extends: base.yaml\nmodel:\n  varaint: !delete\n")
    with pytest.raises(ConfigError, match=r"top\.yaml: model\.varaint: !delete .*no base sets"):
        load_config(top)
    with pytest.raises(ConfigError, match=r"override '~train\.lr': train\.lr: !delete"):
        load_config(tmp_path / "base.yaml", ["~train.lr"])
    alone = write(tmp_path, "alone.yaml", "train:\n  lr: !delete\n")
    with pytest.raises(ConfigError, match="no base sets it"):
        load_config(alone)
    with pytest.raises(ConfigError, match="takes no value"):
        load_config(write(tmp_path, "v.yaml", "train:\n  lr: !delete 3\n"))
