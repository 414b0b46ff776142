"""Report statistics, the verdict table and sentence, markdown and figures on synthetic tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from ctrcal.config import VariantConfig
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.reports.shift import plan as P
from ctrcal.reports.shift import render as W
from ctrcal.reports.shift import stats as S
from ctrcal.reports.shift import verdict as V
from ctrcal.validate import load_config

INTENSITIES = [0.0, 0.0625, 0.125, 0.25, 0.5]


def _results(n_seeds=5, mc_gain=0.02, noise=0.001, seed=0, noise_seeds=1):
    """LN loses AUC linearly with intensity; MC-LN loses `mc_gain` less at 50 %."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n_seeds):
        seed_effect = rng.normal(0, 0.01)  # shared by both variants: pairing removes it
        for variant, gain in (("layernorm", 0.0), ("mclayernorm", mc_gain)):
            for ns in range(noise_seeds):
                for s in INTENSITIES:
                    if s == 0 and ns > 0:
                        continue
                    auc = 0.78 + seed_effect - 0.1 * s + gain * s / 0.5 + rng.normal(0, noise)
                    ece = 0.01 + 0.05 * s - gain * s + abs(rng.normal(0, noise))
                    for metric, value in {
                        "auc": auc,
                        "ece": ece,
                        "ece_mass": ece,
                        "logloss": 0.45 + s / 10,
                        "brier": 0.14 + s / 20,
                        "pcoc": 1.0 + s,
                        "ne": 0.8 + s / 5,
                    }.items():
                        shift = "clean" if s == 0 else "gaussian_numeric"
                        rows.append((variant, shift, k, ns, s, metric, value))
    return pd.DataFrame(rows, columns=S.RESULT_COLUMNS)


def test_per_seed_values_adds_retained_auc_and_averages_noise_seeds():
    df = _results(n_seeds=2, noise_seeds=3)
    ps = S.per_seed_values(df)
    auc = ps[(ps.metric == "auc")]
    assert len(auc) == 2 * 2 * len(INTENSITIES)
    ret = ps[(ps.metric == "auc_retained") & (ps.intensity == 0.0)]
    np.testing.assert_allclose(ret["value"], 1.0)
    raw = df[
        (df.variant == "layernorm") & (df.seed == 1) & (df.intensity == 0.5) & (df.metric == "auc")
    ]["value"].mean()
    got = auc[(auc.variant == "layernorm") & (auc.seed == 1) & (auc.intensity == 0.5)]
    assert float(got["value"].iloc[0]) == pytest.approx(raw)


def test_summarize_mean_and_standard_error():
    df = _results(n_seeds=4)
    summary = S.summarize(df)
    sub = df[(df.variant == "layernorm") & (df.intensity == 0.25) & (df.metric == "auc")]
    row = summary[
        (summary.variant == "layernorm") & (summary.intensity == 0.25) & (summary.metric == "auc")
    ].iloc[0]
    assert row["mean"] == pytest.approx(sub["value"].mean())
    assert row["se"] == pytest.approx(sub["value"].std(ddof=1) / 2.0)
    assert row["n"] == 4


def test_paired_differences_detect_a_real_gain():
    diffs = S.paired_differences(_results(n_seeds=5, mc_gain=0.02), "layernorm")
    auc50 = diffs[(diffs.metric == "auc") & (diffs.intensity == 0.5)].iloc[0]
    assert auc50["diff"] == pytest.approx(0.02, abs=0.005)
    assert auc50["significant"] and auc50["better"] is True
    # paired t-test by hand
    df = S.per_seed_values(_results(n_seeds=5, mc_gain=0.02))
    sel = (df.metric == "auc") & (df.intensity == 0.5)
    d = (
        df[sel & (df.variant == "mclayernorm")].sort_values("seed")["value"].to_numpy()
        - df[sel & (df.variant == "layernorm")].sort_values("seed")["value"].to_numpy()
    )
    from scipy import stats

    assert auc50["p"] == pytest.approx(stats.ttest_rel(d, np.zeros_like(d)).pvalue, rel=1e-6)
    ece50 = diffs[(diffs.metric == "ece") & (diffs.intensity == 0.5)].iloc[0]
    assert ece50["diff"] < 0 and ece50["better"] is True  # lower ECE is better
    clean = diffs[(diffs.metric == "auc") & (diffs.intensity == 0.0)].iloc[0]
    assert not clean["significant"] and clean["better"] is None


