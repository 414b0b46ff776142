"""ctrcal.metrics.METRICS: one declaration per metric, read by the reports, the gate, the docs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from ctrcal import metrics as M
from ctrcal.core.errors import ConfigError
from ctrcal.metrics import METRICS, declare_metric, metric_of, metrics_in

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_average_precision_by_hand():
    # thresholds 0.9, 0.8, 0.7, 0.6: (recall, precision) = (½, 1), (½, ½), (1, ⅔), (1, ½)
    # AP = ½·1 + 0·½ + ½·⅔ + 0·½ = 5/6
    assert M.average_precision([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]) == pytest.approx(5 / 6)
    # tied scores enter together: at 0.5 (½, ½), at 0.2 (1, ⅔): ½·½ + ½·⅔ = 7/12
    assert M.average_precision([0.5, 0.5, 0.2], [1, 0, 1]) == pytest.approx(7 / 12)
    assert M.average_precision([0.5, 0.5, 0.2], [0, 1, 1]) == pytest.approx(7 / 12)
    assert M.average_precision([0.1, 0.2, 0.3], [0, 1, 1]) == pytest.approx(1.0)
    assert math.isnan(M.average_precision([0.1, 0.2], [0, 0]))


def test_average_precision_equals_sklearn_with_ties():
    rng = np.random.default_rng(3)
    p = np.round(rng.uniform(0, 0.3, 5000), 3)  # many ties
    y = (rng.uniform(size=p.size) < p).astype(np.int64)
    assert M.average_precision(p, y) == pytest.approx(average_precision_score(y, p), rel=1e-12)
    assert METRICS.get("prauc").compute(p, y) == M.average_precision(p, y)


def test_average_precision_of_row_counts_is_that_of_the_repeated_rows():
    rng = np.random.default_rng(4)
    p = np.round(rng.uniform(0, 0.3, 300), 2)
    y = (rng.uniform(size=p.size) < p).astype(np.int64)
    counts = rng.integers(0, 4, p.size)  # a bootstrap replicate's row counts
    rows = np.repeat(np.arange(p.size), counts)
    want = M.average_precision(p[rows], y[rows])
    assert M.average_precision(p, y, sample_weight=counts) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(average_precision_score(y, p, sample_weight=counts), rel=1e-12)
    assert METRICS.get("prauc").weighted
    with pytest.raises(ValueError, match="sample_weight"):
        M.average_precision(p, y, sample_weight=-counts)


def test_every_metric_of_the_reports_is_declared_once_with_a_direction_where_compared():
    assert len({normalize(m.name) for m in metrics_in()}) == len(metrics_in())
    for m in metrics_in():
        assert m.label and m.definition.endswith(".") and m.section, m.name
    compared = metrics_in("compared")
    assert {m.name for m in compared} >= {"auc", "ece", "logloss", "pcoc_error", "mce"}
    assert all(m.better is not None for m in compared)
    assert METRICS.get("auc").higher_is_better is True
    assert METRICS.get("ece").higher_is_better is False and METRICS.get("pcoc").better is None
    # the four the calibration report once lost, and the new one
    table = {m.name for m in metrics_in("calibration")}
    assert {"smooth_ece", "cal_slope", "cal_intercept", "cal_intercept_large", "prauc"} <= table


def normalize(name: str) -> str:
    return re.sub(r"[-_ .]", "", name.lower())


def test_keys_with_a_part_of_their_own_find_their_declaration():
    assert metric_of("field_rce:C14") is METRICS.get("field_rce:<field>")
    assert metric_of("field_ece:site") is METRICS.get("field_ece:<field>")
    assert metric_of("auc@50%") is METRICS.get("auc@<c>%")
    assert metric_of("logloss@12.5%") is METRICS.get("logloss@<c>%")
    assert metric_of("ECE") is METRICS.get("ece")  # the registry's one spelling rule
    assert metric_of("nope") is None and metric_of("nope:x") is None


def test_declaring_checks_what_the_tables_need():
    def fn(p, y):
        return 0.0

    common = {"label": "x", "definition": "x.", "compute": fn}
    with pytest.raises(ValueError, match="already registered"):
        declare_metric("auc", better="higher", **common)
    with pytest.raises(ValueError, match="unknown section 'misc'"):
        declare_metric("x1", better=None, section="misc", **common)
    with pytest.raises(ValueError, match="unknown table 'summary'"):
        declare_metric("x1", better=None, tables=("summary",), **common)
    with pytest.raises(ValueError, match="a compared metric needs a direction"):
        declare_metric("x1", better=None, tables=("compared",), **common)
    with pytest.raises(ValueError, match="compute or computed_by"):
        declare_metric("x1", label="x", definition="x.", better=None)
    with pytest.raises(ValueError, match="better must be"):
        declare_metric("x1", better="up", **common)
    with pytest.raises(ConfigError, match="unknown metric 'aucc'; did you mean 'auc'"):
        METRICS.get("aucc")
    assert "x1" not in METRICS


@pytest.fixture
def mean_p():
    """The module docstring's example, declared for one test."""

    def mean_p(probs, labels):
        return float(np.mean(probs))

    yield declare_metric(
        "mean_p",
        label="mean probability",
        definition="mean of the predicted click probabilities, mean p.",
        better=None,
        compute=mean_p,
        section="calibration",
        tables=("calibration",),
    )
    METRICS.unregister("mean_p")


