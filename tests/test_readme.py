"""The README's self-contained example of ``import ctrcal`` runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], flags=re.S)
    if match is None:
        pytest.fail(f"README: no python block after {heading!r}")
    return match.group(1)


def test_the_import_ctrcal_example_runs():
    code = _python_block_after("**3. `import ctrcal` from your own CTR model**")
    namespace: dict = {}
    exec(compile(code, "README.md example", "exec"), namespace)  # noqa: S102 - our own docs
    mean_p, std_p = namespace["mean_p"], namespace["std_p"]
    assert mean_p.shape == std_p.shape == (512,)
    assert float(std_p.max()) > 0.0  # the swapped MC-LayerNorm samples: passes differ
    assert ((mean_p > 0) & (mean_p < 1)).all()
