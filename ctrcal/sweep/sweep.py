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

Python code that calls :func:`~ctrcal.reports.shift.report.run_shift_report` with workers must, like
any ``spawn``-based program, do so under ``if __name__ == "__main__":`` (each worker imports
the main module).

With a single worker, runs train one after another in the calling process. The process pool
itself (spawning, logs, failures) is :mod:`ctrcal.sweep.processes`.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrcal.config import Config
from ctrcal.core.constraints import check_parameters
from ctrcal.core.errors import ConfigError
from ctrcal.sweep.processes import run_in_processes, threads_per_worker
from ctrcal.train.runs import run_state

__all__ = [
    "TrainJob",
    "check_workers",
    "device_list",
    "ensure_run",
    "train_in_processes",
    "train_jobs",
    "training_threads",
    "visible_gpus",
    "worker_slots",
]

# ---------------------------------------------------------------------------------------------
# Runs: reuse, resume or train


def device_list(value: Any) -> list[str]:
    """``report.devices`` as a list: ``[cuda:0, cuda:1]`` or ``"cuda:0,cuda:1"``."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(d).strip() for d in items if str(d).strip()]


def check_workers(cfg: Config) -> None:
    """Check ``report.workers`` / ``report.devices`` (which devices exist is asked at run
    time, by the sweep).

    Raises:
        ConfigError: naming the key and what was expected.
    """
    r = cfg.report
    bound = {"workers": r._parameter_constraints["workers"]}  # stated beside ReportConfig
    check_parameters(r, bound, ConfigError, "report", cfg.where)
    devices = device_list(r.devices)
    if "auto" in devices and len(devices) > 1:
        raise ConfigError(
            f"{cfg.where('report.devices')}: 'auto' stands alone (every visible GPU), got {devices}"
        )


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


def worker_slots(cfg: Config) -> list[str]:
    """The device of each worker: ``len(result)`` runs train at once.

    Raises:
        ConfigError: a device torch cannot parse or a GPU that is not visible, naming
            ``report.devices``.
    """
    import torch

    check_workers(cfg)
    r = cfg.report
    devices = device_list(r.devices)
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
                f"{cfg.where('report.devices')}: {d!r} is not a device (e.g. cpu, cuda:0)"
            ) from None
        if dev.type == "cuda":
            if gpu_count is None:
                gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (dev.index or 0) >= gpu_count:
                raise ConfigError(
                    f"{cfg.where('report.devices')}: {d!r} is not visible here ({gpu_count} GPU(s))"
                )
    n = r.workers or (len(devices) if explicit else 1)
    return [devices[i % len(devices)] for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Training the runs of a sweep


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


def train_jobs(
    jobs: Sequence[TrainJob],
    log: Callable[[str], None] = _log,
    *,
    slots: list[str] | None = None,
    progress: bool = False,
) -> dict[str, int]:
    """Train (or reuse / resume) every job; returns counts by outcome.

    Args:
        jobs: the runs, in the order a sequential sweep trains them.
        log: where progress lines go.
        slots: one device per worker (:func:`worker_slots`); with two or more, the pending
            runs train in parallel processes (seed-major: a sweep stopped half-way leaves
            complete, paired seeds behind), else one after another here (on ``slots[0]``
            when given, else ``train.device``).
        progress: a progress bar over the runs trained in parallel.
    """
    outcomes: dict[str, int] = {}
    if slots is not None and len(slots) > 1:
        pending = []
        for job in sorted(jobs, key=lambda j: j.k):
            state = run_state(job.cfg, job.data_dir, job.run_dir)
            if state == "finished":
                outcomes["reused"] = outcomes.get("reused", 0) + 1
                continue
            if state == "stale":
                log(f"{job.run_dir}: trained with another config or data; training it again")
            pending.append(job)
        if pending:
            log(
                f"training {len(pending)} run(s) in {min(len(slots), len(pending))} parallel "
                f"process(es) on {', '.join(slots)}, "
                f"{training_threads(pending[0].cfg, slots)} thread(s) per run; reused "
                f"{outcomes.get('reused', 0)}"
            )
            done = train_in_processes(pending, slots, log=log, progress=progress)
            for status, n in done.items():
                outcomes[status] = outcomes.get(status, 0) + n
        return outcomes
    for job in jobs:
        vcfg = job.cfg
        if slots and vcfg.train.device != slots[0]:
            vcfg = dataclasses.replace(vcfg, train=dataclasses.replace(vcfg.train, device=slots[0]))
        log(f"[{job.variant} (train.seed={vcfg.train.seed})] {job.run_dir}")
        status = ensure_run(vcfg, job.data_dir, job.run_dir, log)
        log(f"[{job.variant}] {status}")
        outcomes[status] = outcomes.get(status, 0) + 1
    return outcomes
