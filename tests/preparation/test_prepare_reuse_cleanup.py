"""Reusing a prepared directory removes what a killed run left next to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ctrcal.api import prepare
from ctrcal.preparation.publish import OWNER_FILE, owned_temp_dir
from ctrcal.validate import load_config


@pytest.mark.slow
def test_reuse_removes_a_dead_runs_temporaries_and_keeps_a_live_ones(tmp_path):
    cfg = load_config(
        None, ["data.synthetic.rows=300", "data.synthetic.seed=0", "features.min_count=1"]
    )
    out = tmp_path / "data"
    prepare(None, out, cfg)
    # a run killed after publishing, before removing its synthetic source's temporary
    dead = owned_temp_dir(out, "synthetic")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    owner = json.loads((dead / OWNER_FILE).read_text())
    (dead / OWNER_FILE).write_text(json.dumps({**owner, "pid": int(gone.stdout), "start": 1}))
    alive = owned_temp_dir(out, "synthetic")  # this process: a concurrent run at work
    result = prepare(None, out, cfg)
    assert result.reused
    assert not dead.exists()
    assert alive.exists()
