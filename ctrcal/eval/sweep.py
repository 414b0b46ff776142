"""Former home of the parallel sweep, kept so that existing imports resolve.

The sweep lives in :mod:`ctrcal.train.sweep` (runs, devices) and
:mod:`ctrcal.train.processes` (the process pool).
"""

from ctrcal.train.processes import cpu_cores, run_in_processes, threads_per_worker
from ctrcal.train.sweep import (
    TrainJob,
    check_workers,
    ensure_run,
    run_state,
    train_in_processes,
    training_threads,
    visible_gpus,
    worker_slots,
)

__all__ = [
    "TrainJob",
    "check_workers",
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