def _one_sentence(text):
    body = text.rstrip(".")
    return "\n" not in text and ". " not in body and text.endswith(".")


def test_verdict_says_no_significant_difference_when_there_is_none():
    summary = S.summarize_report(_results(n_seeds=3, mc_gain=0.0, noise=0.01, seed=1))
    assert summary.significant.empty and summary.tests == 10
    text = V.verdict_sentence(summary)
    assert text.startswith("No variant differs significantly from layernorm at any shift point")
    assert "10 paired tests" in text and "3 seeds" in text and _one_sentence(text)
    lines = V.verdict_lines(summary, {})
    table = _parse_markdown_tables("\n".join(lines))[0]
    assert table[0] == ["variant", "metric", "point", "Δ ± SE", "p", "p_Holm", "detectable"]
    assert len(table) == 2 + 10 and not any("**" in c for r in table for c in r)
    assert lines[-2] == text  # the sentence follows the table


def test_verdict_names_only_what_survives_the_family():
    summary = S.summarize_report(_results(n_seeds=6, mc_gain=0.03, noise=0.0005))
    text = V.verdict_sentence(summary)
    assert _one_sentence(text) and text.startswith("Only these differ from layernorm")
    sig = summary.significant
    assert not sig.empty
    named = set()
    for part in text.split("): ", 1)[1].rstrip(".").split("; "):
        head, points = part.split(" at ", 1)
        variant, _, word, metric = head.split(" ")
        assert variant == "mclayernorm" and word == "better"
        for group in points.split(" and "):  # "clean", "<shift> <level>, <level>, ..."
            shift, _, levels = group.partition(" ")
            named |= {(metric, f"{shift} {lv}".strip()) for lv in levels.split(", ")}
    # exactly the comparisons that survive the family-wise correction are named
    names = {"auc": "AUC", "ece": "ECE"}
    assert named == {(names[r.metric], V.point_label(r, {})) for r in sig.itertuples()}
    # the table marks exactly the surviving cells
    table = _parse_markdown_tables("\n".join(V.verdict_lines(summary, {})))[0]
    marked = [r for r in table[2:] if r[3].startswith("**")]
    assert len(marked) == len(sig) and all(r[3].endswith("✓**") for r in marked)
    header = table[0]
    rows = {(r.metric, V.point_label(r, {})): r for r in summary.primary.itertuples()}
    assert len(rows) == len(table) - 2
    for cells in table[2:]:
        row = rows[(cells[1].lower(), cells[2])]
        assert float(cells[header.index("p_Holm")]) == pytest.approx(row.p_holm, rel=1e-2)
        assert float(cells[header.index("detectable")]) == pytest.approx(row.detectable, abs=1e-4)


def _family_table():
    """Two variants, two shifts: per-seed AUC/ECE/logloss with chosen paired differences."""
    rows = []
    diffs = {  # (variant, shift, intensity, metric) -> per-seed differences vs the baseline
        ("a", "clean", 0.0, "auc"): [0.010, 0.012, 0.011, 0.009],
        ("a", "g", 0.5, "auc"): [0.020, 0.010, 0.030, 0.020],
        ("a", "c", 0.2, "ece"): [-0.001, 0.002, -0.002, 0.001],
        ("b", "g", 0.5, "auc"): [0.001, -0.002, 0.003, 0.000],
        ("b", "c", 0.2, "logloss"): [0.05, 0.051, 0.049, 0.05],
    }
    for (variant, shift, s, metric), ds in diffs.items():
        for k, d in enumerate(ds):
            base = 0.7 + 0.01 * k
            rows.append(("base", shift, k, 0, s, metric, base))
            rows.append((variant, shift, k, 0, s, metric, base + d))
    return pd.DataFrame(rows, columns=S.RESULT_COLUMNS), diffs


