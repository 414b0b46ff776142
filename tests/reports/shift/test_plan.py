"""`ctrcal validate` on the report section: shifts, baselines, every shipped config."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrcal.cli import main
from ctrcal.reports.shift.plan import check_report, plan_shifts
from ctrcal.validate import load_config

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.yaml"))

BASE = """
model: {dropout: 0.0}
report:
  seeds: 2
"""


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_plans_its_report(path):
    # read without the checks: tests/test_validate.py validates every shipped config
    plans, shifts = check_report(load_config(path, check_names=False))
    assert plans and shifts


@pytest.mark.parametrize(
    ("report", "key", "message"),
    [
        (
            "  shifts: [{name: categorical_corruptoin}]",
            "report.shifts[0].name",
            "did you mean 'categorical_corruption'",
        ),
        (
            "  shifts: [{name: categorical_corruption, intensities: [0.1, 1.2]}]",
            "report.shifts[0].intensities[1]",
            "<= 1",
        ),
        (
            "  shifts: [{name: gaussian_numeric, intensities: [0.25, -0.5]}]",
            "report.shifts[0].intensities[1]",
            ">= 0",
        ),
        (
            "  shifts: [{name: gaussian_numeric, space: raw}]",
            "report.shifts[0].space",
            "'original', 'model'",
        ),
        (
            "  shifts: [{name: gaussian_numeric}, {name: gaussian_numeric, space: model}]",
            "report.shifts[1].label",
            "appears twice",
        ),
        (
            "  variants: [{name: ln}, {name: ens, ensemble: 1, from_variant: ln}]",
            "report.variants[1].ensemble",
            "ensemble of one run",
        ),
        (
            "  variants: [{name: ln}, {name: mcd, mc_samples: 5, mc_dropout: true, "
            "from_variant: ln}]",
            "report.variants[1].mc_dropout",
            "no dropout",
        ),
        (
            "  variants: [{name: ln}, {name: mcd, mc_dropout: true, from_variant: ln}]",
            "report.variants[1].mc_dropout",
            "mc_samples >= 2",
        ),
        ("  power: 1.5", "report.power", "(0, 1)"),
        (
            "  intensities: [0.5]\n  shifts: [{name: gaussian_numeric}]",
            "report.intensities",
            "applies only without report.shifts",
        ),
    ],
)
def test_validate_names_file_and_key(tmp_path, capsys, report, key, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BASE + report + "\n")
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(cfg) in err and key in err and message in err, err


def test_default_shift_is_the_gaussian_in_original_space_over_report_intensities():
    cfg = load_config(None, check_names=False)
    (shift,) = plan_shifts(cfg)
    assert shift.name == "gaussian_numeric" and shift.options == {"space": "original"}
    assert shift.intensities == (0.0625, 0.125, 0.25, 0.5)  # 0 is the shared clean point


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("data: {split_order: time}", "keep data.split_order: random"),
        ("data: {train: [a.csv], valid: [b.csv], test: [c.csv]}", "cannot be re-split in time"),
    ],
)
def test_temporal_needs_inputs_it_can_split_in_time(tmp_path, capsys, data, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(data + "\nreport:\n  shifts: [{name: temporal}]\n")
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "report.shifts[0].name" in err and message in err, err
    ok = tmp_path / "ok.yaml"
    ok.write_text("report:\n  shifts: [{name: gaussian_numeric}, {name: temporal}]\n")
    assert main(["validate", str(ok)]) == 0
