"""The report's row-level analyses: calibration over time windows, row-bootstrap intervals,
risk–coverage, and their config keys."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pandas as pd
import pytest

pytest.importorskip("ctrcal.train.trainer")

from shift_report import CONFIG, VARIANTS, without_temporal  # noqa: E402

from ctrcal.cli import main  # noqa: E402
from ctrcal.core.errors import ConfigError  # noqa: E402
from ctrcal.validate import load_config  # noqa: E402

# the config keys under test: a time-ordered split, 3 windows, 20 bootstrap replicates
TINY = """
data:
  synthetic: {rows: 4000, seed: 0, drift: 2.0}
  split: [0.6, 0.1, 0.3]
  split_order: time
features: {min_count: 2}
model:
  embedding_dim: 4
  hidden_units: [16]
  dropout: 0.1
train:
  epochs: 1
  batch_size: 256
  eval_batch_size: 1024
  progress: false
report:
  seeds: 1
  windows: 3
  bootstrap: 20
  intensities: [0.0, 0.5]
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: platt, calibration: platt, from_variant: layernorm}
    - {name: mc_dropout, mc_samples: 3, mc_dropout: true, from_variant: layernorm}
"""
# the session's report on its time-ordered copy (the temporal shift's data and runs): one
# seed, layernorm and its Platt variant, 3 windows
WINDOWS = (
    without_temporal(CONFIG)
    .replace("split: [0.6, 0.1, 0.3]\n", "split: [0.6, 0.1, 0.3]\n  split_order: time\n")
    .replace("  seeds: 2\n", "  seeds: 1\n  windows: 3\n")
    .replace("  figures: false\n", "  figures: true\n")
    .split("  shifts:\n")[0]
    + """  shifts:
    - {name: gaussian_numeric, intensities: [0.5]}
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: platt, calibration: platt, from_variant: layernorm}
"""
)


@pytest.fixture(scope="module")
def windows_report(shift_report, tmp_path_factory):
    """``WINDOWS`` on the session report's time-ordered data, reusing its temporal runs."""
    _, shared = shift_report
    tmp = tmp_path_factory.mktemp("row_level")
    cfg = tmp / "t.yaml"
    cfg.write_text(WINDOWS)
    out = tmp / "out"
    shutil.copytree(shared / "runs_temporal", out / "runs")
    data = shared / "data_temporal"
    assert main(["shift-report", str(cfg), "--out", str(out), "--data", str(data)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training"]["runs"] == {"reused": 1}  # trained nothing
    return out, data


def test_windows_give_the_decay_figure_and_sentence(windows_report):
    report, data = windows_report
    text = (report / "report.md").read_text()
    assert "## Calibration over time" in text
    assert (report / "fig_windows_platt.png").stat().st_size > 0
    assert "](fig_windows_platt.png)" in text
    summary = json.loads((report / "summary.json").read_text())
    (w,) = summary["row_level"]["windows"]  # one calibrated variant
    assert w["variant"] == "platt" and w["fitted_on"] == "validation"
    assert w["sentence"] in text and "platt calibrator" in w["sentence"]
    assert [r["window"] for r in w["windows"]] == [1, 2, 3]
    # synthetic data: the true probabilities' ECE per window, the floor of its rows
    assert len(w["oracle_ece"]) == 3 and all(0 <= e < 0.2 for e in w["oracle_ece"])
    assert "ECE true probabilities" in text
    test_rows = json.loads((data / "feature_map.json").read_text())["splits"]["test"]["rows"]
    assert sum(r["rows"] for r in w["windows"]) == test_rows  # the whole test period
    metrics = pd.DataFrame(w["metrics"])
    assert set(metrics["calibration"]) == {"uncalibrated", "stale", "fresh"}
    assert {"ece", "pcoc", "ne", "field_rce_mean"} <= set(metrics["metric"])
    # window 1: fresh is the stale calibrator (fitted on the period just before)
    first = metrics[metrics["window"] == 1].pivot(index="metric", columns="calibration")
    assert (first["value"]["stale"] == first["value"]["fresh"]).all()
    later = metrics[(metrics["window"] == 3) & (metrics["metric"] == "ece")]
    assert later.set_index("calibration")["value"].nunique() == 3


def test_bootstrap_intervals_in_the_report(shift_report):
    _, report = shift_report
    text = (report / "report.md").read_text()
    assert "## Row-level confidence intervals" in text
    boot = json.loads((report / "summary.json").read_text())["row_level"]["bootstrap"]
    assert boot["replicates"] == 20
    assert set(boot["clean_seed0"]) == set(VARIANTS)
    df = pd.read_csv(report / "results.csv")
    clean = df[(df["shift"] == "clean") & (df["seed"] == 0)]
    for variant, cis in boot["clean_seed0"].items():
        for metric in ("ece", "pcoc", "auc"):
            ci = cis[metric]
            value = clean[(clean.variant == variant) & (clean.metric == metric)]["value"].item()
            assert ci["estimate"] == pytest.approx(value, abs=1e-9)  # the reported number
            assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["high"] > ci["low"]


def test_risk_coverage_for_variants_with_a_std_only(shift_report):
    _, report = shift_report
    df = pd.read_csv(report / "results.csv")
    rc = df[df.metric.str.contains("@")]
    assert set(rc.variant) == {"mclayernorm_mc", "ensemble", "mc_dropout", "mcln_fields_mc"}
    assert set(rc.metric) == {f"{m}@{c}%" for m in ("auc", "logloss") for c in (50, 80, 100)}
    assert set(rc["shift"]) == set(df["shift"])  # every point
    key = ["variant", "shift", "seed", "noise_seed", "intensity"]
    full = rc[rc.metric == "auc@100%"].set_index(key)["value"]
    auc = df[df.metric == "auc"].set_index(key)["value"]
    assert len(full) == len(auc[auc.index.get_level_values("variant").isin(set(rc.variant))])
    assert full.to_numpy() == pytest.approx(auc.loc[full.index].to_numpy())
    assert "### Risk–coverage" in (report / "report.md").read_text()


def _cfg(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("split_order: time", "split_order: random"), "report.windows: needs a time-ordered"),
        (("windows: 3", "windows: 1"), "report.windows: expected 0 (off) or an integer >= 2"),
        (("bootstrap: 20", "bootstrap: 1"), "report.bootstrap: expected 0 (off)"),
        (("bootstrap: 20", "bootstrap: true"), "report.bootstrap"),
        (
            ("    - {name: platt, calibration: platt, from_variant: layernorm}\n", ""),
            "report.windows: compares calibrators over time",
        ),
        (("  windows: 3\n", "  windows: 3\n  window: 3\n"), "window"),
    ],
)
def test_row_level_keys_are_checked(tmp_path, edit, message):
    path = _cfg(tmp_path, TINY.replace(*edit))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)