def test_holm_runs_over_the_whole_primary_family_by_hand():
    from scipy import stats

    df, chosen = _family_table()
    out = S.paired_differences(df, "base", alpha=0.05, metrics=["auc", "ece", "logloss"])
    prim = out[out["primary"]]
    assert len(prim) == 4 and set(prim["metric"]) == {"auc", "ece"}  # logloss: exploratory
    raw = {
        key: stats.ttest_1samp(np.array(ds), 0.0).pvalue
        for key, ds in chosen.items()
        if key[3] in ("auc", "ece")
    }
    # Holm by hand: sort, multiply by m, m-1, ..., take the running max, cap at 1
    order = sorted(raw, key=raw.get)
    m, running, expected = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, (m - i) * raw[key])
        expected[key] = min(1.0, running)
    for r in prim.itertuples():
        key = (r.variant, r.shift, r.intensity, r.metric)
        assert r.p == pytest.approx(raw[key], rel=1e-9)
        assert r.p_holm == pytest.approx(expected[key], rel=1e-9)
        assert r.significant == (expected[key] < 0.05)
    expl = out[~out["primary"]].iloc[0]
    assert math.isnan(expl["p_holm"]) and math.isnan(expl["detectable"])
    # the same comparison alone in its family would have a smaller adjusted p
    alone = S.paired_differences(
        df[df.variant.isin(["base", "a"]) & (df["shift"] == "g")], "base", metrics=["auc"]
    )
    assert (
        alone["p_holm"].iloc[0]
        < prim[(prim.variant == "a") & (prim["shift"] == "g")]["p_holm"].iloc[0]
    )


def test_detectable_difference_by_hand():
    # n = 10 pairs, sd 1, alpha 0.05, 80 % power: (t_.975,9 + t_.80,9) / sqrt(10), with the
    # t quantiles from a table: 2.262157 and 0.883404
    got = S.detectable_difference(1.0, 10, 0.05, 0.8)
    assert got == pytest.approx((2.262157 + 0.883404) / math.sqrt(10), rel=1e-5)
    # n = 5, sd 0.02, alpha 0.01: t_.995,4 = 4.604095, t_.80,4 = 0.940965
    assert S.detectable_difference(0.02, 5, 0.01) == pytest.approx(
        (4.604095 + 0.940965) * 0.02 / math.sqrt(5), rel=1e-5
    )
    assert math.isnan(S.detectable_difference(1.0, 1, 0.05))
    # in the table: at alpha / m with the observed sd of the paired differences
    df, chosen = _family_table()
    out = S.paired_differences(df, "base", alpha=0.05, metrics=["auc", "ece"])
    r = out[(out.variant == "a") & (out["shift"] == "g")].iloc[0]
    sd = float(np.std(chosen[("a", "g", 0.5, "auc")], ddof=1))
    assert r["detectable"] == pytest.approx(S.detectable_difference(sd, 4, 0.05 / 4), rel=1e-9)


def test_seeds_needed_is_the_detectable_calculation_solved_for_n():
    # sd 0.002 of the paired ΔAUC, target 0.005 at α/m = 0.05/35
    level = 0.05 / 35
    n = S.seeds_needed(0.002, 0.005, level)
    assert S.detectable_difference(0.002, n, level) <= 0.005
    assert S.detectable_difference(0.002, n - 1, level) > 0.005
    assert S.seeds_needed(0.0, 0.005, level) == 2
    assert S.seeds_needed(1.0, 1e-6, level, most=50) == 51
    assert S.seeds_needed(math.nan, 0.005, level) == 1001


