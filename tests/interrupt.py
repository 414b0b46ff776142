"""What the interruption tests share: run a command in a child process, SIGKILL it (and
every process it started) at a chosen moment, interrupt an in-process run at a chosen
training step, and compare what the runs left behind.

Imported by tests as ``from interrupt import ...`` (``tests/`` is on ``sys.path`` through its
``conftest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from forked_cli import ForkedCommand, run_forked

REPO = Path(__file__).resolve().parents[1]
# a training run small enough to interrupt and resume within a test
TINY_TRAINING = [
    "model.embedding_dim=4",
    "model.hidden_units=[16]",
    "train.batch_size=2048",
    "train.eval_batch_size=8192",
    "train.progress=false",
    "train.num_threads=1",
]
TIMING = ("rows_per_s", "seconds")  # per-epoch keys that measure speed, not what was learnt


def child_env(*extra_paths: Path | str, **variables: str) -> dict[str, str]:
    """The environment of a child: this checkout's ctrcal first on the path, one thread."""
    path = os.pathsep.join([str(REPO), *map(str, extra_paths)])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **variables}


def ctrcal_argv(*args: str) -> list[str]:
    """``python -m ctrcal ARGS`` with this interpreter."""
    return [sys.executable, "-m", "ctrcal", *args]


def _ctrcal_args(argv: Sequence[str]) -> list[str] | None:
    """The command's arguments where ``argv`` is :func:`ctrcal_argv`'s, else None."""
    argv = list(argv)
    return argv[3:] if argv[:3] == [sys.executable, "-m", "ctrcal"] else None


def start(
    argv: Sequence[str], env: dict[str, str] | None = None, **kwargs
) -> subprocess.Popen | ForkedCommand:
    """Start ``argv`` quietly (unless ``kwargs`` say otherwise). A ``ctrcal`` command in the
    default environment is forked from the preloaded server (see :mod:`forked_cli`)."""
    args = _ctrcal_args(argv)
    if args is not None and env is None and not kwargs:
        return ForkedCommand(args, child_env())
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    kwargs.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen(list(argv), env=env or child_env(), **kwargs)


def run(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run ``argv`` to its end; fail the test with its stderr unless it exits 0. A ``ctrcal``
    command in the default environment is forked from the preloaded server."""
    args = _ctrcal_args(argv)
    if args is not None and env is None:
        code, _, err = run_forked(args, child_env(), timeout)
        assert code == 0, err[-4000:]
        return err
    done = subprocess.run(
        list(argv), env=env or child_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), read from /proc."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_9(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process it started (e.g. torchrun's workers), then reap it.

    The tree is frozen first (SIGSTOP until no new process shows up), so no child started in
    the meantime escapes the kill.
    """
    frozen: list[int] = []
    todo = [proc.pid]
    while todo:
        for pid in todo:
            _signal(pid, signal.SIGSTOP)
        frozen += todo
        todo = [pid for pid in descendants(proc.pid) if pid not in frozen]
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    proc.wait()


def _running(proc) -> bool:
    return proc.is_alive() if hasattr(proc, "is_alive") else proc.poll() is None


def wait_for(path: Path | None, proc, timeout: float = 300) -> bool:
    """Wait until ``path`` exists (True), or ``proc`` (a ``subprocess.Popen`` or a
    ``multiprocessing.Process``) has ended or time is up (False)."""
    deadline = time.monotonic() + timeout
    while path is not None and not path.exists():
        if not _running(proc) or time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def kill_9_when(proc: subprocess.Popen, path: Path | None, delay: float = 0.0) -> bool:
    """SIGKILL ``proc`` (and its children) ``delay`` seconds after ``path`` appears (``None``:
    after ``delay``); return whether it was still running then."""
    wait_for(path, proc)
    time.sleep(delay)
    alive = proc.poll() is None
    kill_9(proc)
    return alive


def snapshot(directory: Path, skip: Sequence[str] = ()) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``directory`` (names in ``skip`` left out)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def history(run: Path) -> list[dict]:
    """The run's per-epoch records without the speed figures."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def assert_same_training(a: Path, b: Path) -> None:
    """Two run directories hold the same outcome, history and best weights, bit for bit."""
    from ctrcal.train.checkpoint import load_checkpoint

    ra, rb = (json.loads((r / "result.json").read_text()) for r in (a, b))
    for key in ("best_epoch", "epochs_completed", "stopped_early", "valid", "test"):
        assert ra[key] == rb[key], key
    assert history(a) == history(b)
    wa = load_checkpoint(a / "checkpoints" / "best.pt")["model"]
    wb = load_checkpoint(b / "checkpoints" / "best.pt")["model"]
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def interrupt_training_at_step(monkeypatch, step: int, run) -> None:
    """Run ``run()`` (a training call) with its ``step``-th training step raising
    KeyboardInterrupt, as Ctrl-C would; the real step is restored afterwards."""
    import pytest

    from ctrcal.train import trainer

    real_step, calls = trainer.train_step, []

    def crashing_step(ctx, batch):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return real_step(ctx, batch)

    monkeypatch.setattr(trainer, "train_step", crashing_step)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(trainer, "train_step", real_step)


def tiny_config(*overrides: str):
    """The :data:`TINY_TRAINING` config with ``overrides`` (``section.key=value``)."""
    from ctrcal.validate import load_config

    return load_config(None, [*TINY_TRAINING, *overrides])
