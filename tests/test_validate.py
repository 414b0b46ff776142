"""`ctrcal validate`: every data-free rule checked in one pass, naming file and key."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from ctrcal.cli import main
from ctrcal.config import load_config
from ctrcal.errors import ConfigError
from ctrcal.layers.spec import NormSpec, check_norm_spec, declared_norms, is_no_norm
from ctrcal.validation import Problems, check_config, register_check

ROOT = Path(__file__).resolve().parents[1]
BASE = """\
model:
  embedding_dim: 8
  hidden_units: [64, 3]
  net_norm: layernorm
train:
  epochs: 1
"""


def _write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("model.net_norm={name: mclayernorm, fracton: 0.8}",
         ["model.net_norm", "fracton", "did you mean 'fraction'"]),
        # fraction * N < 2 at the second MaskBlock only (N = 3)
        ("model.net_norm={name: mclayernorm, fraction: 0.5}",
         ["model.net_norm", "width 3", "fraction * N >= 2"]),
        ("model.emb_norm={name: mclayernorm, fraction: 0.2}", ["model.emb_norm", "width 8"]),
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


def test_shipped_configs_validate_without_torch_or_the_data_stack():
    # ctrcal's own models are bound against their constructors read from source, and the
    # Criteo schema is plain constants: validating loads neither torch nor the data libraries.
    configs = sorted((ROOT / "configs").glob("*.yaml"))
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        f"for c in {[str(c) for c in configs]!r}:\n"
        "    assert main(['validate', c]) == 0, c\n"
        "heavy = {'torch', 'numpy', 'polars', 'pandas', 'sklearn', 'scipy', 'matplotlib',"
        " 'pyarrow'}\n"
        "loaded = heavy & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_validate_binds_model_arguments_without_torch(tmp_path):
    # a misspelt argument of each built-in model fails naming the file and the key, and the
    # check imports neither torch nor the model's module
    cases = {
        "masknet": ("hiden_units: [8]", "hidden_units"),
        "dnn": ("hiden_units: [8]", "hidden_units"),
        "dcnv2": ("num_cros_layers: 2", "num_cross_layers"),
    }
    for name, (line, _) in cases.items():
        _write(tmp_path, f"model:\n  name: {name}\n  {line}\n", f"{name}.yaml")
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        f"for name in {list(cases)!r}:\n"
        f"    assert main(['validate', {str(tmp_path)!r} + f'/{{name}}.yaml']) == 2\n"
        "loaded = {'torch', 'ctrcal.models.masknet', 'ctrcal.models.dnn', 'ctrcal.models.dcnv2'}"
        " & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 3, res.stderr
    for line, (name, (arg, closest)) in zip(lines, cases.items(), strict=True):
        key = arg.split(":")[0]
        assert line.startswith(f"ctrcal validate: error: {tmp_path / name}.yaml: model.{key}: ")
        assert f"did you mean {closest!r}" in line, line


def test_model_domain_checks_apply_whatever_the_spelling_of_the_name(tmp_path, capsys):
    path = _write(tmp_path, BASE)
    assert main(["validate", str(path), "model.name=MaskNet", "model.hidden_units=[8, 0]"]) == 2
    assert "model.hidden_units[1]: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_help_imports_nothing_heavy():
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = {'torch', 'numpy', 'pandas', 'polars'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_a_plugged_in_check_runs_and_names_its_key():
    def batch_multiple_of_64(cfg, problems: Problems) -> None:
        if cfg.train.batch_size % 64:
            problems.add("train.batch_size", "expected a multiple of 64")

    register_check("test_multiple_of_64", batch_multiple_of_64, overwrite=True)
    try:
        cfg = load_config(None, check_names=False, overrides=["train.batch_size=100"])
        problems = check_config(cfg, "x.yaml")
        assert [str(p) for p in problems] == [
            "override 'train.batch_size=100': train.batch_size: expected a multiple of 64"
        ]
        with pytest.raises(ConfigError, match="multiple of 64"):
            load_config(None, ["train.batch_size=100"])
    finally:
        from ctrcal import validation

        validation._CHECKS.pop("test_multiple_of_64")


def test_every_registered_norm_declares_its_config_arguments():
    from ctrcal.layers.registry import available_norms, get_norm

    declared = declared_norms()
    for name in available_norms():
        assert name in declared, f"norm {name!r} has no declare_norm_args(...) in layers.spec"
        params = list(inspect.signature(get_norm(name)).parameters.values())[1:]
        settable = {
            p.name for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("device", "dtype", "generator")  # not expressible in YAML
        }  # fmt: skip
        assert set(declared[name].params) == settable, name


def test_norm_checks_agree_with_building_the_layer():
    from ctrcal.layers.registry import create_norm

    cases = [
        (NormSpec("mclayernorm", {"fraction": 0.25}), 8),  # k = 2: fine
        (NormSpec("mclayernorm", {"fraction": 0.2}), 8),  # f*N = 1.6 < 2
        (NormSpec("mclayernorm", {"fraction": 1.5}), 8),
        (NormSpec("layernorm", {"epsilon": 1e-5}), 8),
        (NormSpec("MC-LayerNorm", {"fraction": 0.5}), 4),
    ]
    for spec, width in cases:
        try:
            create_norm(spec, width)
            built = True
        except ValueError:
            built = False
        try:
            check_norm_spec(spec, width)
            checked = True
        except ValueError:
            checked = False
        assert built == checked, spec


def test_one_no_norm_predicate():
    import torch

    for spec in (None, False, "none", "NONE", "Identity", "identity", NormSpec("Identity"),
                 NormSpec("none"), torch.nn.Identity, torch.nn.Identity(),
                 {"name": "None"}, {"name": "identity"}):  # fmt: skip
        assert is_no_norm(spec), spec
    for spec in ("layernorm", NormSpec("mclayernorm"), torch.nn.LayerNorm,
                 {"name": "contextnorm", "field": "C14"}, {"fraction": 0.8}):  # fmt: skip
        assert not is_no_norm(spec), spec


def test_every_model_asks_the_one_no_norm_predicate():
    from ctrcal.models.dcnv2 import DCNv2
    from ctrcal.models.dnn import DNN
    from ctrcal.models.masknet import MaskNet

    for cls in (MaskNet, DNN, DCNv2):
        for spec in ("Identity", {"name": "none"}, "layernorm"):
            model = cls([5, 7], 2, embedding_dim=4, emb_norm=spec)
            assert (model.emb_norm is None) == is_no_norm(spec), (cls.__name__, spec)
    assert NormSpec("Identity").is_none  # the dataclass's property asks the same function
