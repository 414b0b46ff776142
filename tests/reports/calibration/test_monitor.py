"""`ctrcal calibration-report ANALYSIS --reference REF`: drift tables, estimates with trust
flags, figures and metrics.json on files whose truth is known, and bad input (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrcal.cli import main

ROWS = 6000


def _write(path, rng, *, noise: float = 0.0, label: bool = True, **override) -> str:
    """A predictions file of a known click model: two numeric features, one categorical;
    ``noise``: Gaussian noise (in stds) on the numerics the model reads, after the clicks."""
    x0, x1 = rng.normal(0, 1, ROWS), rng.lognormal(0, 1, ROWS)
    site = rng.integers(0, 6, ROWS)
    z = 1.2 * x0 + 0.5 * np.log(x1) - 1.0
    y = (rng.random(ROWS) < 1 / (1 + np.exp(-z))).astype(float)
    x0 = x0 + rng.normal(0, noise, ROWS)
    x1 = x1 + rng.normal(0, noise * x1.std(), ROWS)
    z = 1.2 * x0 + 0.5 * np.log(np.maximum(x1, 1e-3)) - 1.0
    cols = {"prob": 1 / (1 + np.exp(-z)), "x0": x0, "x1": x1, "site": site}
    if label:
        cols["label"] = y
    cols.update(override)
    pq.write_table(pa.table(cols), path)
    return str(path)


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    ref = _write(tmp_path / "ref.parquet", rng)
    clean = _write(tmp_path / "clean.parquet", rng, label=False)
    noisy = _write(tmp_path / "noisy.parquet", rng, noise=0.5)
    return tmp_path, ref, clean, noisy


def _report(path, ref, out, *extra) -> int:
    args = ["calibration-report", path, "--prob", "prob", "--label", "label"]
    return main([*args, "--reference", ref, "--chunk-rows", "500", "--out", str(out), *extra])


def test_clean_unlabelled_analysis_is_trusted_and_tabled(files):
    tmp, ref, clean, _ = files
    assert _report(clean, ref, tmp / "clean") == 0
    got = json.loads((tmp / "clean" / "metrics.json").read_text())
    drift, lf = got["drift"], got["label_free"]
    assert len(drift["chunks"]) == 12 and drift["chunk_rows"] == 500
    assert {s["feature"] for s in drift["univariate"]} == {"x0", "x1", "site"}
    for s in drift["univariate"] + drift["multivariate"]:
        assert {"value", "threshold", "alarm"} <= set(s)
    assert sum(c["alarm"] for c in drift["chunks"]) <= 1  # at most 5 % of 12, rounded up
    assert set(lf["estimators"]) == {"cbpe", "iw_cbpe", "doc"}
    for e in lf["estimators"].values():
        assert e["assumption"] and len(e["chunks"]) == 12
        assert "auc_measured" not in e["chunks"][0]  # no labels in the analysis
    assert "auc_est" in lf and "trust_rule" in lf
    for name in ("drift.csv", "estimates.csv", "drift.png", "estimates.png", "report.md"):
        assert (tmp / "clean" / name).stat().st_size > 0
    assert "## Monitoring" in (tmp / "clean" / "report.md").read_text()


def test_noisy_labelled_analysis_alarms_and_withdraws_the_trust(files):
    tmp, ref, _, noisy = files
    out = tmp / "noisy"
    assert _report(noisy, ref, out, "--bootstrap", "10") == 0
    got = json.loads((out / "metrics.json").read_text())
    assert all(c["alarm"] for c in got["drift"]["chunks"])
    alarmed = {s["feature"] for s in got["drift"]["univariate"] if s["alarm"]}
    assert alarmed == {"x0", "x1"}  # the site is drawn as in the reference
    cbpe = got["label_free"]["estimators"]["cbpe"]
    assert not cbpe["trusted"] and not any(c["trusted"] for c in cbpe["chunks"])
    assert all(c["auc_error"] > 0.02 for c in cbpe["chunks"])  # CBPE rises, AUC falls
    assert "model" in got  # the labelled analysis keeps its calibration report
    header = (out / "estimates.csv").read_text().splitlines()[0]
    assert header.startswith("chunk,estimator,auc,auc_measured,auc_error")


def test_bad_input_is_one_line_and_exit_2(files, capsys):
    tmp, ref, clean, _ = files
    rng = np.random.default_rng(1)
    out = tmp / "bad"
    other = _write(tmp / "other.parquet", rng, site2=np.zeros(ROWS, dtype=np.int64))
    assert _report(other, ref, out) == 2
    assert "different feature columns; only in the analysis: site2" in capsys.readouterr().err
    empty = _write(tmp / "empty.parquet", rng, x1=np.full(ROWS, np.nan))
    assert _report(empty, ref, out) == 2
    assert "feature column 'x1' has no value" in capsys.readouterr().err
    unlabelled = _write(tmp / "unlabelled.parquet", rng, label=False)
    assert _report(clean, unlabelled, out) == 2
    assert "the reference needs labels" in capsys.readouterr().err
    args = ["calibration-report", clean, "--prob", "prob", "--label", "label"]
    assert main([*args, "--reference", ref, "--chunk-rows", "50", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "too small for a drift threshold" in err and len(err.strip().splitlines()) == 1
    assert main([*args, "--reference", ref, "--chunk-rows", "1000", "--out", str(out)]) == 2
    assert "too large for their threshold" in capsys.readouterr().err
