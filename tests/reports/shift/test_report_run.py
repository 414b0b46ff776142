"""The whole protocol on the session's tiny report (``shift_report`` in conftest.py): prepare
-> train LN / MC-LN / MC-LN on fields x 2 seeds -> shift report."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

pytest.importorskip("ctrcal.train.trainer")

from shift_report import CONFIG, POINTS, SEEDS, TRAINED, VARIANTS, without_temporal  # noqa: E402

from ctrcal.cli import main  # noqa: E402

# a knob of the report itself, run again on the session's runs: three of its variants and
# its Gaussian shift (the other variants and shifts would be evaluated again for nothing)
RERUN = without_temporal().split("  shifts:\n")[0] + (
    "  shifts:\n"
    "    - {name: gaussian_numeric, intensities: [0.125, 0.5]}\n"
    "  variants:\n"
    "    - {name: layernorm, net_norm: layernorm}\n"
    "    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}\n"
    "    - {name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}\n"
)


def _tables(text: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip("|").split("|")])
        elif cur:
            tables.append(cur)
            cur = []
    return tables + ([cur] if cur else [])


def test_files_and_runs_exist(shift_report, capsys):
    _, out = shift_report
    for name in ("report.md", "results.csv", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert not list(out.glob("fig_*.png"))  # report.figures: false (the rerun test draws them)
    for variant in TRAINED:
        for k in range(SEEDS):
            assert (out / "runs" / variant / f"seed{k}" / "result.json").exists()
    # the ensemble's extra members: seeds 2 (replicate 0) and 3 (replicate 1) of layernorm
    assert (out / "runs" / "layernorm" / "seed3" / "result.json").exists()
    assert not (out / "runs" / "layernorm" / "seed4").exists()
    assert not (out / "runs" / "mclayernorm" / "seed2").exists()
    assert not (out / "runs" / "mclayernorm_mc").exists()  # reuses mclayernorm's runs


def test_results_grid_is_complete(shift_report):
    _, out = shift_report
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == [
        "variant",
        "shift",
        "seed",
        "noise_seed",
        "intensity",
        "metric",
        "value",
    ]
    auc = df[df.metric == "auc"]
    assert len(auc) == len(VARIANTS) * SEEDS * POINTS
    assert set(auc["shift"]) == {"clean", "gaussian_numeric", "categorical_corruption", "temporal"}
    assert auc["value"].between(0, 1).all()
    for variant in ("mclayernorm_mc", "ensemble", "mc_dropout", "mcln_fields_mc"):
        sub = df[df.variant == variant]
        assert {"pred_std", "std_auroc"} <= set(sub.metric), variant
        assert (sub[sub.metric == "pred_std"]["value"] > 0).all(), variant
    assert "pred_std" not in set(df[df.variant == "layernorm"].metric)
    # every shift changes predictions: metrics move away from the clean values
    for shift in ("gaussian_numeric", "categorical_corruption"):
        ln = auc[(auc.variant == "layernorm") & auc["shift"].isin(["clean", shift])]
        ln = ln.set_index(["seed", "intensity"])["value"]
        top = max(ln.index.get_level_values("intensity"))
        assert any(ln[(k, top)] != ln[(k, 0.0)] for k in (0, 1)), shift
    # temperature scaling keeps the ranking of the runs it calibrates
    key = ["shift", "seed", "intensity"]
    ts = auc[auc.variant == "mclayernorm_ts"].set_index(key)["value"]
    one = auc[auc.variant == "mclayernorm"].set_index(key)["value"]
    pd.testing.assert_series_equal(ts, one, check_names=False, atol=1e-9)


def test_ensemble_averages_its_members_and_mc_variants_sample(shift_report):
    import numpy as np
    import torch

    from ctrcal import metrics as M
    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.train.predict import dropout_modules, predict_logits
    from ctrcal.train.results import load_run

    _, out = shift_report
    data = ParquetCTRData(out / "data", "test")
    runs = out / "runs" / "layernorm"
    probs = [
        torch.sigmoid(predict_logits(load_run(runs / f"seed{j}")[0], data, 1024, "cpu"))
        for j in (1, 3)  # replicate 1: the run of seed 1 and its own extra member
    ]
    mean = torch.stack(probs).double().mean(0).numpy()
    labels = np.concatenate([b.label.numpy() for b in data.batches(1024, shuffle=False)])
    df = pd.read_csv(out / "results.csv")
    got = df[(df.variant == "ensemble") & (df.seed == 1) & (df["shift"] == "clean")]
    got = got.set_index("metric")["value"]
    assert got["auc"] == pytest.approx(M.auc(mean, labels), abs=1e-6)
    model = load_run(out / "runs" / "mcln_fields" / "seed0")[0]
    assert any(hasattr(m, "mc_sampling") for m in model.emb_norm.modules())
    assert not any(hasattr(m, "mc_sampling") for m in model.blocks.modules())
    assert dropout_modules(load_run(runs / "seed0")[0])


def test_report_tables_parse_and_verdict_present(shift_report):
    _, out = shift_report
    text = (out / "report.md").read_text()
    assert "## Verdict" in text and "Holm" in text and "## Shift: categorical_corruption" in text
    assert "Space: **original**" in text
    tables = _tables(text)
    # the first screen: the detectable difference per metric, then the appendix
    assert tables[0][0] == ["metric", "comparisons", "at every point", "median point", "best point"]
    assert text.index("## Summary") < text.index("\n# Appendix\n") < text.index("## Verdict")
    assert tables[1][0][0] == "space"  # the stds of the gaussian shift in both spaces
    # the verdict: the primary family as one table, then one sentence
    assert tables[2][0] == ["variant", "metric", "point", "Δ ± SE", "p", "p_Holm", "detectable"]
    assert len(tables[2]) == 2 + (len(VARIANTS) - 1) * 2 * POINTS
    verdict = text.split("## Verdict")[1].split("\n## ")[0].strip().splitlines()
    after = verdict[max(i for i, line in enumerate(verdict) if line.startswith("|")) + 1 :]
    sentence = next(line for line in after if line.strip())
    assert sentence.startswith(("No variant differs", "Only these differ"))
    assert tables[3][0] == ["variant", "clean", "12.5 %", "50 %"]
    assert ["variant", "clean", "probability 0.2", "probability 0.6"] in [t[0] for t in tables]
    for table in tables:
        assert len({len(r) for r in table}) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == sentence
    assert summary["n_seeds"] == 2 and summary["baseline"] == "layernorm"
    # the primary family: every variant but the baseline x {AUC, ECE} x every point
    primary = [r for r in summary["paired"] if r["primary"]]
    assert len(primary) == (len(VARIANTS) - 1) * 2 * POINTS


def test_report_opens_with_a_summary_and_no_detectable_beyond_its_range(shift_report):
    """2 seeds at Holm's α/m detect nothing a metric in [0, 1] can show: every such cell says
    so in words, in the summary and in the appendix's verdict table, never as a number > 1."""
    _, out = shift_report
    text = (out / "report.md").read_text()
    first = text.split("\n# Appendix\n")[0]
    assert "## Summary" in first
    assert first.count("\n") < 60  # one screen
    assert "Nothing differs significantly" in first or "What differs from" in first
    summary = json.loads((out / "summary.json").read_text())
    beyond = [r for r in summary["paired"] if r["primary"] and (r["detectable"] or 0) > 1]
    assert beyond  # the tiny design cannot detect everything
    tables = _tables(text)
    for table, column in ((tables[0], "at every point"), (tables[2], "detectable")):
        cells = [row[table[0].index(column)] for row in table[2:]]
        for cell in cells:
            assert cell.startswith("cannot detect at this design") or float(cell) <= 1.0
    verdict = tables[2]
    said = sum(row[-1] == "cannot detect at this design" for row in verdict[2:])
    assert said == len(beyond)


