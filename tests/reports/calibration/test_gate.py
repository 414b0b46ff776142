"""`calibration-report` from report to deployment: worst segments, the deploy gate (exit 0 pass,
1 fail, 2 bad input), label-free estimates and bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ctrcal.cli import main
from ctrcal.metrics import expected_auc


def _write(tmp_path, frame: pd.DataFrame, name: str = "preds.parquet"):
    path = tmp_path / name
    if name.endswith(".csv"):
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    return path


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory):
    """A baseline ``p``, a near-copy ``same`` and an over-confident ``sharp`` (logits doubled)."""
    rng = np.random.default_rng(0)
    n = 4000
    p = rng.beta(1, 5, n)
    y = (rng.random(n) < p).astype(int)
    z = np.log(p) - np.log1p(-p)
    frame = pd.DataFrame(
        {
            "p": p,
            "y": y,
            "dev": rng.choice(["ios", "web"], n),
            "same": 1 / (1 + np.exp(-(z + rng.normal(0, 0.01, n)))),
            "sharp": 1 / (1 + np.exp(-2 * z)),
        }
    )
    return _write(tmp_path_factory.mktemp("gate"), frame), frame


def _report(path, out, *extra):
    args = ["calibration-report", str(path), "--prob", "p", "--label", "y"]
    return main([*args, "--bootstrap", "10", "--out", str(out), *extra])


def test_gate_passes_a_candidate_that_is_no_worse(pair_file, tmp_path, capsys):
    path, _ = pair_file
    out = tmp_path / "rep"
    assert _report(path, out, "--compare", "same", "--gate", "ece:+0.01,auc:-0.005") == 0
    printed = capsys.readouterr().out
    assert "gate: ece:+0.01 on all rows" in printed and "gate: PASS (2 of 2" in printed
    gate = json.loads((out / "metrics.json").read_text())["gate"]
    assert gate["verdict"] == "pass" and [r["rule"] for r in gate["rules"]] == [
        "ece:+0.01",
        "auc:-0.005",
    ]
    assert "## Deploy gate: PASS" in (out / "report.md").read_text()


def test_a_gate_rule_pairs_the_metrics_left_out_of_the_comparison(pair_file, tmp_path):
    path, _ = pair_file
    out = tmp_path / "rep"
    assert _report(path, out, "--compare", "same") == 0
    compare = json.loads((out / "metrics.json").read_text())["compare"]
    assert "ece_mass" in compare and not {"smooth_ece", "cal_slope"} & set(compare)
    assert "Not paired: `cal_slope`, `cal_intercept`" in (out / "report.md").read_text()
    assert _report(path, out, "--compare", "same", "--gate", "smooth_ece:+0.01") == 0
    compare = json.loads((out / "metrics.json").read_text())["compare"]
    assert "smooth_ece" in compare and "cal_slope" not in compare


def test_gate_fails_on_the_bound_not_the_point_estimate(pair_file, tmp_path, capsys):
    path, _ = pair_file
    out = tmp_path / "rep"
    # the over-confident candidate: same ranking, far worse ECE
    assert _report(path, out, "--compare", "sharp", "--gate", "auc:-0.001,ece:+0.002") == 1
    gate = json.loads((out / "metrics.json").read_text())["gate"]
    auc, ece = gate["rules"]
    assert auc["pass"] and not ece["pass"] and gate["verdict"] == "fail"
    assert "gate: FAIL (1 of 2" in capsys.readouterr().out
    # a margin between the point estimate and the bound: the point passes, the bound does not
    d = json.loads((out / "metrics.json").read_text())["compare"]["logloss"]["diff"]
    assert d["estimate"] < d["high"]
    margin = (d["estimate"] + d["high"]) / 2
    assert margin > 0
    assert _report(path, out, "--compare", "sharp", "--gate", f"logloss:+{margin:.6f}") == 1


def test_gate_per_segment(pair_file, tmp_path, capsys):
    path, _ = pair_file
    out = tmp_path / "rep"
    args = ["--compare", "same", "--segments", "dev", "--gate", "ece:+0.02", "--gate-segments"]
    assert _report(path, out, *args) == 0
    gate = json.loads((out / "metrics.json").read_text())["gate"]
    assert sorted(r["scope"] for r in gate["rules"]) == ["all rows", "dev=ios", "dev=web"]
    assert "gate: 2 of 2 segment rules pass" in capsys.readouterr().out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ece", "'ece' is not a rule METRIC:+MARGIN"),
        ("ece:0.002", "'ece:0.002' is not a rule"),
        ("ece:+0.002,latency:-1", "unknown metric 'latency'; known: auc, brier"),
        ("field_rce_max:+0.01", "unknown metric 'field_rce_max'"),  # needs --segments
        ("", "--gate: empty"),
    ],
)
def test_bad_gate_specs_exit_2_with_one_line(pair_file, tmp_path, capsys, spec, message):
    path, _ = pair_file
    assert _report(path, tmp_path / "rep", "--compare", "same", "--gate", spec) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "rep").exists()


def test_planted_segments_are_listed_first(tmp_path):
    rng = np.random.default_rng(5)
    seg = np.repeat(np.arange(10), 2000)
    p = rng.uniform(0.05, 0.3, seg.size)
    y = (rng.random(seg.size) < np.where(seg < 2, p / 1.5, p)).astype(int)
    path = _write(tmp_path, pd.DataFrame({"p": p, "y": y, "site": [f"s{k}" for k in seg]}))
    out = tmp_path / "rep"
    assert _report(path, out, "--segments", "site") == 0
    ws = json.loads((out / "metrics.json").read_text())["worst_segments"]
    assert {s["name"] for s in ws["segments"][:2]} == {"site=s0", "site=s1"}
    assert ws["flagged"] == 2 and ws["adjustment"] == "holm" and ws["tested"] == 10
    assert (out / "segments.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "report.md").read_text()
    assert "## Worst segments" in text and "Holm" in text and "## Brier decomposition" in text


def test_no_labels_gives_the_estimates_alone(pair_file, tmp_path):
    path, frame = pair_file
    out = tmp_path / "rep"
    assert (
        main(["calibration-report", str(path), "--prob", "p", "--no-labels", "--out", str(out)])
        == 0
    )
    got = json.loads((out / "metrics.json").read_text())
    assert got["label_free"]["auc_est"] == pytest.approx(expected_auc(frame["p"].to_numpy()))
    assert "model" not in got and "Label-free estimates" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "frame_edit, args, message",
    [
        (None, ["--no-labels", "--compare", "same"], "--no-labels: --compare needs clicks"),
        (None, ["--gate-segments"], "--gate-segments: needs --gate SPEC"),
        (None, ["--gate", "ece:+0.1"], "--gate: needs --compare COL"),
        ("p_out", ["--label", "y"], "column 'p', row 3 (line 4): 1.5 is not a probability"),
        ("many", ["--label", "y", "--segments", "user"], "segment column 'user' has 10,001"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, frame_edit, args, message):
    n = 10_001
    rng = np.random.default_rng(2)
    frame = pd.DataFrame(
        {
            "p": rng.uniform(0, 0.5, n),
            "y": rng.integers(0, 2, n),
            "same": rng.uniform(0, 0.5, n),
            "user": np.arange(n),
        }
    )
    if frame_edit == "p_out":
        frame.loc[2, "p"] = 1.5
    path = _write(tmp_path, frame, "preds.csv")
    label = [] if "--label" in args or "--no-labels" in args else ["--label", "y"]
    code = main(
        [
            "calibration-report",
            str(path),
            "--prob",
            "p",
            *label,
            *args,
            "--out",
            str(tmp_path / "rep"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and message in err, err
