"""`ctrcal validate`: every data-free rule checked in one pass, naming file and key; the model
is built on the meta device, so its constructor (and each norm's) is the one judge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ctrcal.cli import main
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec, is_no_norm
from ctrcal.validate import CHECKS, Problems, check_config, load_config, register_check

ROOT = Path(__file__).resolve().parents[1]
# every whole config: configs/*.yaml, and the protocols that name their data (the others,
# such as configs/protocols/paper.yaml, are fragments other configs extend)
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted(
    p
    for p in (ROOT / "configs" / "protocols").glob("*.yaml")
    if "data" in (yaml.safe_load(p.read_text()) or {})
)
BASE = """\
model:
  embedding_dim: 8
  hidden_units: [64, 3]
  net_norm: layernorm
train:
  epochs: 1
"""


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path, capsys):
    """The one place each shipped config meets every check (the model built on the meta
    device, the report planned); other tests read them with ``check_names=False``."""
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{path}: OK (model ")


def _write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (
            "model.net_norm={name: mclayernorm, fracton: 0.8}",
            ["model.net_norm", "fracton", "did you mean 'fraction'"],
        ),
        # fraction * N < 2 at the second MaskBlock only (N = 3)
        (
            "model.net_norm={name: mclayernorm, fraction: 0.5}",
            ["model.net_norm", "N=3", "fraction * N >= 2"],
        ),
        ("model.emb_norm={name: mclayernorm, fraction: 0.2}", ["model.emb_norm", "N=8"]),
        ("model.hidden_units=[8, 0]", ["model.hidden_units[1]", ">= 1", "got 0"]),
        ("model.reduction_ratio=0", ["model.reduction_ratio"]),
        ("model.net_norm={name: groupnorm, num_groups: 5}", ["model.net_norm", "divide"]),
        ("data.split=[0.8, 0.3, 0.1]", ["data.split", "sum to 1", "[0.8, 0.3, 0.1]", "1.2"]),
        ("train.batch_size=0", ["train.batch_size", ">= 1", "got 0"]),
        ("train.lr=-0.001", ["train.lr", "-0.001"]),
        ("train.lr=.nan", ["train.lr", "nan"]),
        ("train.eval_batch_size=0", ["train.eval_batch_size"]),
        ("train.lr_factor=0", ["train.lr_factor"]),
        ("train.device=gpu", ["train.device", "'gpu'"]),
        ("report.intensities=[0.0, -0.1]", ["report", "-0.1"]),
        ("report.seeds=0", ["report.seeds"]),
        ("model.dropout=1.0", ["model.dropout"]),
        ("model.net_norm={name: batchnorm, momentum: 2}", ["model.net_norm", "momentum"]),
        ("model.net_norm={name: nomorelization, gamma: -1}", ["model.net_norm", "gamma"]),
        ("features.min_count=0", ["features.min_count"]),
    ],
)
def test_validate_names_file_and_key(tmp_path, capsys, override, words):
    path = _write(tmp_path, BASE)
    assert main(["validate", str(path), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("ctrcal validate: error: ") for line in err)
    text = "\n".join(err)
    assert f"override {override!r}" in text or str(path) in text
    for word in words:
        assert word in text, (word, text)


def test_validate_reports_every_problem_with_the_file_that_set_it(tmp_path, capsys):
    base = _write(tmp_path, BASE, "base.yaml")
    top = _write(
        tmp_path,
        "extends: base.yaml\nmodel:\n  net_norm: {name: mclayernorm, fracton: 0.8}\n"
        "train:\n  batch_size: 0\n",
        "top.yaml",
    )
    assert main(["validate", str(top), "train.lr=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert any(f"{top}: model.net_norm" in line and "fracton" in line for line in err)
    assert any(f"{top}: train.batch_size" in line for line in err)
    assert any("override 'train.lr=-1': train.lr" in line for line in err)
    # epochs: 1 came from base.yaml and is fine; a problem there would name base.yaml
    assert main(["validate", str(top), "train.epochs=0"]) == 2
    assert f"{base}: train.epochs" not in capsys.readouterr().err  # set by the override


def test_split_fractions_sum_to_one_or_are_whole_proportions():
    for ok in ("[0.8, 0.1, 0.1]", "[0.7, 0.2, 0.1]", "[22, 1, 1]", "[1, 0, 0]"):
        assert load_config(None, [f"data.split={ok}"]).data.split
    for bad in ("[0.8, 0.3, 0.1]", "[0.5, 0.2, 0.1]", "[8, 1, 0.5]"):
        with pytest.raises(ConfigError, match=r"data\.split: .*must sum to 1"):
            load_config(None, [f"data.split={bad}"])


def test_validate_binds_model_arguments_against_the_constructors(tmp_path, capsys):
    # a misspelt argument of each built-in model fails naming the file, the key and the
    # closest argument of the model's own constructor
    cases = {
        "masknet": ("hiden_units: [8]", "hidden_units"),
        "dnn": ("hiden_units: [8]", "hidden_units"),
        "dcnv2": ("num_cros_layers: 2", "num_cross_layers"),
    }
    for name, (line, closest) in cases.items():
        path = _write(tmp_path, f"model:\n  name: {name}\n  {line}\n", f"{name}.yaml")
        assert main(["validate", str(path)]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        key = line.split(":")[0]
        assert err.startswith(f"ctrcal validate: error: {path}: model.{key}: "), err
        assert f"did you mean {closest!r}" in err, err


def test_validate_builds_the_model_on_the_meta_device(tmp_path, capsys):
    # widths whose weights would need ~80 GB: only a meta build validates them at once
    path = _write(tmp_path, BASE)
    assert main(["validate", str(path), "model.hidden_units=[100000, 100000, 100000]"]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.slow
def test_meta_builds_skip_init_there_only_and_load_no_compiler():
    code = (
        "import sys, torch\nfrom ctrcal.cli import main\n"
        "assert main(['validate', 'configs/demo.yaml']) == 0\n"
        "assert 'torch._dynamo' not in sys.modules  # init on meta would import it\n"
        "from ctrcal.models.masknet import MaskNet\n"
        "torch.manual_seed(0)\n"
        "w = MaskNet([5, 7], 2, embedding_dim=4, hidden_units=[8]).head.weight\n"
        "assert w.abs().sum() > 0 and not w.is_meta  # ordinary builds initialise as before\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_user_model_constructor_decides_and_is_named_by_key(tmp_path, capsys, monkeypatch):
    (tmp_path / "pickyctr.py").write_text(
        "from torch import nn\n"
        "class Picky(nn.Module):\n"
        "    def __init__(self, feature_map, width: int = 4):\n"
        "        super().__init__()\n"
        "        if width % 2:\n"
        "            raise ValueError(f'width: expected an even number, got {width}')\n"
        "        self.net = nn.Sequential(nn.Linear(13, width), nn.LayerNorm(width))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write(tmp_path, "model: {name: 'pickyctr:Picky', width: 3}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ctrcal validate: error: {path}: model.width: expected an even number, got 3"
    # a report variant's norm is checked at the width the model gives it (N = 4 here)
    ok = _write(tmp_path, "model: {name: 'pickyctr:Picky'}\n", "ok.yaml")
    bad_variant = "report.variants=[{name: a, net_norm: {name: mclayernorm, fraction: 0.4}}]"
    assert main(["validate", str(ok), bad_variant]) == 2
    err = capsys.readouterr().err
    assert "report.variants[0].net_norm" in err and "N=4" in err


def test_each_variant_norm_is_blamed_on_its_own_key(tmp_path, capsys):
    path = _write(tmp_path, BASE)
    variants = (
        "report.variants=[{name: a, net_norm: layernorm}, "
        "{name: b, net_norm: {name: mclayernorm, fracton: 0.5}}]"
    )
    assert main(["validate", str(path), variants]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "report.variants[1].net_norm" in err and "did you mean 'fraction'" in err


def test_model_domain_checks_apply_whatever_the_spelling_of_the_name(tmp_path, capsys):
    path = _write(tmp_path, BASE)
    assert main(["validate", str(path), "model.name=MaskNet", "model.hidden_units=[8, 0]"]) == 2
    assert "model.hidden_units[1]: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_a_plugged_in_check_runs_and_names_its_key():
    def batch_multiple_of_64(cfg, problems: Problems) -> None:
        if cfg.train.batch_size % 64:
            problems.add("train.batch_size", "expected a multiple of 64")

    register_check("test_multiple_of_64", batch_multiple_of_64, overwrite=True)
    try:
        cfg = load_config(None, check_names=False, overrides=["train.batch_size=100"])
        problems = check_config(cfg)
        assert [str(p) for p in problems] == [
            "override 'train.batch_size=100': train.batch_size: expected a multiple of 64"
        ]
        with pytest.raises(ConfigError, match="multiple of 64"):
            load_config(None, ["train.batch_size=100"])
    finally:
        CHECKS.unregister("test_multiple_of_64")


def test_one_no_norm_predicate():
    import torch

    for spec in (
        None,
        False,
        "none",
        "NONE",
        "Identity",
        "identity",
        NormSpec("Identity"),
        NormSpec("none"),
        torch.nn.Identity,
        torch.nn.Identity(),
        {"name": "None"},
        {"name": "identity"},
    ):
        assert is_no_norm(spec), spec
    for spec in (
        "layernorm",
        NormSpec("mclayernorm"),
        torch.nn.LayerNorm,
        {"name": "contextnorm", "field": "C14"},
        {"fraction": 0.8},
    ):
        assert not is_no_norm(spec), spec


def test_every_model_asks_the_one_no_norm_predicate():
    from ctrcal.models.dcnv2 import DCNv2
    from ctrcal.models.dnn import DNN
    from ctrcal.models.masknet import MaskNet

    for cls in (MaskNet, DNN, DCNv2):
        for spec in ("Identity", {"name": "none"}, "layernorm"):
            model = cls([5, 7], 2, embedding_dim=4, emb_norm=spec)
            assert (model.emb_norm is None) == is_no_norm(spec), (cls.__name__, spec)


def test_a_user_model_sees_a_real_feature_map_in_validate(tmp_path, monkeypatch, capsys):
    # a user model by import path that reads FeatureMap properties and statistics: the meta
    # build hands it the same class as training does, so `validate` answers OK, not a traceback
    (tmp_path / "fm_reading_model.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "SEEN = []\n"
        "class FieldCounter(nn.Module):\n"
        "    def __init__(self, feature_map, dim: int = 4):\n"
        "        super().__init__()\n"
        "        SEEN.append((type(feature_map).__name__, feature_map.num_numeric,\n"
        "                     feature_map.num_categorical, len(feature_map.numeric_std),\n"
        "                     feature_map.bucket_boundaries is not None))\n"
        "        width = feature_map.num_numeric + feature_map.num_categorical * dim\n"
        "        self.tables = nn.ModuleList(nn.Embedding(v, dim)\n"
        "                                    for v in feature_map.vocab_sizes)\n"
        "        self.norm = nn.LayerNorm(width)  # the report's variants replace it\n"
        "        self.head = nn.Linear(width, 1)\n"
        "    def forward(self, batch):\n"
        "        emb = [t(batch.categorical[:, i]) for i, t in enumerate(self.tables)]\n"
        "        x = self.norm(torch.cat([batch.numeric, *emb], dim=1))\n"
        "        return self.head(x).squeeze(-1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write(tmp_path, "model: {name: 'fm_reading_model:FieldCounter', dim: 3}\n")
    assert main(["validate", str(path), "features.numeric_buckets=4"]) == 0, capsys.readouterr()
    assert "OK" in capsys.readouterr().out
    import fm_reading_model

    # Criteo: 13 numeric fields, 26 categorical ones, bucket boundaries from numeric_buckets
    assert fm_reading_model.SEEN and set(fm_reading_model.SEEN) == {
        ("FeatureMap", 13, 26, 13, True)
    }


def test_data_bounds_have_one_statement_the_data_code_asks():
    from ctrcal.core.errors import DataError
    from ctrcal.preparation.features import FeaturePipeline
    from ctrcal.preparation.fit_stats import FitStats
    from ctrcal.preparation.parse import check_on_bad_row
    from ctrcal.preparation.splits import check_fractions

    # the split rule: fractions that sum to 1 or whole-number proportions, normalised
    assert check_fractions([22, 1, 1]) == [22 / 24, 1 / 24, 1 / 24]
    assert check_fractions([0.7, 0.2, 0.1]) == pytest.approx([0.7, 0.2, 0.1])
    for bad in ([0.8, 0.3, 0.1], [0.0, 0.5, 0.5], [0.5, 0.5], [-1, 1, 1]):
        with pytest.raises(DataError, match=r"^data\.split: "):
            check_fractions(bad)
    # the pipeline refuses what the rule book refuses, with the same words
    with pytest.raises(DataError, match=r"^min_count: expected an integer >= 1, got 0"):
        FeaturePipeline(min_count=0).fit_stats(FitStats([], []))
    (problem,) = check_config(load_config(None, ["features.min_count=0"], check_names=False))
    assert problem.key == "features.min_count"
    assert problem.message == "expected an integer >= 1, got 0"
    with pytest.raises(DataError, match="on_bad_row must be 'error' or 'skip', got 'drop'"):
        check_on_bad_row("drop")
    assert check_on_bad_row("skip") == "skip"


def test_a_data_only_config_has_its_data_checked_and_no_model(tmp_path, capsys):
    # what `prepare --config` reads: only its sections are checked (the data and features
    # checks, as prepare checks them); the default model, which it never asked for, is not
    path = _write(tmp_path, "data: {synthetic: {rows: 2000, seed: 0}}\nfeatures: {min_count: 2}\n")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out.strip()
    assert (
        out == f"{path}: OK (data only: its data and features checked; no model, train or report)"
    )
    assert main(["validate", str(path), "features.min_count=0", "data.split=[0.8, 0.3, 0.1]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(
        line.startswith("ctrcal validate: error: override") for line in err
    )
    assert "features.min_count" in err[1] and "must sum to 1" in err[0]
    # a model key, from an override or a base file, makes it a config with a model: all checked
    assert main(["validate", str(path), "model.hidden_units=[8, 0]"]) == 2
    assert "model.hidden_units[1]" in capsys.readouterr().err
    _write(tmp_path, BASE, "base.yaml")
    child = _write(tmp_path, "extends: base.yaml\nfeatures: {min_count: 2}\n", "child.yaml")
    assert main(["validate", str(child)]) == 0
    assert capsys.readouterr().out.startswith(f"{child}: OK (model masknet")
