"""``python -m ctrcal ARGS`` in a child process, without paying the start-up each time.

A child that starts Python anew imports torch, ctrcal and the report stack (2-3 s of CPU)
before its command does anything, and the kill-and-resume tests start dozens of them. Where
the start-up is not what a test is about, the command runs instead in a process forked from a
server that imported all of that once per test process (``multiprocessing``'s forkserver,
which forks from a clean single-threaded process, never from pytest itself). The child is a
process of its own as before: it can be SIGKILLed with everything it started, it writes its
own stdout and stderr, and its exit status is the command's. What the server cannot give a
fresh process is an environment read at import time, so a caller that asks for one of its
own (``env=``) gets a fresh process: see :func:`interrupt.start`.

Imported by tests as ``from forked_cli import ...`` (``tests/`` is on ``sys.path`` through its
``conftest.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

# what a command imports before it works: the command line, torch, training, the report
# stack, preparation; imported once by the server, inherited by every child it forks
PRELOAD = [
    "forked_cli",
    "ctrcal.cli",
    "ctrcal.train.trainer",
    "ctrcal.reports.shift.report",
    "ctrcal.reports.shift.render",
    "ctrcal.preparation.prepare",
]

_server: list[multiprocessing.context.ForkServerContext] = []


def preloaded_context() -> multiprocessing.context.ForkServerContext:
    """The ``multiprocessing`` context whose processes fork from the preloaded server (for
    tests that start training processes of their own, such as DDP ranks)."""
    if not _server:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _server.append(context)
    return _server[0]


def free_port() -> int:
    """A local TCP port that is free now (bound, then released): the rendezvous of the ranks
    such tests start, or an address where nobody listens."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(
    main: Callable[[list[str]], int] | None,
    args: list[str],
    env: dict[str, str],
    stdout: str,
    stderr: str,
) -> None:
    """The child: the environment and the output files of a fresh process, then
    ``main(args)`` (the command line's by default), whose return value is the exit status."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    import torch

    # what OMP_NUM_THREADS gives a fresh process (the server read its own at import)
    torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1)))
    if main is None:
        from ctrcal.cli import main

    sys.argv = ["ctrcal", *args]
    sys.exit(main(args))


class ForkedCommand:
    """A running ``ctrcal`` command, with the part of :class:`subprocess.Popen` the tests use
    (``pid``, ``poll``, ``wait``, ``returncode``) and its captured output once it ended.

    ``main``: what runs instead of the command line, a module-level function of the
    arguments that returns the exit status (a test's own child program).
    """

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str],
        main: Callable[[list[str]], int] | None = None,
    ):
        self._dir = tempfile.mkdtemp(prefix="forked-cli-")
        self._out = os.path.join(self._dir, "stdout")
        self._err = os.path.join(self._dir, "stderr")
        self._process = preloaded_context().Process(
            target=_command, args=(main, list(args), dict(env), self._out, self._err)
        )
        self._process.start()
        self.pid = self._process.pid
        weakref.finalize(self, shutil.rmtree, self._dir, True)  # also after a kill

    @property
    def returncode(self) -> int | None:
        """None while running; killed by signal N: -N, as Popen says it."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise TimeoutError(f"ctrcal still running after {timeout} s")
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) of the ended command."""
        out, err = (Path(p).read_text(errors="replace") for p in (self._out, self._err))
        return out, err


def run_forked(
    args: Sequence[str], env: dict[str, str], timeout: float = 300
) -> tuple[int, str, str]:
    """Run a ``ctrcal`` command to its end: (exit status, stdout, stderr)."""
    command = ForkedCommand(args, env)
    code = command.wait(timeout)
    return (code, *command.output())