def test_a_detectable_difference_beyond_the_metric_range_is_said_in_words():
    assert S.within_range("ece", 1.0) and not S.within_range("ece", 1.01)
    assert not S.within_range("auc", -1.5) and not S.within_range("auc", math.nan)
    assert S.within_range("logloss", 7.0)  # unbounded above
    assert V.detectable_text("ece", 1.01) == V.CANNOT_DETECT == "cannot detect at this design"
    assert V.detectable_text("auc", 0.00412) == "0.0041"
    assert V.detectable_text("auc", math.nan) == "n/a"


def test_summary_names_what_differs_and_the_detectable_difference_per_metric():
    summary = S.summarize_report(_results(n_seeds=6, mc_gain=0.03, noise=0.0005))
    lines = V.summary_lines(summary, {})
    text = "\n".join(lines)
    assert text.startswith("**What differs from layernorm** (10 paired tests")
    sig = summary.significant
    names = {"auc": "AUC", "ece": "ECE"}
    for (variant, metric), grp in sig.groupby(["variant", "metric"]):
        head = f"- **{variant}**: better {names[metric]} at "
        bullet = next(line for line in lines if line.startswith(head))
        assert f"(Δ {grp['diff'].min():+.4f}" in bullet and f"{grp['diff'].max():+.4f})" in bullet
    table = _parse_markdown_tables(text)[0]
    assert table[0] == ["metric", "comparisons", "at every point", "median point", "best point"]
    by_metric = summary.detectable_by_metric().set_index("metric")
    for row in table[2:]:
        metric = {"AUC": "auc", "ECE": "ece"}[row[0]]
        assert int(row[1]) == by_metric.loc[metric, "comparisons"] == 5
        assert float(row[2]) == pytest.approx(by_metric.loc[metric, "largest"], abs=1e-4)
        assert float(row[4]) == pytest.approx(by_metric.loc[metric, "smallest"], abs=1e-4)
    # nothing significant: said in one line; 2 seeds at α/m detect no ECE difference at all
    noisy = S.summarize_report(_results(n_seeds=2, mc_gain=0.0, noise=0.3, seed=1))
    text = "\n".join(V.summary_lines(noisy, {}))
    assert "**Nothing differs significantly from layernorm** at any point" in text
    ece = next(r for r in _parse_markdown_tables(text)[0] if r[0] == "ECE")
    beyond = int(noisy.detectable_by_metric().set_index("metric").loc["ece", "beyond"])
    assert beyond > 0 and ece[2] == f"cannot detect at this design ({beyond} of 5)"


def test_verdict_single_seed():
    summary = S.summarize_report(_results(n_seeds=1))
    assert summary.paired["significant"].sum() == 0
    text = V.verdict_sentence(summary)
    assert "1 training seed(s) there is no standard error" in text and _one_sentence(text)


def test_tables_without_a_shift_column_read_as_one_gaussian_shift():
    df = _results(n_seeds=2).drop(columns="shift")
    ps = S.per_seed_values(df)
    assert set(ps["shift"]) == {"clean", "gaussian_numeric"}