MCGRAD = TINY.replace(
    "    - {name: platt, calibration: platt, from_variant: layernorm}\n",
    "    - {name: mcg, calibration: {name: mcgrad, categorical: [C6], numeric: [I1]}, "
    "from_variant: layernorm}\n"
    "    - {name: ls, calibration: {name: label_shift, calibrate: mcgrad}, "
    "from_variant: layernorm}\n",
)


def test_validate_names_every_missing_optional_package(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcgrad" else real(name, *a)
    )
    assert main(["validate", str(_cfg(tmp_path, MCGRAD))]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1  # one line per missing package, no traceback
    assert "report.variants[1].calibration" in err[0]
    assert "'mcgrad'" in err[0] and "pip install 'ctrcal[mcgrad]'" in err[0]
    assert "mcg, ls" in err[0]  # the nested calibrate: mcgrad counts too


@pytest.mark.skipif(importlib.util.find_spec("mcgrad") is None, reason="needs mcgrad")
def test_validate_accepts_mcgrad_on_numeric_buckets_when_installed(tmp_path, capsys):
    assert main(["validate", str(_cfg(tmp_path, MCGRAD))]) == 0
    bad = MCGRAD.replace("numeric: [I1]", "numeric: [I99]")
    assert main(["validate", str(_cfg(tmp_path, bad))]) != 0
    assert "unknown field 'I99'" in capsys.readouterr().err
