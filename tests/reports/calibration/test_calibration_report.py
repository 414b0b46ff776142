"""`ctrcal calibration-report FILE`: a hand-made file, bad input, and predictions exported from
a tiny ctrcal run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ctrcal import metrics as M
from ctrcal.cli import main
from ctrcal.core.errors import DataError
from ctrcal.metrics import smooth_ece
from ctrcal.reports.calibration.predictions_file import Predictions, read_predictions

HAND = """prob,label,site,hour
0.10,0,a,1
0.20,0,a,1
0.80,1,b,2
0.30,1,b,2
0.60,0,a,3
0.90,1,b,3
0.05,0,a,4
0.40,1,b,4
"""


def _hand(tmp_path, text: str = HAND):
    path = tmp_path / "preds.csv"
    path.write_text(text)
    return path


def test_hand_made_file_reports_the_metrics_of_its_rows(tmp_path):
    path = _hand(tmp_path)
    out = tmp_path / "rep"
    args = [
        "calibration-report",
        str(path),
        "--prob",
        "prob",
        "--label",
        "label",
        "--segments",
        "site",
        "--bootstrap",
        "20",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    got = json.loads((out / "metrics.json").read_text())
    p = np.array([0.1, 0.2, 0.8, 0.3, 0.6, 0.9, 0.05, 0.4])
    y = np.array([0, 0, 1, 1, 0, 1, 0, 1.0])
    assert got["rows"] == 8 and got["segments"] == ["site"]
    assert got["model"]["auc"] == pytest.approx(M.auc(p, y))
    assert got["model"]["ece"] == pytest.approx(M.ece(p, y))
    assert got["model"]["pcoc"] == pytest.approx(3.35 / 4)
    assert got["model"]["smooth_ece"] == pytest.approx(float(smooth_ece(p, y)))
    site = np.array([0, 0, 1, 1, 0, 1, 0, 1])
    assert got["model"]["field_ece:site"] == pytest.approx(M.field_ece(p, y, site, min_count=100))
    # the floor: the same metrics of clicks drawn from the predictions
    assert set(got["floor"]) == set(got["model"])
    assert got["bootstrap"]["ece"]["low"] <= got["model"]["ece"] <= got["bootstrap"]["ece"]["high"]
    text = (out / "report.md").read_text()
    assert "# Calibration report: preds.csv" in text and "| smooth_ece |" in text
    assert (out / "reliability.png").stat().st_size > 0
    assert "windows" not in got and not (out / "windows.png").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (("0.80,1,b,2", "1.30,1,b,2"), "column 'prob', row 3 (line 4): 1.3 is not a probability"),
        (("0.30,1,b,2", ",1,b,2"), "column 'prob', row 4 (line 5): missing"),
        (("0.60,0,a,3", "0.60,2,a,3"), "column 'label', row 5 (line 6): 2 is not a label 0 or 1"),
        (("0.90,1,b,3", "0.90,yes,b,3"), "column 'label', row 6 (line 7): 'yes' is not a number"),
        (("0.40,1,b,4", "0.40,1,b,4,9"), "line 9 has 5 fields, the header 4"),
        (("prob,label", "p,label"), "no column 'prob' (--prob); columns: p, label, site, hour"),
    ],
)
def test_bad_input_is_one_line_naming_the_column_and_the_row(tmp_path, capsys, edit, message):
    path = _hand(tmp_path, HAND.replace(*edit))
    args = [
        "calibration-report",
        str(path),
        "--prob",
        "prob",
        "--label",
        "label",
        "--out",
        str(tmp_path / "rep"),
    ]
    assert main(args) == 2  # bad input: 2, so that a pipeline never reads it as a failed gate
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and str(path) in err
    assert not (tmp_path / "rep").exists()


def test_mismatched_lengths_and_bad_time_are_named():
    with pytest.raises(DataError, match="column 'label' has 2 rows, column 'p' has 3"):
        Predictions.from_columns({"p": [0.1, 0.2, 0.3], "label": [0, 1]}, "p", "label")
    cols = {"p": [0.1, 0.2, 0.3], "label": [0, 1, 1], "t": ["2024-01-01", "soon", "2024-01-03"]}
    with pytest.raises(DataError, match="column 't', row 2: 'soon' is neither a number nor"):
        Predictions.from_columns(cols, "p", "label", time="t")
    ok = Predictions.from_columns({**cols, "t": ["2024-01-01"] * 3}, "p", "label", time="t")
    assert ok.time.dtype == np.int64


def test_segment_columns_become_codes_and_float_columns_buckets():
    rng = np.random.default_rng(0)
    cols = {
        "p": rng.random(500),
        "y": (rng.random(500) < 0.5).astype(int),
        "dev": np.array(["ios", "web", None] * 166 + ["ios", "web"], dtype=object),
        "price": rng.normal(size=500),
    }
    pr = Predictions.from_columns(cols, "p", "y", segments=["dev", "price"])
    assert sorted(np.unique(pr.segments["dev"])) == [0, 1, 2]  # a missing value is a category
    assert pr.segments["price"].max() <= 10 and np.unique(pr.segments["price"]).size == 10


@pytest.fixture(scope="module")
def exported(shift_report, tmp_path_factory):
    """Test-split predictions of a tiny trained ctrcal run (the session report's layernorm,
    seed 0), written as a parquet file."""
    import torch

    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.train.predict import predict_probs
    from ctrcal.train.results import load_run

    _, report = shift_report
    root = tmp_path_factory.mktemp("exported")
    model, _, fm = load_run(report / "runs" / "layernorm" / "seed0")
    test = ParquetCTRData(report / "data", "test")
    probs, labels = predict_probs(model, test, 8192)
    batch = test.all()
    torch.manual_seed(0)
    frame = pd.DataFrame(
        {
            "prob": probs.double().numpy(),
            "label": labels.numpy().astype(int),
            # a second model: the same one with its logits halved (under-confident)
            "prob_half": torch.sigmoid(torch.logit(probs.double()) / 2).numpy(),
            "C1": batch.categorical[:, 0].numpy(),
            "C2": batch.categorical[:, 1].numpy(),
            "row": np.arange(len(probs)),
        }
    )
    path = root / "preds.parquet"
    frame.to_parquet(path)
    return path, frame


def test_report_on_predictions_exported_from_a_ctrcal_run(exported, tmp_path):
    path, frame = exported
    out = tmp_path / "rep"
    args = [
        "calibration-report",
        str(path),
        "--prob",
        "prob",
        "--label",
        "label",
        "--segments",
        "C1,C2",
        "--time",
        "row",
        "--windows",
        "3",
        "--calibrator",
        "label_shift",
        "--compare",
        "prob_half",
        "--bootstrap",
        "10",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    got = json.loads((out / "metrics.json").read_text())
    p, y = frame["prob"].to_numpy(), frame["label"].to_numpy()
    summary = M.compute_all(p, y)  # what `ctrcal evaluate` reports for the run
    for k in ("auc", "logloss", "ece", "pcoc", "ne"):
        assert got["model"][k] == pytest.approx(summary[k], rel=1e-9)
    assert {"field_rce:C1", "field_rce:C2", "mce"} <= set(got["model"])
    # halving the logits keeps the ranking: the paired AUC difference is exactly zero
    assert got["compare"]["auc"]["diff"]["estimate"] == pytest.approx(0.0, abs=1e-12)
    assert got["compare"]["ece"]["diff"]["estimate"] == pytest.approx(
        M.ece(frame["prob_half"], y) - M.ece(p, y)
    )
    # every one of the 10 replicates finds the halved logits worse calibrated: the p-value is
    # the replicates' resolution, a bound that the report prints as such
    ece = got["compare"]["ece"]
    assert ece["pvalue"] == ece["p_resolution"] == pytest.approx(0.1)
    lines = (out / "report.md").read_text().splitlines()
    ece_row = [x for x in lines if x.startswith("| ece |")][-1]  # the comparison's table
    assert ece_row.endswith("| < 0.1 |")
    w = got["windows"]
    assert w["fitted_on"] == "first window" and len(w["table"]) == 3
    assert "label_shift calibrator fitted once" in w["sentence"]
    assert (out / "windows.png").exists() and (out / "windows.csv").exists()
    assert w["sentence"] in (out / "report.md").read_text()


def test_read_predictions_reads_only_what_it_is_asked(exported):
    path, frame = exported
    pr = read_predictions(path, "prob", "label")
    assert pr.rows == len(frame) and pr.segments == {} and pr.time is None
    assert np.array_equal(pr.prob, frame["prob"].to_numpy())


def test_bad_options_answer_before_any_work(tmp_path, capsys):
    path = _hand(tmp_path)
    base = [
        "calibration-report",
        str(path),
        "--prob",
        "prob",
        "--label",
        "label",
        "--out",
        str(tmp_path / "rep"),
    ]
    assert main([*base, "--time", "hour", "--calibrator", "no_such"]) == 2
    assert "unknown calibrator 'no_such'" in capsys.readouterr().err
    assert main([*base, "--time", "hour", "--windows", "0"]) == 2
    assert "windows: expected an integer >= 1" in capsys.readouterr().err
    assert main([*base, "--bootstrap", "1"]) == 2
    assert not (tmp_path / "rep").exists()
    # more windows than the file has time steps: named by the time column
    assert main([*base, "--time", "hour", "--windows", "4", "--calibrator", "label_shift"]) == 2
    err = capsys.readouterr().err
    assert "--windows 4: the time column 'hour' holds 4 distinct times" in err, err
    assert not (tmp_path / "rep").exists()  # refused before anything is written


def test_default_windows_follow_the_distinct_times(tmp_path):
    # 10 days and no --windows: the first day fits the stale calibrator, 9 windows are tested
    rng = np.random.default_rng(0)
    n = 4000
    day = np.repeat(np.arange(10), n // 10)
    p = rng.uniform(0.05, 0.6, n)
    y = (rng.uniform(size=n) < p).astype(int)
    path = tmp_path / "preds.csv"
    path.write_text(
        "prob,label,day\n" + "".join(f"{a},{b},{c}\n" for a, b, c in zip(p, y, day, strict=True))
    )
    out = tmp_path / "rep"
    args = ["calibration-report", str(path), "--prob", "prob", "--label", "label"]
    assert main([*args, "--time", "day", "--bootstrap", "20", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["windows"]["table"]) == 9


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--min-count", "0"], "min_count: expected at least 1 row, got 0"),
        (["--min-count", "-5"], "min_count: expected at least 1 row, got -5"),
        (["--seed", "-1"], "seed: expected an integer >= 0, got -1"),
        (["--bootstrap", "-3"], "bootstrap: expected at least 2 replicates, got -3"),
    ],
)
def test_bad_numeric_options_are_one_line_and_exit_2(tmp_path, capsys, option, message):
    # exit 1 would read as a failed gate in a pipeline
    path = _hand(tmp_path)
    args = ["calibration-report", str(path), "--prob", "prob", "--label", "label"]
    rc = main([*args, "--segments", "site", *option, "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"ctrcal calibration-report: error: {message}\n"
    assert not (tmp_path / "rep").exists()


def _long_line_file(tmp_path):
    path = tmp_path / "long.csv"
    with path.open("w") as fh:
        fh.write("prob,label,site\n0.1,0,a\n0.6,1,b\n")
        fh.write("0.3,1," + "x" * (20 << 20) + "\n")  # a 20 MiB segment value on line 4
        fh.write("0.2,0,a\n")
    return path


def test_a_csv_line_longer_than_pyarrows_block_is_read(tmp_path):
    preds = read_predictions(_long_line_file(tmp_path), "prob", "label", segments=["site"])
    assert preds.rows == 4
    assert len(set(preds.segments["site"].tolist())) == 3


def test_a_csv_line_longer_than_the_bound_is_named_with_advice(tmp_path, monkeypatch):
    from ctrcal.reports.calibration import predictions_file

    monkeypatch.setattr(predictions_file, "MAX_CSV_BLOCK", 16 << 20)
    path = _long_line_file(tmp_path)
    with pytest.raises(DataError) as info:
        read_predictions(path, "prob", "label")
    assert str(info.value) == (
        f"{path}: line 4 is 20.0 MiB long, more than the 16 MiB a CSV line may have; check "
        "that line (a missing line break?), or write the predictions as parquet"
    )
