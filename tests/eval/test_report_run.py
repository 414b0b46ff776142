"""The whole protocol on a tiny run: prepare -> train LN / MC-LN x 2 seeds -> shift report."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

pytest.importorskip("ctrcal.train.trainer")

from ctrcal.cli import main  # noqa: E402

TINY = """
data:
  synthetic: {rows: 3000, seed: 0}
features: {min_count: 2}
model:
  embedding_dim: 4
  hidden_units: [16]
train:
  epochs: 1
  batch_size: 256
  eval_batch_size: 1024
  progress: false
report:
  seeds: 2
  intensities: [0.0, 0.125, 0.5]
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}
    - {name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}
    - {name: mclayernorm_ts, temperature_scaling: true, from_variant: mclayernorm}
"""


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_report")
    cfg = root / "tiny.yaml"
    cfg.write_text(TINY)
    out = root / "out"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    return cfg, out


def _tables(text: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip("|").split("|")])
        elif cur:
            tables.append(cur)
            cur = []
    return tables + ([cur] if cur else [])


def test_files_exist_and_figure_is_png(tiny_report, capsys):
    _, out = tiny_report
    for name in ("report.md", "results.csv", "summary.json", "fig_auc_ece.png"):
        assert (out / name).stat().st_size > 0, name
    for png in out.glob("fig_*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in out.glob("fig_*.png")} >= {
        "fig_auc_ece.png",
        "fig_calibration.png",
        "fig_reliability.png",
        "fig_uncertainty.png",
    }
    for variant in ("layernorm", "mclayernorm"):
        for k in (0, 1):
            assert (out / "runs" / variant / f"seed{k}" / "result.json").exists()
    assert not (out / "runs" / "mclayernorm_mc").exists()  # reuses mclayernorm's runs


def test_results_grid_is_complete(tiny_report):
    _, out = tiny_report
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == ["variant", "seed", "noise_seed", "intensity", "metric", "value"]
    auc = df[df.metric == "auc"]
    assert len(auc) == 4 * 2 * 3  # variants x seeds x intensities
    assert auc["value"].between(0, 1).all()
    mc = df[df.variant == "mclayernorm_mc"]
    assert {"pred_std", "std_auroc"} <= set(mc.metric)
    assert "pred_std" not in set(df[df.variant == "layernorm"].metric)
    # the shift changes predictions: metrics move away from the clean values
    ln = auc[auc.variant == "layernorm"].set_index(["seed", "intensity"])["value"]
    assert any(ln[(k, 0.5)] != ln[(k, 0.0)] for k in (0, 1))
    # temperature scaling keeps the ranking of the runs it calibrates
    ts = auc[auc.variant == "mclayernorm_ts"].set_index(["seed", "intensity"])["value"]
    one = auc[auc.variant == "mclayernorm"].set_index(["seed", "intensity"])["value"]
    pd.testing.assert_series_equal(ts, one, check_names=False, atol=1e-9)


def test_report_tables_parse_and_verdict_present(tiny_report):
    _, out = tiny_report
    text = (out / "report.md").read_text()
    assert "## Verdict" in text and "Holm" in text
    tables = _tables(text)
    assert tables and tables[0][0] == ["variant", "0 %", "12.5 %", "50 %"]
    for table in tables:
        assert len({len(r) for r in table}) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] and summary["verdict"] in text
    assert summary["n_seeds"] == 2 and summary["baseline"] == "layernorm"


def test_rerun_reuses_runs_and_is_deterministic(tiny_report, capsys):
    cfg, out = tiny_report
    before = (out / "results.csv").read_text()
    stamp = (out / "runs" / "layernorm" / "seed0" / "result.json").stat().st_mtime_ns
    assert main(["shift-report", str(cfg), "--out", str(out), "--data", str(out / "data")]) == 0
    printed = capsys.readouterr().out
    assert "report.md" in printed and "fig_auc_ece.png" in printed and "total time" in printed
    assert (out / "runs" / "layernorm" / "seed0" / "result.json").stat().st_mtime_ns == stamp
    assert (out / "results.csv").read_text() == before


def test_mix_fraction_scores_the_shifted_rows(tiny_report, tmp_path, capsys):
    cfg, out = tiny_report
    mix_cfg = tmp_path / "mix.yaml"
    mix_cfg.write_text(TINY.replace("  seeds: 2\n", "  seeds: 2\n  mix_fraction: 0.5\n"))
    out2 = tmp_path / "mix"
    shutil.copytree(out / "runs", out2 / "runs")
    stamp = (out2 / "runs" / "mclayernorm" / "seed1" / "result.json").stat().st_mtime_ns
    args = ["shift-report", str(mix_cfg), "--out", str(out2), "--data", str(out / "data")]
    assert main(args) == 0
    assert (out2 / "runs" / "mclayernorm" / "seed1" / "result.json").stat().st_mtime_ns == stamp
    mix = pd.read_csv(out2 / "results.csv").set_index(
        ["variant", "seed", "noise_seed", "intensity", "metric"]
    )["value"]
    full = pd.read_csv(out / "results.csv").set_index(mix.index.names)["value"]
    clean = mix.index.get_level_values("intensity") == 0.0
    pd.testing.assert_series_equal(mix[clean], full.loc[mix[clean].index])  # all rows, no noise
    key = ("layernorm", 0, 0, 0.5, "auc")
    assert mix[key] != full[key]  # half the rows, each shifted
    assert ("mclayernorm_mc", 0, 0, 0.5, "std_auroc") in mix.index
    assert "only 50 % of the rows" in (out2 / "report.md").read_text()


def test_shift_moves_predictions_of_a_trained_masknet(tiny_report):
    import torch

    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.eval.shift import GaussianShift
    from ctrcal.train.trainer import load_run, predict_logits

    _, out = tiny_report
    model, _, fm = load_run(out / "runs" / "layernorm" / "seed0")
    data = ParquetCTRData(out / "data", "test")
    clean = predict_logits(model, data, 1024, "cpu")
    shifted = predict_logits(
        model, data, 1024, "cpu", transform=GaussianShift(fm.numeric_std, 0.5, seed=0)
    )
    assert clean.shape == shifted.shape
    assert (clean - shifted).abs().mean() > 1e-4 * clean.abs().mean().clamp_min(1e-6)
    assert not torch.equal(clean, shifted)


def test_missing_data_dir_is_one_line_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY)
    code = main(
        ["shift-report", str(cfg), "--out", str(tmp_path / "o"), "--data", str(tmp_path / "nope")]
    )
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err


def test_bad_report_config_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY + "  baseline: nope\n")
    assert main(["shift-report", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "report.baseline" in err and "nope" in err
