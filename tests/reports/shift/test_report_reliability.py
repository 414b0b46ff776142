"""kill -9 at any moment of ``ctrcal shift-report``, then the same command again, gives the
uninterrupted report: the same results, the same runs, nothing half-written left behind."""

from __future__ import annotations

import json
import re

import pytest
from interrupt import assert_same_training, ctrcal_argv, kill_9_when, run, snapshot, start

from ctrcal.data.identity import data_identity

pytestmark = pytest.mark.slow  # child processes killed and run again

CONFIG = """
data: {synthetic: {rows: 2000, seed: 3}}
features: {min_count: 2}
model: {embedding_dim: 4, hidden_units: [16], dropout: 0.1}
train: {epochs: 2, batch_size: 256, eval_batch_size: 1024, num_threads: 1, progress: false}
report:
  seeds: 1
  figures: false
  shifts:
    - {name: gaussian_numeric, intensities: [0.25, 0.5]}
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}
    - {name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}
"""
RUNS = ["runs/layernorm/seed0", "runs/mclayernorm/seed0"]
# what says when or how long something ran, or whether runs were trained or reused
VOLATILE = {"created", "elapsed", "timing_s", "training", "runs_dir", "data_dir"}


TEMPORARY = re.compile(r"(^|/)\.[^/]*\.tmp(/|$)")  # an atomic write's hidden sibling


def _files(directory):
    return sorted(k for k in snapshot(directory) if not TEMPORARY.search(k))


def _untimed_summary(out):
    summary = json.loads((out / "summary.json").read_text())
    assert VOLATILE <= set(summary)
    return {k: v for k, v in summary.items() if k not in VOLATILE}


def test_kill_9_at_any_moment_then_again_gives_the_uninterrupted_report(tmp_path):
    cfg = tmp_path / "report.yaml"
    cfg.write_text(CONFIG)
    command = ctrcal_argv("shift-report", str(cfg), "--out", str(tmp_path / "{}"))

    def argv(name):
        return [a.replace("{}", name) for a in command]

    run(argv("full"))
    full, out = tmp_path / "full", tmp_path / "cut"
    # one kill in each phase, each leaving its state to the next command: right after the
    # data is prepared, inside the first and the second training run, writing the report
    moments = [
        ("data", 0.0),
        (f"{RUNS[0]}/checkpoints/last.pt", 0.0),
        (f"{RUNS[1]}/checkpoints/best.pt", 0.0),
        ("results.csv", 0.0),
    ]
    killed = 0
    for marker, delay in moments:
        proc = start(argv("cut"))
        killed += kill_9_when(proc, None if marker is None else out / marker, delay)
    assert killed >= 3  # the kills landed while the command was still working
    run(argv("cut"))
    assert (out / "results.csv").read_bytes() == (full / "results.csv").read_bytes()
    assert _untimed_summary(out) == _untimed_summary(full)
    for r in RUNS:
        assert_same_training(full / r, out / r)
    # the same files, nothing half-written among them, and no temporary a kill left: the
    # report removes its own outputs' when it starts again, a resumed run its own
    assert _files(out) == _files(full)
    assert not [k for k in snapshot(out) if TEMPORARY.search(k)]
    # the same prepared data, byte for byte
    assert data_identity(out / "data") == data_identity(full / "data")
    data = snapshot(out / "data")
    assert data and data == snapshot(full / "data")
