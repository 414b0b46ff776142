"""bench_fuxictr's command line: missing FuxiCTR pieces are one clear line, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_fuxictr.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_required_arguments(tmp_path):
    res = _run()
    assert res.returncode == 2 and "--fuxictr-python" in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_python_and_model_zoo(tmp_path):
    res = _run("--fuxictr-python", str(tmp_path / "nope"), "--model-zoo", str(tmp_path))
    assert res.returncode == 2 and "not an executable file" in res.stderr
    res = _run("--fuxictr-python", sys.executable, "--model-zoo", str(tmp_path / "missing"))
    assert res.returncode == 2 and "missing: not a directory" in res.stderr


def test_python_without_fuxictr(tmp_path):
    # this interpreter has torch but not fuxictr
    res = _run("--fuxictr-python", sys.executable, "--model-zoo", str(tmp_path))
    assert res.returncode == 2 and "cannot import fuxictr" in res.stderr
    assert "Traceback" not in res.stderr


def test_model_zoo_without_the_model_sources(tmp_path):
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    # an interpreter that "has" fuxictr: a shell script answering the import probe
    fake.write_text("#!/bin/sh\necho 2.3.10\n")
    fake.chmod(0o755)
    res = _run("--fuxictr-python", str(fake), "--model-zoo", str(tmp_path))
    assert res.returncode == 2 and "MaskNet/src" in res.stderr
