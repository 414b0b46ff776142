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
