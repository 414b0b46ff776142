"""From a run to a served probability: ``ctrcal export`` writes the model and the encoding,
a server encodes raw rows with that folder alone and runs the exported graph."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctrcal.cli import main
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.serving import export as export_mod
from ctrcal.serving import formats as formats_mod
from ctrcal.serving.encoding import RawRowEncoder

DAC_COLUMNS = [LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS]


def _raw_rows(path):
    """The rows of a dac file as a server gets them: ``{column: text}``."""
    lines = path.read_text().splitlines()
    return [dict(zip(DAC_COLUMNS, line.split("\t"), strict=True)) for line in lines]


def _served_probabilities(raw_run, tmp_path):
    out = tmp_path / "p.parquet"
    assert main(["predict", str(raw_run["run"]), str(raw_run["test"]), "--out", str(out)]) == 0
    return pq.read_table(out).column("prob").to_numpy()


def test_pt2_on_raw_rows_encoded_with_the_exported_folder(raw_run, tmp_path):
    model = tmp_path / "served" / "model.pt2"
    argv = ["export", str(raw_run["run"]), "--format", "pt2", "--out", str(model)]
    assert main(argv) == 0
    encoding = model.with_name("model.pt2.encoding")
    assert sorted(p.name for p in encoding.iterdir()) == [
        "feature_map.json",
        "serving.json",
        "vocab.parquet",
    ]
    manifest = json.loads((encoding / "serving.json").read_text())
    assert manifest["inputs"]["categorical"]["fields"] == list(CATEGORICAL_COLUMNS)
    cat, num = RawRowEncoder(encoding).encode(_raw_rows(raw_run["test"]))
    assert cat.dtype == np.int64 and num.dtype == np.float32
    loaded = torch.export.load(str(model)).module()
    with torch.no_grad():
        p = loaded(torch.from_numpy(cat), torch.from_numpy(num)).numpy()
    assert np.abs(p - _served_probabilities(raw_run, tmp_path)).max() <= 1e-5


@pytest.mark.slow
def test_onnx_on_raw_rows_with_platt_folded_in(raw_run, tmp_path, capfd):
    ort = pytest.importorskip("onnxruntime")
    model = tmp_path / "model.onnx"
    argv = [
        "export",
        str(raw_run["run"]),
        "--format",
        "onnx",
        "--out",
        str(model),
        "--calibrator",
        "platt",
    ]
    assert main(argv) == 0
    # the exporter's notes about torchvision's operators stay out of the command's output
    assert "torchvision" not in "".join(capfd.readouterr())
    cal = json.loads((tmp_path / "model.onnx.encoding" / "serving.json").read_text())["calibrator"]
    assert cal["name"] == "platt"
    enc = RawRowEncoder(tmp_path / "model.onnx.encoding")
    cat, num = enc.encode(_raw_rows(raw_run["test"]))
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    p = sess.run(None, {"categorical": cat, "numeric": num})[0]
    base = _served_probabilities(raw_run, tmp_path)
    z = np.log(base) - np.log1p(-base)
    want = 1 / (1 + np.exp(-(cal["scale"] * z + cal["shift"])))
    assert np.abs(p - want).max() <= 1e-5


def test_encoder_names_a_bad_value(raw_run):
    enc = RawRowEncoder(raw_run["data"])
    row = _raw_rows(raw_run["test"])[0]
    with pytest.raises(
        DataError, match=r"^rows: row 0: malformed row: C3 is not a hex value .* \(got 'not-hex'\)$"
    ):
        enc.encode([{**row, "C3": "not-hex"}])
    with pytest.raises(DataError, match=r"^rows: row 0: no column 'I1'"):
        enc.encode([{k: v for k, v in row.items() if k != "I1"}])


USER_MODELS = """
import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, feature_map):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(v, 1) for v in feature_map.vocab_sizes)
        self.w = nn.Linear(len(feature_map.numeric_fields), 1)

    def forward(self, batch):
        cat = sum(e(batch.categorical[:, j]) for j, e in enumerate(self.emb))
        return (cat + self.w(torch.nan_to_num(batch.numeric))).squeeze(-1)


# an operator ONNX has no translation for, in a graph of a few nodes: the exporter traces and
# decomposes the whole graph before it meets the operator
class Zeta(nn.Module):
    def __init__(self, feature_map):
        super().__init__()
        self.w = nn.Linear(len(feature_map.numeric_fields), 1)

    def forward(self, batch):
        z = self.w(torch.nan_to_num(batch.numeric)).squeeze(-1)
        return torch.special.zeta(z.abs() + 2.0, torch.full_like(z, 2.0))
"""


def _user_model(prepared_dir, tmp_path, monkeypatch, name):
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.models.build import create_model
    from ctrcal.validate import load_config

    (tmp_path / "user_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, [f"model.name=user_models:{name}"], skip_checks=("report", "model"))
    fmap = FeatureMap.load(prepared_dir)
    served = export_mod.ServedModel(create_model(cfg.model, fmap), fmap).eval()
    return served, export_mod.example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2)


def test_a_user_model_by_import_path_exports(prepared_dir, tmp_path, monkeypatch):
    served, example = _user_model(prepared_dir, tmp_path, monkeypatch, "Linear")
    export_mod.export_model(served, tmp_path / "m.pt2", "pt2", example)
    loaded = torch.export.load(str(tmp_path / "m.pt2")).module()
    with torch.no_grad():
        assert torch.allclose(loaded(*example), served(*example), atol=1e-6)


@pytest.mark.slow
def test_a_user_model_torch_cannot_export_names_the_operator(prepared_dir, tmp_path, monkeypatch):
    pytest.importorskip("onnxscript")
    served, example = _user_model(prepared_dir, tmp_path, monkeypatch, "Zeta")
    with pytest.raises(Exception, match=r"cannot export it to onnx \(operator \w+::zeta\)"):
        export_mod.export_model(served, tmp_path / "m.onnx", "onnx", example)
    assert not (tmp_path / "m.onnx").exists()


def test_export_bad_input_is_one_line(raw_run, tmp_path, monkeypatch, capsys):
    run = str(raw_run["run"])
    assert main(["export", run, "--format", "tflite", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "ctrcal export: error: --format: unknown export format 'tflite' (valid: onnx, pt2, aoti)"
    )
    assert main(["export", run, "--format", "torchscript", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "use pt2 (torch.export" in err
    empty = tmp_path / "not_trained"
    empty.mkdir()
    (empty / "config.yaml").write_text("{}\n")
    assert main(["export", str(empty), "--format", "onnx", "--out", str(tmp_path / "m")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no trained weights" in err
    monkeypatch.setattr(formats_mod, "missing_export_packages", lambda: ["onnxscript"])
    assert main(["export", run, "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) != 0
    err = capsys.readouterr().err.strip()
    assert err == (
        "ctrcal export: error: ONNX export needs onnxscript: pip install 'ctrcal[export]'"
    )


def test_validate_names_the_missing_export_extra(monkeypatch, capsys):
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    monkeypatch.setattr(formats_mod, "missing_export_packages", lambda: ["onnx", "onnxscript"])
    assert main(["validate", str(config)]) == 0
    err = capsys.readouterr().err
    assert "needs onnx, onnxscript: pip install 'ctrcal[export]'" in err
