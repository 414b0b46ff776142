"""Tasks in spawned worker processes, one device per worker: the pool a sweep trains with.

:func:`run_in_processes` starts one Python process per slot (device) with ``spawn``, never
``fork`` (torch's thread pools and CUDA state do not survive a fork), feeds each one task at a
time, sends each task's output to its own log, and turns failures into one error naming every
failed task, its device and its log. It knows nothing of training:
:mod:`ctrcal.sweep.sweep` gives it the runs.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ctrcal.core import errors
from ctrcal.core.errors import CtrcalError

__all__ = ["Task", "cpu_cores", "run_in_processes", "threads_per_worker"]

# Set by torchrun for its own ranks; a sweep's runs are independent single-process trainings.
_TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Intra-op threads of each of ``workers`` processes: the cores split evenly, at least 1."""
    return max(1, (cores if cores is not None else cpu_cores()) // max(1, workers))


class Task(Protocol):
    """What :func:`run_in_processes` needs of a task (it must pickle)."""

    @property
    def name(self) -> str: ...

    @property
    def log_path(self) -> Path: ...


@dataclass
class _Worker:
    """A spawned process bound to one slot (device); it trains one task at a time."""

    process: Any
    conn: Any
    task: Any = None  # the task it is working on (None: idle)
    start: float = 0.0


@dataclass
class _Failure:
    task: Any
    device: str
    kind: str  # the exception's class name, or "" when the process died without one
    message: str
    user_error: bool = False  # a CtrcalError: its message is meant for the user as it is


def _worker_main(fn: Callable[[Any, str, int], str], device: str, threads: int, conn) -> None:
    """Entry point of a spawned worker: run ``fn`` on each task received until ``None``.

    Each task's output (Python's and native code's, at the descriptor level) goes to its
    ``log_path``; the outcome goes back over ``conn``.
    """
    import signal

    # Ctrl-C reaches the whole process group: the parent alone handles it (and stops us)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for key in _TORCHRUN_ENV:
        os.environ.pop(key, None)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[key] = str(threads)
    while True:
        task = conn.recv()
        if task is None:
            break
        log_path = Path(task.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        with open(log_path, "a", buffering=1) as fh:
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"=== {stamp} {task.name} on {device}, {threads} thread(s), pid {os.getpid()}")
        try:
            status = fn(task, device, threads)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(("error", type(exc).__name__, isinstance(exc, CtrcalError), str(exc)))
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: stop here
                break
            continue
        print(f"=== {task.name}: {status}")
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(("ok", status))
    conn.close()


def _failure_error(failures: list[_Failure], not_started: list[Any]) -> CtrcalError:
    def one(f: _Failure) -> str:
        why = f"{f.kind}: {f.message}" if f.kind and not f.user_error else f.message
        return f"{f.task.name} on {f.device} failed: {why} (log: {f.task.log_path})"

    first = failures[0]
    text = "training run " + one(first)
    same = [f for f in failures[1:] if (f.kind, f.message) == (first.kind, first.message)]
    if same:
        text += "; the same error in " + ", ".join(f"{f.task.name} on {f.device}" for f in same)
    others = [f for f in failures[1:] if f not in same]
    if others:
        text += "; also failed: " + "; ".join(one(f) for f in others)
    if not_started:
        text += f"; not started: {', '.join(t.name for t in not_started)}"
    cls = getattr(errors, first.kind, None) if first.user_error else None
    if not (isinstance(cls, type) and issubclass(cls, CtrcalError)):
        cls = CtrcalError
    return cls(text)


def _exit_reason(code: int | None, task: Any, pid: int | None) -> str:
    try:
        began = f"pid {pid}" in Path(task.log_path).read_text()
    except OSError:
        began = False
    if not began:  # typically a script that starts a sweep without a __main__ guard
        return (
            f"its worker process exited with status {code} before starting it (traceback on "
            "stderr; Python code must start a sweep with workers under "
            "if __name__ == '__main__':)"
        )
    if code is not None and code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"its process was killed by {name}{hint}"
    return f"its process exited with status {code} without a result"


def run_in_processes(
    tasks: Sequence[Any],
    slots: Sequence[str],
    fn: Callable[[Any, str, int], str],
    *,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
    desc: str = "training",
) -> list[tuple[Any, str, str, float]]:
    """Run ``fn(task, device, threads)`` for every task in spawned worker processes.

    One worker per slot (at most as many as tasks), started once and fed one task at a time,
    so the interpreter and torch start once per worker, not once per task. ``fn`` must be a
    module-level function and the tasks must pickle. A task's output goes to its
    ``log_path``.

    Args:
        tasks: objects with ``name`` and ``log_path``.
        slots: one device per worker (``cpu``, ``cuda:1``, ...).
        fn: returns a short status string.
        threads: intra-op threads per worker (default: the cores split over the slots).
        log: where one line per started / finished task goes.
        progress: a progress bar over the tasks.
        desc: the progress bar's label.

    Returns:
        ``(task, device, status, seconds)`` per task, in order of completion.

    Raises:
        CtrcalError: (or the failed task's own :class:`CtrcalError` subclass) naming every
            failed task, its device and its log; after a failure no new task starts, and
            those already running are waited for.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from tqdm.auto import tqdm

    if not slots:
        raise ValueError("run_in_processes needs at least one slot")
    log = log or (lambda msg: None)
    if threads is None:  # from all slots, even idle ones: a run's threads follow the config
        threads = threads_per_worker(len(slots))
    slots = list(slots)[: max(1, len(tasks))]
    ctx = mp.get_context("spawn")  # never fork: torch threads and CUDA state do not survive it
    pending = deque(tasks)
    workers: dict[int, _Worker] = {}
    done: list[tuple[Any, str, str, float]] = []
    failures: list[_Failure] = []
    bar = tqdm(total=len(pending), desc=desc, unit="run", disable=not progress, file=sys.stderr)

    def postfix() -> None:
        bar.set_postfix_str(", ".join(w.task.name for w in workers.values() if w.task))

    def stop(slot: int) -> None:
        w = workers.pop(slot)
        try:
            w.conn.send(None)
        except OSError:  # already gone
            pass
        w.process.join()
        w.conn.close()

    try:
        while True:
            for slot, device in enumerate(slots):
                w = workers.get(slot)
                if w is not None and w.task is not None:
                    continue
                if not pending or failures:
                    if w is not None:
                        stop(slot)
                    continue
                if w is None:
                    here, there = ctx.Pipe()
                    proc = ctx.Process(
                        target=_worker_main,
                        args=(fn, device, threads, there),
                        name=f"ctrcal worker {slot} ({device})",
                    )
                    proc.start()
                    there.close()  # the worker holds that end now
                    w = workers[slot] = _Worker(proc, here)
                w.task, w.start = pending.popleft(), time.perf_counter()
                try:
                    w.conn.send(w.task)
                except OSError:  # the worker is gone; its sentinel tells the rest below
                    pass
                log(f"[{w.task.name}] started on {device} (log: {w.task.log_path})")
                postfix()
            busy = {slot: w for slot, w in workers.items() if w.task is not None}
            if not busy:
                break
            ready = wait(
                [w.conn for w in busy.values()] + [w.process.sentinel for w in busy.values()]
            )
            for slot, w in busy.items():
                if w.conn not in ready and w.process.sentinel not in ready:
                    continue
                try:
                    message = w.conn.recv() if w.conn.poll() else None
                except (EOFError, OSError):
                    message = None
                task, device = w.task, slots[slot]
                seconds = time.perf_counter() - w.start
                w.task = None
                if message is None:  # the process died in the middle of the task
                    w.process.join()
                    w.conn.close()
                    del workers[slot]
                    reason = _exit_reason(w.process.exitcode, task, w.process.pid)
                    failures.append(_Failure(task, device, "", reason))
                elif message[0] == "ok":
                    done.append((task, device, message[1], seconds))
                    log(f"[{task.name}] {message[1]} on {device} in {seconds:.1f} s")
                else:
                    _, kind, user_error, text = message
                    failures.append(_Failure(task, device, kind, text, user_error))
                if failures and failures[-1].task is task:
                    still = sum(1 for x in workers.values() if x.task is not None)
                    log(
                        f"[{task.name}] FAILED on {device}: {failures[-1].message} "
                        f"(log: {task.log_path})"
                        + (f"; waiting for {still} running run(s)" if still else "")
                    )
                bar.update(1)
                postfix()
    except BaseException:
        for w in workers.values():  # interrupted: do not leave orphans training on
            w.process.terminate()
        for w in workers.values():
            w.process.join(timeout=10)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        workers.clear()
        raise
    finally:
        for slot in list(workers):
            stop(slot)
        bar.close()
    if failures:
        raise _failure_error(failures, list(pending))
    return done