def test_a_declared_metric_reaches_the_report_its_definitions_and_the_gate(tmp_path, mean_p):
    from ctrcal.cli import main
    from ctrcal.reports.calibration.gate import parse_gate
    from ctrcal.reports.calibration.report import gate_metrics

    assert METRICS.get("mean_p").compute(np.array([0.1, 0.3]), np.array([0, 1])) == 0.2
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.5, 400)
    y = (rng.uniform(size=p.size) < p).astype(int)
    path = tmp_path / "p.csv"
    path.write_text("p,q,y\n" + "".join(f"{a},{a * 0.9},{b}\n" for a, b in zip(p, y, strict=True)))
    out = tmp_path / "rep"
    argv = ["calibration-report", str(path), "--prob", "p", "--label", "y", "--compare", "q"]
    argv += ["--bootstrap", "5", "--gate", "mean_p:+0.1", "--out", str(out)]
    assert main(argv) == 0
    got = json.loads((out / "metrics.json").read_text())
    assert got["model"]["mean_p"] == pytest.approx(p.mean())
    assert got["compare"]["mean_p"]["diff"]["estimate"] == pytest.approx(-0.1 * p.mean())
    text = (out / "report.md").read_text()
    assert "| mean_p |" in text and "- **mean_p**: mean of the predicted click" in text
    assert [r.metric for r in parse_gate("mean_p:+0", gate_metrics(False))] == ["mean_p"]


def test_the_calibration_report_defines_every_metric_of_its_table(tmp_path):
    from ctrcal.cli import main

    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.5, 300)
    y = (rng.uniform(size=p.size) < p).astype(int)
    path = tmp_path / "p.csv"
    path.write_text("p,y\n" + "".join(f"{a},{b}\n" for a, b in zip(p, y, strict=True)))
    out = tmp_path / "rep"
    argv = ["calibration-report", str(path), "--prob", "p", "--label", "y", "--bootstrap", "5"]
    assert main([*argv, "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    rows = re.findall(r"^\| (\w+) \| ", text.split("## Metrics")[1].split("\n## ")[0], re.M)
    defined = re.findall(r"^- \*\*(\w+)\*\*: ", text.split("## Definitions")[1], re.M)
    assert rows[1:] == defined  # the header row first, then one definition per row
    for name in ("smooth_ece", "cal_slope", "cal_intercept", "cal_intercept_large", "prauc"):
        assert name in defined, name
    got = json.loads((out / "metrics.json").read_text())
    assert got["model"]["prauc"] == pytest.approx(average_precision_score(y, p))


def test_the_docs_list_the_declared_metrics():
    text = (DOCS / "calibration.md").read_text()
    listed = text.split("<!-- metrics: begin -->")[1].split("<!-- metrics: end -->")[0]
    from ctrcal.reports.markdown import metric_list

    assert listed.strip() == metric_list().strip(), (
        "docs/calibration.md's metric list is not the registry's: run scripts/metric_docs.py"
    )


def test_figures_label_their_axes_from_the_declarations():
    from ctrcal.reports.figures import axis_label

    assert axis_label("auc") == "AUC (↑)" and axis_label("ece") == "ECE (↓)"
    assert axis_label("field_rce_mean") == "Field-RCE, mean over fields (↓)"
    assert axis_label("pcoc").endswith("(1 = calibrated)") and axis_label("nope") == "nope"