def _parse_markdown_tables(text):
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def test_write_report_files_tables_and_figures(tmp_path):
    df = _results(n_seeds=3)
    # MC-style uncertainty rows for one variant
    extra = [
        ("mclayernorm", "clean" if s == 0 else "gaussian_numeric", k, 0, s, m, v)
        for k in range(3)
        for s in INTENSITIES
        for m, v in (("pred_std", 0.01 + s / 10), ("std_auroc", 0.5 + s / 2))
        if not (m == "std_auroc" and s == 0)
    ]
    df = pd.concat([df, pd.DataFrame(extra, columns=S.RESULT_COLUMNS)], ignore_index=True)
    curve = {"counts": [10, 5, 0], "mean_prob": [0.1, 0.5, np.nan], "frac_pos": [0.12, 0.4, np.nan]}
    reliability = {
        v: {("clean", 0.0): curve, ("gaussian_numeric", 0.5): curve}
        for v in ("layernorm", "mclayernorm")
    }
    meta = W.ReportMeta(
        rows=1234,
        shifts=[
            {
                "label": "gaussian_numeric",
                "name": "gaussian_numeric",
                "unit": "std",
                "description": "noise",
                "intensities": INTENSITIES[1:],
                "space": "original",
                "original_std": [3.0, 40.0],
                "model_std": [1.0, 1.0],
                "numeric_fields": ["I1", "I2"],
            }
        ],
    )
    paths = W.write_report(S.summarize_report(df), tmp_path, meta, reliability=reliability)
    for p in (paths.report_md, paths.results_csv, paths.summary_json, *paths.figures.values()):
        assert p.exists() and p.stat().st_size > 0
    assert set(paths.figures) == {
        "auc_ece:gaussian_numeric",
        "calibration:gaussian_numeric",
        "uncertainty:gaussian_numeric",
        "reliability",
    }
    for fig in paths.figures.values():
        assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths.main_figure == tmp_path / "fig_gaussian_numeric_auc_ece.png"

    back = pd.read_csv(paths.results_csv)
    assert list(back.columns) == S.RESULT_COLUMNS and len(back) == len(df)

    text = paths.report_md.read_text()
    assert "## Verdict" in text and "## Metric definitions" in text
    assert "Space: **original**" in text and "40" in text  # the space and both stds
    # one screen first: the detectable difference per metric and the figure, then the appendix
    first, appendix = text.split("\n# Appendix\n")
    assert "## Summary" in first and "fig_gaussian_numeric_auc_ece.png" in first
    assert "## Verdict" in appendix and "## Shift: gaussian_numeric" in appendix
    tables = _parse_markdown_tables(text)
    assert len(tables) >= 9
    detect = tables[0]
    assert detect[0] == ["metric", "comparisons", "at every point", "median point", "best point"]
    assert [r[0] for r in detect[2:]] == ["AUC", "ECE"]
    std_table = tables[1]
    assert std_table[0] == ["space", "I1", "I2"] and std_table[2] == ["original (used)", "3", "40"]
    auc_table = tables[3]
    assert auc_table[0] == ["variant", "clean", "6.25 %", "12.5 %", "25 %", "50 %"]
    assert [r[0] for r in auc_table[2:]] == ["layernorm", "mclayernorm"]
    mean, se = (float(x) for x in auc_table[2][1].split("±"))
    assert 0.5 < mean < 1 and se >= 0
    for table in tables:
        assert len({len(r) for r in table}) == 1  # every row has the header's width
    assert "## Verdict: each variant vs layernorm" in text and "## Exploratory" in text
    verdict = tables[2]
    assert verdict[0][-1] == "detectable" and len(verdict) == 2 + 10

    summary = json.loads(paths.summary_json.read_text())
    assert summary["verdict"] in text
    assert summary["n_seeds"] == 3 and summary["baseline"] == "layernorm"
    assert any(r["metric"] == "auc_retained" for r in summary["summary"])
    assert summary["shifts"][0]["space"] == "original"


def test_write_report_without_figures(tmp_path):
    paths = W.write_report(S.summarize_report(_results(n_seeds=2)), tmp_path, figures=False)
    assert paths.figures == {} and paths.main_figure is None
    assert "## Figures" not in paths.report_md.read_text()
    summary = json.loads(paths.summary_json.read_text())
    assert summary["elapsed"] == "n/a" and summary["timing_s"] is None


