"""A directory the whole test run shares: every pytest-xdist worker sees the same one, so what
is made in it is made once per run, by whichever worker needs it first.

Imported by tests as ``from run_shared import run_shared_dir`` (``tests/`` is on
``sys.path`` through its ``conftest.py``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def run_shared_dir(factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """This test run's directory ``name``, held under an exclusive lock for the ``with`` body:
    the first worker makes what is missing in it while the others wait, then they read it.

    The workers' base temporary directories sit side by side in one directory of the run;
    without pytest-xdist it is the base temporary directory itself."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root
