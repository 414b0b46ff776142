"""Parallel sweeps: a shift report's training runs spread over devices or CPU processes.

Also home of the rules by which a sweep reuses, resumes or retrains a run directory
(:func:`ensure_run`), sequential or parallel.

``report.workers`` / ``report.devices`` (``ctrcal shift-report --workers N --devices ...``)
decide how many runs train at once and where:

* ``devices``: a list (``[cuda:0, cuda:1]``; on the command line ``cuda:0,cuda:1``) or
  ``auto`` = every visible GPU, or the CPU when there is none. Unset: the training device
  (``train.device``), or every visible GPU when that is ``auto`` and ``workers`` > 1.
* ``workers``: processes training at once; 0 (default) = one per listed device, 1 without
  devices. More workers than devices share them round-robin (several small runs per GPU).

Each worker is a Python process started with ``spawn``, never ``fork`` (torch's thread pools
and CUDA state do not survive a fork), bound to one device: it trains the pending runs (those
not already finished with the same config and data) one at a time, with ``train.device`` set to
its device (and ``torch.cuda.set_device``) and ``torch.set_num_threads(max(1, cores //
workers))`` unless ``train.num_threads`` says otherwise. A run's output goes to
``runs/<variant>/seed<k>.log`` instead of the terminal. The first failure stops new runs from
starting; the runs already training finish (their work is kept and reused next time), then one
error names every run that failed, its device and its log (the traceback is in the log). The
runs are the same as a sequential sweep's: training is seeded per run, and on CPU a run's
numbers do not depend on the process it runs in, only on its thread count. With the same
``train.num_threads`` they are bit-identical. Without it a sequential sweep trains with all
cores and a worker with ``cores // workers`` threads; the order of multi-threaded float32 sums
then differs and training amplifies it (about 1e-9 in the metrics of a one-epoch tiny run,
up to 6e-4 in AUC after two epochs of the demo config): the same as moving a sequential sweep
to a machine with another core count. Set ``train.num_threads`` for runs that reproduce
across both. On GPUs bit-reproducibility is not promised even between two sequential runs
(CUDA kernels with atomic adds), in parallel or not.

Python code that calls :func:`~ctrcal.eval.report.run_shift_report` with workers must, like
any ``spawn``-based program, do so under ``if __name__ == "__main__":`` (each worker imports
the main module).

With a single worker, runs train one after another in the calling process.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ctrcal import errors
from ctrcal.checks import check_workers
from ctrcal.checks import device_list as _device_list
from ctrcal.config import Config
from ctrcal.errors import ConfigError, CtrcalError
from ctrcal.runs import run_state

__all__ = [
    "TrainJob",
    "cpu_cores",
    "ensure_run",
    "run_in_processes",
    "run_state",
    "threads_per_worker",
    "train_in_processes",
    "training_threads",
    "visible_gpus",
    "worker_slots",
]

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


# ---------------------------------------------------------------------------------------------
# Runs: reuse, resume or train


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_run(
    cfg: Config, data_dir: Path, run_dir: Path, log: Callable[[str], None] = _log
) -> str:
    """Train ``cfg`` into ``run_dir`` unless a run with the same config and data is there.

    A finished run is reused, an interrupted one resumed; a run with a different config or
    trained on different data is deleted and trained again (``run_dir`` belongs to the
    report).

    Returns:
        ``"reused"``, ``"resumed"`` or ``"trained"``.
    """
    from ctrcal.train.trainer import train

    state = run_state(cfg, data_dir, run_dir)
    if state == "finished":
        return "reused"
    if state == "started":
        train(cfg, data_dir, run_dir, resume=True)
        return "resumed"
    if run_dir.exists():
        if state == "stale":
            log(f"{run_dir}: trained with another config or data; training it again")
        shutil.rmtree(run_dir)
    train(cfg, data_dir, run_dir)
    return "trained"


# ---------------------------------------------------------------------------------------------
# Devices


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Intra-op threads of each of ``workers`` processes: the cores split evenly, at least 1."""
    return max(1, (cores if cores is not None else cpu_cores()) // max(1, workers))


def training_threads(cfg: Config, slots: Sequence[str]) -> int:
    """Intra-op threads each run of a sweep trains with (``train.num_threads`` wins)."""
    if cfg.train.num_threads > 0:
        return cfg.train.num_threads
    if len(slots) > 1:
        return threads_per_worker(len(slots))
    import torch

    return torch.get_num_threads()


def visible_gpus() -> list[str]:
    """``cuda:i`` for every GPU this process can see (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def worker_slots(cfg: Config, source: str = "config") -> list[str]:
    """The device of each worker: ``len(result)`` runs train at once.

    Raises:
        ConfigError: a device torch cannot parse or a GPU that is not visible, naming
            ``report.devices``.
    """
    import torch

    check_workers(cfg, source)
    r = cfg.report
    devices = _device_list(r.devices)
    explicit = bool(devices)
    if devices == ["auto"]:
        devices = visible_gpus() or ["cpu"]
    elif not devices:
        if cfg.train.device == "auto" and r.workers > 1:
            devices = visible_gpus() or ["cpu"]
        else:  # one worker: it trains here, on train.device as it is
            devices = [cfg.train.device]
    gpu_count = None
    for d in devices:
        if d == "auto":  # train.device: auto with one worker
            continue
        try:
            dev = torch.device(d)
        except (RuntimeError, ValueError):
            raise ConfigError(
                f"{source}: report.devices: {d!r} is not a device (e.g. cpu, cuda:0)"
            ) from None
        if dev.type == "cuda":
            if gpu_count is None:
                gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (dev.index or 0) >= gpu_count:
                raise ConfigError(
                    f"{source}: report.devices: {d!r} is not visible here ({gpu_count} GPU(s))"
                )
    n = r.workers or (len(devices) if explicit else 1)
    return [devices[i % len(devices)] for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Running tasks in spawned processes


class Task(Protocol):
    """What :func:`run_in_processes` needs of a task (it must pickle)."""

    @property
    def name(self) -> str: ...

    @property
    def log_path(self) -> Path: ...


@dataclass(frozen=True)
class TrainJob:
    """One training run of a sweep: a variant's config for one seed index."""

    variant: str
    k: int
    cfg: Config
    data_dir: Path
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.variant} seed {self.k}"

    @property
    def log_path(self) -> Path:
        return self.run_dir.with_name(self.run_dir.name + ".log")


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


def _train_job(job: TrainJob, device: str, threads: int) -> str:
    """Worker body: pin the device and threads, then train (or resume) one run."""
    import torch

    from ctrcal.train.results import read_result

    if job.cfg.train.num_threads <= 0:
        torch.set_num_threads(threads)
    else:
        print(f"train.num_threads = {job.cfg.train.num_threads}")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    # device and progress are runtime keys: the run's identity (and its reuse) ignores them
    cfg = dataclasses.replace(
        job.cfg, train=dataclasses.replace(job.cfg.train, device=device, progress=False)
    )
    status = ensure_run(cfg, job.data_dir, job.run_dir, log=print)
    print(read_result(job.run_dir).describe())
    return status


def train_in_processes(
    jobs: Sequence[TrainJob],
    slots: Sequence[str],
    *,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> dict[str, int]:
    """Train ``jobs`` in spawned processes over ``slots``; counts of outcomes by kind."""
    outcomes: dict[str, int] = {}
    done = run_in_processes(
        jobs, slots, _train_job, threads=threads_per_worker(len(slots)), log=log, progress=progress
    )
    for _, _, status, _ in done:
        outcomes[status] = outcomes.get(status, 0) + 1
    return outcomes
