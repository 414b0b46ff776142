"""ctrcal predict: the numbers of evaluate, raw files through prepare's route, the output as
calibration-report's input, and one line for bad input."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctrcal.cli import main
from ctrcal.metrics import compute_all
from ctrcal.serving.predict import predict_run
from ctrcal.train.evaluate import evaluate_run


def _read(path):
    return pq.read_table(path).to_pandas()


@pytest.mark.parametrize("mc_samples", [0, 3])
def test_predict_gives_the_metrics_of_evaluate(raw_run, tmp_path, mc_samples):
    out = tmp_path / "p.parquet"
    res = predict_run(raw_run["run"], out, split="test", mc_samples=mc_samples, seed=5)
    df = _read(out)
    assert res.rows == len(df) == 1500
    assert list(df.columns) == (["prob", "prob_std", "label"] if mc_samples else ["prob", "label"])
    got = compute_all(torch.tensor(df["prob"].to_numpy()), torch.tensor(df["label"].to_numpy()))
    want = evaluate_run(raw_run["run"], "test", mc_samples=mc_samples, seed=5)
    for key in ("auc", "logloss", "ece", "pcoc", "brier"):
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    if mc_samples:
        assert (df["prob_std"] > 0).mean() > 0.9  # the passes differ


def test_raw_files_are_encoded_as_prepare_encoded_them(raw_run, tmp_path):
    split, raw = tmp_path / "split.parquet", tmp_path / "raw.parquet"
    assert main(["predict", str(raw_run["run"]), "--out", str(split)]) == 0
    assert main(["predict", str(raw_run["run"]), str(raw_run["test"]), "--out", str(raw)]) == 0
    a, b = _read(split), _read(raw)
    assert len(a) == len(b) == 1500
    np.testing.assert_array_equal(a["prob"].to_numpy(), b["prob"].to_numpy())
    np.testing.assert_array_equal(a["label"].to_numpy(), b["label"].to_numpy())


def test_output_feeds_calibration_report(raw_run, tmp_path):
    out = tmp_path / "p.parquet"
    assert main(["predict", str(raw_run["run"]), "--out", str(out)]) == 0
    report = tmp_path / "report"
    argv = [
        "calibration-report",
        str(out),
        "--prob",
        "prob",
        "--label",
        "label",
        "--bootstrap",
        "5",
        "--out",
        str(report),
    ]
    assert main(argv) == 0
    metrics = json.loads((report / "metrics.json").read_text())
    want = evaluate_run(raw_run["run"], "test")
    assert json.dumps(metrics).count("auc") and (report / "report.md").exists()
    assert _find(metrics, "auc") == pytest.approx(want["auc"], rel=1e-9)


def _find(obj, key):
    """The first value of ``key`` anywhere in a nested JSON object."""
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], (int, float)):
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def test_bad_input_is_one_line(raw_run, tmp_path, capsys):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    (empty / "config.yaml").write_text("{}\n")
    assert main(["predict", str(empty), "--out", str(tmp_path / "x.parquet")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no trained weights" in err

    locked = _read_only_folder(tmp_path / "readonly")
    try:
        rc = main(["predict", str(raw_run["run"]), "--out", str(locked / "p.parquet")])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and err.count("\n") == 0 and str(locked) in err
        assert not list(locked.iterdir())
    finally:
        _writable(locked)


def _read_only_folder(path):
    """A folder nobody may write into (root included: the immutable attribute)."""
    path.mkdir()
    os.chmod(path, 0o555)
    if os.access(path, os.W_OK):  # root: chmod does not stop it
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a read-only folder: {done.stderr.decode().strip()}")
    return path


def _writable(path):
    subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    os.chmod(path, 0o755)


def test_an_unlabelled_raw_file_gets_no_label_column(raw_run, tmp_path):
    from ctrcal.preparation.synthetic import generate_frame, write_criteo

    frame, _ = generate_frame(200, seed=3)
    raw = write_criteo(frame, tmp_path / "test.txt", "dac_test")
    out = tmp_path / "p.parquet"
    res = predict_run(raw_run["run"], out, raw_files=[raw])
    df = _read(out)
    assert res.columns == ["prob"] == list(df.columns) and len(df) == 200
    assert df["prob"].between(0, 1).all()


def test_with_features_writes_the_inputs_in_the_original_space(raw_run, tmp_path):
    from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS as CATEGORICAL_COLS
    from ctrcal.core.criteo_schema import NUMERIC_COLUMNS as NUMERIC_COLS

    split, raw = tmp_path / "split.parquet", tmp_path / "raw.parquet"
    run = str(raw_run["run"])
    assert main(["predict", run, "--with-features", "--out", str(split)]) == 0
    assert main(["predict", run, str(raw_run["test"]), "--with-features", "--out", str(raw)]) == 0
    a, b = pq.read_table(split), pq.read_table(raw)
    assert a.schema.names == ["prob", "label", *NUMERIC_COLS, *CATEGORICAL_COLS]
    assert str(a.schema.field(NUMERIC_COLS[0]).type) == "double"
    assert str(a.schema.field(CATEGORICAL_COLS[0]).type) == "int64"
    assert a.equals(b)  # the split and its raw file: the same inputs, the same probabilities
    # the raw file's own integers come back (up to the float32 the split stores)
    raw_values = np.genfromtxt(raw_run["test"], delimiter="\t", usecols=range(1, 14))
    got = np.stack([a.column(c).to_numpy() for c in NUMERIC_COLS], 1)
    np.testing.assert_allclose(got, raw_values, rtol=1e-5, atol=1e-3)
