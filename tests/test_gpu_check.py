"""scripts/gpu_check.py on a machine without a CUDA GPU: says so and exits 0."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def test_gpu_check_without_gpu_exits_zero(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main = runpy.run_path(str(SCRIPT))["main"]
    assert main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_gpu_check_rejects_unknown_options():
    main = runpy.run_path(str(SCRIPT))["main"]
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-option"])
    assert exc.value.code == 2


def test_gpu_check_command_lines_pass_validate(tmp_path):
    """The configs and overrides the GPU run uses must stay valid as configs evolve: a stale
    override only fails on the GPU machine otherwise."""
    from ctrcal.cli import main as ctrcal_main

    mod = runpy.run_path(str(SCRIPT))
    e2e = mod["EndToEnd"](tmp_path, 1000)
    for extra in ([], e2e.mc, [mod["SHIFT_REPORT_GRID"]]):
        demo = str(SCRIPT.parents[1] / "configs" / "demo.yaml")
        assert ctrcal_main(["validate", demo, *e2e.base, *extra]) == 0, extra
