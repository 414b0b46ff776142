"""Noise-injection variants in a tiny shift report: trained with their noise, compared like
every other variant, and without effect on the other variants' numbers."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

pytest.importorskip("ctrcal.train.trainer")

from ctrcal.cli import main  # noqa: E402

# one worker runs the module (--dist loadgroup), so the two reports are trained once
pytestmark = pytest.mark.xdist_group("noise_report")

HEAD = """
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
  num_threads: 1
report:
  seeds: 2
  figures: false
  shifts:
    - {name: gaussian_numeric, intensities: [0.5]}
  variants:
    - {name: layernorm, net_norm: layernorm}
"""
NOISE = """\
    - name: input_noise
      net_norm: layernorm
      train_shift: {name: gaussian_numeric, intensity: 0.25}
    - name: corrupted
      net_norm: layernorm
      train_shift: {name: categorical_corruption, intensity: 0.2}
    - {name: weight_noise, net_norm: layernorm, weight_noise: 1.0e-3}
"""
KEY = ["variant", "shift", "seed", "noise_seed", "intensity", "metric"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise_report")
    outs = {}
    for name, text in (("with_noise", HEAD + NOISE), ("plain", HEAD)):
        cfg = root / f"{name}.yaml"
        cfg.write_text(text)
        outs[name] = root / name
        assert main(["run", str(cfg), "--out", str(outs[name])]) == 0
    return outs


@pytest.mark.slow
def test_noise_variants_train_with_their_noise(reports):
    runs = reports["with_noise"] / "runs"
    for k in range(2):
        train = {
            v: yaml.safe_load((runs / v / f"seed{k}" / "config.yaml").read_text())["train"]
            for v in ("layernorm", "input_noise", "corrupted", "weight_noise")
        }
        assert train["layernorm"]["train_shift"] is None
        assert train["layernorm"]["weight_noise"] == 0.0
        assert train["input_noise"]["train_shift"] == {
            "name": "gaussian_numeric",
            "intensity": 0.25,
            "space": None,
        }
        assert train["corrupted"]["train_shift"]["name"] == "categorical_corruption"
        assert train["weight_noise"]["weight_noise"] == 1e-3
        assert {t["seed"] for t in train.values()} == {k}


@pytest.mark.slow
def test_noise_variants_are_compared_like_any_other(reports):
    out = reports["with_noise"]
    df = pd.read_csv(out / "results.csv")
    points = {("clean", 0.0), ("gaussian_numeric", 0.5)}
    for v in ("input_noise", "corrupted", "weight_noise"):
        sub = df[(df.variant == v) & (df.metric == "auc")]
        assert set(zip(sub["shift"], sub.intensity, strict=True)) == points, v
        assert set(sub.seed) == {0, 1}
        assert sub["value"].between(0.5, 1.0).all(), v
    # trained differently: not the baseline's numbers
    auc = df[df.metric == "auc"].set_index(KEY)["value"]
    ln = auc.xs("layernorm", level="variant")
    for v in ("input_noise", "corrupted", "weight_noise"):
        assert not ln.equals(auc.xs(v, level="variant")), v
    text = (out / "report.md").read_text()
    assert "trained with input noise gaussian_numeric 0.25 std in original space" in text
    assert "trained with input noise categorical_corruption probability 0.2;" in text
    assert "trained with weight noise N(0, 0.001)" in text
    comparisons = [line for line in text.splitlines() if line.startswith("| weight_noise")]
    assert comparisons  # a row of the comparison with the baseline


@pytest.mark.slow
def test_adding_noise_variants_leaves_the_other_variants_numbers_unchanged(reports):
    with_noise = pd.read_csv(reports["with_noise"] / "results.csv")
    plain = pd.read_csv(reports["plain"] / "results.csv")
    a = with_noise[with_noise.variant == "layernorm"].set_index(KEY)["value"].sort_index()
    b = plain[plain.variant == "layernorm"].set_index(KEY)["value"].sort_index()
    pd.testing.assert_series_equal(a, b, check_exact=True)


def test_the_documented_example_is_a_valid_config(tmp_path):
    import re
    from pathlib import Path

    from ctrcal.validate import load_config

    root = Path(__file__).resolve().parents[3]
    page = (root / "docs/shift-report.md").read_text()
    section = page.split("### Noise-injection training", 1)[1]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    base = root / "configs/protocols/paper.yaml"
    path = tmp_path / "noise.yaml"
    path.write_text(example.replace("extends: paper.yaml", f"extends: {base}"))
    cfg = load_config(path)
    by_name = {v.name: v for v in cfg.report.variants}
    assert by_name["input_noise"].train_shift.intensity == 0.25
    assert by_name["weight_noise"].weight_noise == 1e-4