def test_report_meta_states_how_the_report_was_made(tmp_path):
    meta = W.ReportMeta(
        rows=500,
        device="cpu",
        timing=W.Timing(train=3605.0, eval=65.0, total=3670.0),
        training=W.TrainingInfo(["cpu", "cpu"], 1, {"trained": 4}),
        variant_descriptions=["layernorm (one-shot)", "mclayernorm (one-shot)"],
    )
    paths = W.write_report(S.summarize_report(_results(n_seeds=2)), tmp_path, meta, figures=False)
    text = paths.report_md.read_text()
    assert "wall time 1h01m10s (training 1h00m05s, evaluation 1m05s)" in text
    assert "Variants: layernorm (one-shot), mclayernorm (one-shot)." in text
    summary = json.loads(paths.summary_json.read_text())
    assert summary["timing_s"] == {
        "train": 3605.0,
        "eval": 65.0,
        "total": 3670.0,
        "eval_by_variant": {},
    }
    assert summary["training"] == {
        "workers": ["cpu", "cpu"],
        "threads_per_run": 1,
        "runs": {"trained": 4},
    }
    assert summary["rows"] == 500 and summary["n_seeds"] == 2


def test_plan_variants_resolves_runs_and_rejects_bad_ones():
    cfg = load_config(None, check_names=False)
    plans = P.plan_variants(cfg)
    by = {p.name: p for p in plans}
    assert by["layernorm"].trains and by["mclayernorm"].trains
    assert by["mclayernorm_mc"].run_variant == "mclayernorm" and by["mclayernorm_mc"].mc_samples
    cfg.report.variants.append(
        VariantConfig(
            "ts", NormSpec("layernorm"), temperature_scaling=True, from_variant="mclayernorm_mc"
        )
    )
    plans = P.plan_variants(cfg)
    assert plans[-1].run_variant == "mclayernorm"
    assert plans[-1].calibration == {"name": "temperature"}
    cfg.report.variants[-1].platt_scaling = True
    with pytest.raises(ConfigError, match="not both"):
        P.plan_variants(cfg)
    cfg.report.variants.pop()
    cfg.report.baseline = "nope"
    with pytest.raises(ConfigError, match="report.baseline"):
        P.plan_variants(cfg)
    cfg.report.baseline = None
    cfg.report.mix_fraction = 0.0
    with pytest.raises(ConfigError, match="mix_fraction"):
        P.plan_variants(cfg)


def test_variant_train_config_sets_norm_and_seed():
    cfg = load_config(None, check_names=False)
    plan = P.plan_variants(cfg)[1]
    vcfg = P.variant_train_config(cfg, plan, 2)
    assert vcfg.model.net_norm.name == "mclayernorm" and vcfg.train.seed == cfg.train.seed + 2
    assert cfg.model.net_norm.name == "layernorm"  # the input config is not modified


def test_format_intensity():
    assert S.format_intensity(0.0625) == "6.25 %"
    assert S.format_intensity(0.0) == "0 %"
    assert math.isclose(float(S.format_intensity(0.5).split()[0]), 50)


def test_auc_of_a_rank_preserving_recalibration_is_not_tested(tmp_path):
    """Temperature scaling of the baseline's own runs cannot change AUC: no test, no family slot."""
    df, chosen = _family_table()
    # "ts": the baseline's AUC up to round-off of ties (one seed off by 1e-8), ECE really lower
    ts = df[df["variant"] == "base"].copy()
    ts["variant"] = "ts"
    ts.loc[ts["metric"] == "auc", "value"] += np.where(
        ts.loc[ts["metric"] == "auc", "seed"] == 0, 1e-8, 0.0
    )
    df = pd.concat([df, ts], ignore_index=True)
    metrics = ["auc", "ece", "logloss"]
    plain = S.paired_differences(df, "base", metrics=metrics)
    out = S.paired_differences(df, "base", metrics=metrics, same_ranking=["ts"])
    ts_auc = out[(out.variant == "ts") & (out.metric == "auc")]
    assert len(ts_auc) and ts_auc["by_construction"].all() and not ts_auc["primary"].any()
    assert ts_auc["p"].isna().all() and not ts_auc["significant"].any()
    # the family shrinks by exactly those rows, and Holm's multiplier with it
    assert out["primary"].sum() == plain["primary"].sum() - len(ts_auc)
    key = (out.variant == "a") & (out["shift"] == "clean") & (out.metric == "auc")
    assert out.loc[key, "p_holm"].iloc[0] <= plain.loc[key, "p_holm"].iloc[0]
    # the ECE of the same variant stays a tested, primary comparison
    assert out[(out.variant == "ts") & (out.metric == "ece")]["primary"].all()
    summary = S.summarize_report(df, baseline="base", same_ranking=["ts"])
    table = _parse_markdown_tables("\n".join(V.verdict_lines(summary, {})))[0]
    assert not any(r[0] == "ts" and r[1] == "AUC" for r in table)  # not in the family
    paths = W.write_report(summary, tmp_path, figures=False)
    report = paths.report_md.read_text()
    assert "Not in the table: the AUC of ts equals base's by construction" in report


