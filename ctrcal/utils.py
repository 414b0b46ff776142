"""Small shared helpers: atomic writes, closest-name suggestions, seeding, devices."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import random
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``name`` (for "did you mean ...?"), or None."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; rename it onto ``path`` only on success.

    Works for files and directories alike: whatever the body writes at the yielded path
    replaces ``path`` in one rename, so a crash never leaves a half-written target that a
    later run could trust.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.rmdir(tmp)  # the caller decides whether it becomes a file or a directory
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            _rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            _rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def remove_stale_temporaries(
    directory: str | os.PathLike, targets: Iterable[str] = ("*",)
) -> list[Path]:
    """Delete the temporaries :func:`atomic_path` left in ``directory`` when a kill stopped
    their writer; return what was removed.

    Only for files that one process writes at a time (a run directory being resumed, a
    report's own outputs): another writer's temporary in flight would be removed too.

    Args:
        directory: where the targets live.
        targets: glob patterns of the target names whose temporaries go (default: all).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = sorted({p for t in targets for p in directory.glob(f".{t}.*.tmp")})
    for tmp in stale:
        _rmtree(tmp) if tmp.is_dir() and not tmp.is_symlink() else tmp.unlink(missing_ok=True)
    return stale


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 - legacy global RNG some code still uses
    torch.manual_seed(seed)


def resolve_device(spec: str = "auto"):
    """``auto`` -> CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (for benchmarks).

    Reads ``VmHWM`` from ``/proc/self/status``: unlike ``ru_maxrss`` it is reset by exec, so a
    child process started from a big parent reports only its own peak.
    """
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model_name() -> str:
    """The CPU's ``lscpu`` model name, with family and model numbers (for benchmark output).

    Names like ``AMD EPYC`` say little (a Zen 4 and a Zen 5 part differ twofold in some of
    our figures); ``family 25, model 17`` pins the generation down.
    """
    import subprocess

    name = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as info:
            fields = {}
            for line in info:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        if "cpu family" in fields:
            name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    except OSError:
        pass
    return name