def test_rerun_reuses_runs_is_deterministic_and_draws_every_figure(shift_report, tmp_path, capsys):
    """A rerun trains nothing and repeats every number. It is also the suite's one real report
    with figures on (the session's report draws none): every figure of the shift, each a PNG,
    the main one linked from the summary's first screen."""
    _, shared = shift_report
    cfg = tmp_path / "rerun.yaml"
    cfg.write_text(RERUN)
    out = tmp_path / "out"
    shutil.copytree(shared / "runs", out / "runs")  # the session's report stays as it was made
    args = ["shift-report", str(cfg), "--out", str(out), "--data", str(shared / "data")]
    assert main(args) == 0
    capsys.readouterr()
    before = (out / "results.csv").read_text()
    stamp = (out / "runs" / "layernorm" / "seed0" / "result.json").stat().st_mtime_ns
    assert main([*args, "report.figures=true"]) == 0
    printed = capsys.readouterr().out
    assert "report.md" in printed and "_auc_ece.png" in printed and "total time" in printed
    assert (out / "runs" / "layernorm" / "seed0" / "result.json").stat().st_mtime_ns == stamp
    assert (out / "results.csv").read_text() == before
    kinds = ("auc_ece", "calibration", "field_calibration", "field_rce", "uncertainty")
    assert {p.name for p in out.glob("fig_*.png")} == {
        "fig_reliability.png",
        *(f"fig_gaussian_numeric_{kind}.png" for kind in kinds),
    }
    for png in out.glob("fig_*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = (out / "report.md").read_text().split("\n# Appendix\n")[0]
    assert "## Summary" in first and "_auc_ece.png)" in first and first.count("\n") < 60


def test_shared_predictions_are_those_made_anew(shift_report, tmp_path, monkeypatch):
    """The grid draws each point's shifted batches and each run's one-shot prediction once and
    shares them (ensemble, calibrators, MC passes); with nothing kept every variant predicts
    again, and every number is the same bit for bit."""
    from ctrcal.reports.shift import grid

    _, shared = shift_report
    cfg = tmp_path / "anew.yaml"
    head = RERUN.split("  variants:\n")[0]
    cfg.write_text(
        head
        + "  variants:\n"
        + "    - {name: layernorm, net_norm: layernorm}\n"
        + "    - {name: ensemble, ensemble: 2, from_variant: layernorm}\n"
        + "    - {name: mc_dropout, mc_samples: 3, mc_dropout: true, from_variant: layernorm}\n"
        + "    - {name: platt, calibration: platt, from_variant: layernorm}\n"
    )
    out = tmp_path / "out"
    shutil.copytree(shared / "runs" / "layernorm", out / "runs" / "layernorm")
    monkeypatch.setattr(grid, "KEEP_BYTES", 0)
    args = ["shift-report", str(cfg), "--out", str(out), "--data", str(shared / "data")]
    assert main(args) == 0
    keys = ["variant", "shift", "seed", "noise_seed", "intensity", "metric"]
    anew = pd.read_csv(out / "results.csv").set_index(keys)["value"]
    kept = pd.read_csv(shared / "results.csv").set_index(keys)["value"]
    assert set(anew.index.get_level_values("variant")) == {
        "layernorm",
        "ensemble",
        "mc_dropout",
        "platt",
    }
    pd.testing.assert_series_equal(anew, kept.loc[anew.index], check_exact=True)


def test_mix_fraction_scores_the_shifted_rows(shift_report, tmp_path, capsys):
    cfg, out = shift_report
    mix_cfg = tmp_path / "mix.yaml"
    mix = RERUN.replace("  seeds: 2\n", "  seeds: 2\n  mix_fraction: 0.5\n")
    mix_cfg.write_text(mix)
    out2 = tmp_path / "mix"
    shutil.copytree(out / "runs", out2 / "runs")
    stamp = (out2 / "runs" / "mclayernorm" / "seed1" / "result.json").stat().st_mtime_ns
    args = ["shift-report", str(mix_cfg), "--out", str(out2), "--data", str(out / "data")]
    assert main(args) == 0
    assert (out2 / "runs" / "mclayernorm" / "seed1" / "result.json").stat().st_mtime_ns == stamp
    mix = pd.read_csv(out2 / "results.csv").set_index(
        ["variant", "shift", "seed", "noise_seed", "intensity", "metric"]
    )["value"]
    full = pd.read_csv(out / "results.csv").set_index(mix.index.names)["value"]
    clean = mix.index.get_level_values("intensity") == 0.0
    pd.testing.assert_series_equal(mix[clean], full.loc[mix[clean].index])  # all rows, no noise
    key = ("layernorm", "gaussian_numeric", 0, 0, 0.5, "auc")
    assert mix[key] != full[key]  # half the rows, each shifted
    assert ("mclayernorm_mc", "gaussian_numeric", 0, 0, 0.5, "std_auroc") in mix.index
    assert "only 50 % of the rows" in (out2 / "report.md").read_text()


def test_shift_moves_predictions_of_a_trained_masknet(shift_report):
    import torch

    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.shifts.builtin import GaussianShift
    from ctrcal.train.predict import predict_logits
    from ctrcal.train.results import load_run

    _, out = shift_report
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
    cfg.write_text(CONFIG)
    code = main(
        ["shift-report", str(cfg), "--out", str(tmp_path / "o"), "--data", str(tmp_path / "nope")]
    )
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err


def test_bad_report_config_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG + "  baseline: nope\n")
    assert main(["shift-report", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "report.baseline" in err and "nope" in err


def _strip_original_stats(obj):
    if isinstance(obj, dict):
        return {k: _strip_original_stats(v) for k, v in obj.items() if "original" not in k}
    if isinstance(obj, list):
        return [_strip_original_stats(v) for v in obj]
    return obj


def test_original_space_on_data_without_raw_statistics_fails_before_training(
    shift_report, tmp_path, capsys
):
    _, out = shift_report
    data = tmp_path / "data"
    shutil.copytree(out / "data", data)
    fm = data / "feature_map.json"
    fm.write_text(json.dumps(_strip_original_stats(json.loads(fm.read_text()))))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    args = ["shift-report", str(cfg), "--out", str(tmp_path / "o"), "--data", str(data)]
    assert main(args) == 1  # a data error
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "feature_map.json" in err and "original-space" in err
    assert "report.shifts[0].space" in err and str(cfg) in err
    assert not (tmp_path / "o" / "runs").exists()  # nothing trained


def test_original_space_noise_on_prepared_data(shift_report):
    """On a real feature map: the realised noise in original space is s·σ_j, s = 0 round-trips."""
    import torch

    from ctrcal.core.batch import Batch
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.data.loader import ParquetCTRData
    from ctrcal.shifts.registry import create_shift

    _, out = shift_report
    fm = FeatureMap.load(out / "data")
    parts = list(ParquetCTRData(out / "data", "train").batches(100_000, shuffle=False))
    batch = Batch(*(torch.cat([getattr(b, k) for b in parts]) for k in Batch.__annotations__))
    codec = fm.numeric_codec()
    x0 = codec.to_original(batch.numeric).double()
    shifted = create_shift("gaussian_numeric", fm, intensity=0.5, seed=0)(batch)
    noise = codec.to_original(shifted.numeric).double() - x0
    for j, sigma in enumerate(fm.numeric_original_std):
        col = noise[:, j][torch.isfinite(noise[:, j])]
        if col.numel() < 500 or sigma == 0:
            continue
        assert float(col.std()) == pytest.approx(0.5 * sigma, rel=0.1), fm.numeric_fields[j]
    same = create_shift("gaussian_numeric", fm, intensity=0.0, seed=0)(batch).numeric
    ok = torch.isfinite(batch.numeric)
    assert torch.equal(torch.isfinite(same), ok)
    torch.testing.assert_close(same[ok], batch.numeric[ok], rtol=1e-5, atol=1e-5)