def test_only_temperature_scaling_of_the_same_runs_keeps_the_ranking():
    cfg = load_config(None, check_names=False)
    cfg.report.variants += [
        VariantConfig(
            "ln_ts", NormSpec("layernorm"), temperature_scaling=True, from_variant="layernorm"
        ),
        VariantConfig(
            "ln_platt", NormSpec("layernorm"), platt_scaling=True, from_variant="layernorm"
        ),
        VariantConfig(
            "mc_ts", NormSpec("layernorm"), temperature_scaling=True, from_variant="mclayernorm_mc"
        ),
    ]
    by = {p.name: p for p in P.plan_variants(cfg)}
    base = by["layernorm"]
    assert by["ln_ts"].same_ranking_as(base)
    assert not by["ln_platt"].same_ranking_as(base)  # a fitted slope may be negative
    assert not by["mc_ts"].same_ranking_as(base)  # other runs, other predictions
    assert not by["mclayernorm"].same_ranking_as(base)


def test_the_decisive_protocol_is_the_design_its_page_sizes():
    """docs/shift-report.md sizes configs/protocols/decisive_cpu.yaml: its family size m, its
    seeds and the factor of the detectable difference at them are the config's and the
    calculation's own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "configs/protocols/decisive_cpu.yaml")
    plans, shifts = P.check_report(cfg)
    base = next(p for p in plans if p.name == cfg.report.baseline)
    points = 1 + sum(len(s.intensities) for s in shifts)
    per_point = sum(1 if p.same_ranking_as(base) else 2 for p in plans if p is not base)
    m, n = points * per_point, cfg.report.seeds
    assert cfg.data.synthetic.rows >= 1_000_000 and n >= 10 and cfg.train.precision == "fp32"
    page = (root / "docs/shift-report.md").read_text()
    assert f"**{m} paired tests**" in page and f"| seeds | **{n}**" in page
    assert f"α/m = 0.05 / {m} = {0.05 / m:.3g}" in page
    assert f"{S.detectable_difference(1.0, n, 0.05 / m):.3f} at n = {n}" in page


def test_a_comparison_that_cannot_vary_is_not_the_designs_best_point():
    """A variant whose per-seed differences are all equal (its AUC is the baseline's by
    construction) has detectable difference 0: it says nothing of the design."""
    results = _results(n_seeds=6, mc_gain=0.0, noise=0.0005)
    copy = results[results["variant"] == "layernorm"].assign(variant="layernorm_copy")
    summary = S.summarize_report(pd.concat([results, copy], ignore_index=True))
    prim = summary.primary
    assert (prim.loc[prim["variant"] == "layernorm_copy", "detectable"] == 0).all()
    by_metric = summary.detectable_by_metric().set_index("metric")
    assert (by_metric["smallest"] > 0).all()
    moving = prim[prim["variant"] != "layernorm_copy"]
    assert by_metric.loc["auc", "comparisons"] == (moving["metric"] == "auc").sum()
