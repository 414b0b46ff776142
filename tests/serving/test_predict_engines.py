"""``ctrcal predict --engine``: the exported graph scores a raw file as it scores the test
split (bit for bit), and as the eager model does to float32 rounding."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from ctrcal.cli import main


def _predict(raw_run, tmp_path, name, *args):
    out = tmp_path / f"{name}.parquet"
    assert main(["predict", str(raw_run["run"]), *args, "--out", str(out)]) == 0
    return pq.read_table(out)


def _export_once(monkeypatch, tmp_path):
    """Each predict with an exported engine exports the run's model as it starts: the later
    predicts of a test score the first one's file (the same run and format, so the same
    graph), so that the test exports once. -> ``{format: the kept file}``."""
    from ctrcal.serving import engines

    export, kept = engines.export_model, {}

    def export_once(served, path, fmt, *args, **kwargs):
        if fmt not in kept:
            export(served, path, fmt, *args, **kwargs)
            kept[fmt] = shutil.copyfile(path, tmp_path / f"exported.{fmt}")
        else:
            shutil.copyfile(kept[fmt], path)

    monkeypatch.setattr(engines, "export_model", export_once)
    return kept


@pytest.mark.slow
def test_onnxruntime_engine_on_a_raw_file_matches_the_split_bit_for_bit(
    raw_run, tmp_path, monkeypatch
):
    pytest.importorskip("onnxruntime")
    exported = _export_once(monkeypatch, tmp_path)
    engine = ["--engine", "onnxruntime"]
    split = _predict(raw_run, tmp_path, "split", "--split", "test", *engine)
    raw = _predict(raw_run, tmp_path, "raw", str(raw_run["test"]), *engine)
    assert list(exported) == ["onnx"]  # the engine exported through export_model, once
    assert split.column("prob").to_numpy().tobytes() == raw.column("prob").to_numpy().tobytes()
    assert split.column("label").equals(raw.column("label"))
    eager = _predict(raw_run, tmp_path, "eager", "--split", "test").column("prob").to_numpy()
    # float32 arithmetic in another order: within float32 rounding of a probability
    assert np.abs(split.column("prob").to_numpy() - eager).max() <= 1e-6


def test_an_exported_engine_has_no_mc_passes(raw_run, tmp_path, capsys):
    argv = ["predict", str(raw_run["run"]), "--engine", "onnxruntime", "--mc-samples", "2"]
    assert main([*argv, "--out", str(tmp_path / "p.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "MC passes need --engine torch" in err


def test_a_precision_the_engine_cannot_run_is_one_line(raw_run, tmp_path, capsys):
    run, out = str(raw_run["run"]), str(tmp_path / "p.parquet")
    cases = {
        ("--engine", "onnxruntime", "--precision", "bf16"): "the onnx format cannot hold it",
        ("--engine", "aoti", "--precision", "int8"): "the aoti format cannot hold it",
        ("--precision", "int8"): "--engine torch scores in fp32, or one-shot in bf16",
        ("--precision", "bf16", "--mc-samples", "2"): "--engine torch scores in fp32, or one-shot",
    }
    for args, words in cases.items():
        assert main(["predict", run, *args, "--out", out]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err, err
