"""The one tiny shift report of the test run: its config, shared by ``conftest.shift_report``
(trained once per session) and the tests that run a variation of it.

Every variant kind is in it: plain runs (layernorm, MC-LayerNorm on the blocks and on the
fields), MC passes, an ensemble, MC-Dropout, calibrators (temperature, Platt, isotonic,
field-aware), the Gaussian and categorical shifts, the temporal shift (the same inputs
prepared again in time order, every run trained again), field metrics, row-bootstrap
intervals and risk-coverage. It draws no figures (a third of its time): the rerun of
``test_report_run`` draws them on the session's runs and checks them. Tests that change a
knob of the report itself (``mix_fraction``, time windows) run ``ctrcal shift-report`` again
on copies of its runs, which it reuses.

Imported by tests as ``from shift_report import ...`` (``tests/`` is on ``sys.path`` through
its ``conftest.py``).
"""

from __future__ import annotations

CONFIG = """
data:
  synthetic: {rows: 4000, seed: 0, drift: 2.0}
  split: [0.6, 0.1, 0.3]
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
  num_threads: 1
report:
  seeds: 2
  bootstrap: 20
  figures: false
  field_min_count: 20
  field_numeric_buckets: 4
  shifts:
    - {name: gaussian_numeric, intensities: [0.125, 0.5]}
    - {name: categorical_corruption, intensities: [0.2, 0.6]}
    - {name: temporal}
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}
    - {name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}
    - {name: mclayernorm_ts, temperature_scaling: true, from_variant: mclayernorm}
    - {name: ensemble, ensemble: 2, from_variant: layernorm}
    - {name: mc_dropout, mc_samples: 3, mc_dropout: true, from_variant: layernorm}
    - name: mcln_fields
      net_norm: layernorm
      emb_norm: {name: mclayernorm, fraction: 0.8}
    - {name: mcln_fields_mc, mc_samples: 3, from_variant: mcln_fields}
    - {name: platt, calibration: platt, from_variant: layernorm}
    - {name: isotonic, isotonic_calibration: true, from_variant: layernorm}
    - name: per_c1
      field_calibration: C1
      field_calibration_method: platt
      field_calibration_shrinkage: 50
      from_variant: layernorm
"""
VARIANTS = [
    "layernorm",
    "mclayernorm",
    "mclayernorm_mc",
    "mclayernorm_ts",
    "ensemble",
    "mc_dropout",
    "mcln_fields",
    "mcln_fields_mc",
    "platt",
    "isotonic",
    "per_c1",
]
TRAINED = ["layernorm", "mclayernorm", "mcln_fields"]  # the others reuse these runs
SEEDS = 2
# clean + gaussian x 2 + categorical x 2 + temporal
POINTS = 1 + 2 + 2 + 1
TEMPORAL_LINE = "    - {name: temporal}\n"


def without_temporal(text: str = CONFIG) -> str:
    """The config without its temporal shift: a rerun on copied runs then trains nothing."""
    assert TEMPORAL_LINE in text
    return text.replace(TEMPORAL_LINE, "")
