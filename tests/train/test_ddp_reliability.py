"""Two gloo processes with MC-LayerNorm: each rank draws its own subsets, a rerun draws the same
ones, and a run killed with -9 and resumed equals the uninterrupted one.

The ranks are started here with the environment torchrun gives them (``ctrcal train --nproc``
through torchrun itself is covered by test_ddp_training.py), forked from one launcher process
that has imported ctrcal (it is forked from the preloaded server, see forked_cli.py) and what
DDP's constructor imports, which keeps the three runs fast.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from pathlib import Path

import pytest
from forked_cli import free_port, preloaded_context
from interrupt import assert_same_training, wait_for
from rng_probe_model import RECORD_DIR, read_records

from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.train.checkpoint import load_checkpoint

EPOCHS = 3
ARGS = [
    "model.name=rng_probe_model:RngProbe",
    "model.net_norm={name: mclayernorm, fraction: 0.5}",
    "train.batch_size=2048",
    "train.eval_batch_size=8192",
    f"train.epochs={EPOCHS}",
    f"train.patience={EPOCHS}",
    "train.lr=0.005",
    "train.progress=false",
    "train.num_threads=1",
    "train.data_mode=memory",
    # the MC draws counted below are the training steps' alone (no start-up probe)
    "train.precision=fp32",
]


def _rank(rank: int, port: int, data: str, run_dir: str, probe: str, resume: bool) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
        **{RECORD_DIR: probe},
    )
    from ctrcal.train.trainer import train
    from ctrcal.validate import load_config

    train(load_config(None, ARGS), data, run_dir, resume=resume)


def _launcher(conn) -> None:
    """Fork the two ranks of each run asked for over ``conn`` (the arguments of :func:`_rank`
    after the rank; ``None``: stop), send their pids, then their exit statuses once both ended.

    Forked from the preloaded server, this process imports what DDP's constructor imports
    (``torch._dynamo``, about 1 s of CPU) once for its six ranks instead of once in each. It
    has started no thread (neither has the server), so forking it is safe.
    """
    import torch._dynamo  # noqa: F401

    fork = multiprocessing.get_context("fork")
    for args in iter(conn.recv, None):
        ranks = [fork.Process(target=_rank, args=(r, *args)) for r in (0, 1)]
        for p in ranks:
            p.start()
        conn.send([p.pid for p in ranks])
        for p in ranks:
            p.join()
        conn.send([p.exitcode for p in ranks])


class _Ranks:
    """The two ranks of one run, started by the launcher: their ``pids``, and ``poll`` (None
    while either runs, then both exit statuses) for :func:`interrupt.wait_for`."""

    def __init__(self, conn) -> None:
        self._conn = conn
        self.pids: list[int] = conn.recv()
        self._codes: list[int] | None = None

    def poll(self) -> list[int] | None:
        if self._codes is None and self._conn.poll():
            self._codes = self._conn.recv()
        return self._codes

    def join(self, timeout: float = 300) -> list[int]:
        if self._codes is None:
            assert self._conn.poll(timeout), f"the ranks still run after {timeout} s"
            self._codes = self._conn.recv()
        return self._codes


@pytest.fixture
def start_ranks():
    """``start(data, run_dir, probe, resume=False)`` -> the :class:`_Ranks` of a run, each
    rank recording its MC draws under ``probe``."""
    conn, theirs = multiprocessing.Pipe()
    launcher = preloaded_context().Process(target=_launcher, args=(theirs,))
    launcher.start()
    started: list[_Ranks] = []

    def start(data: Path, run_dir: Path, probe: Path, resume: bool = False) -> _Ranks:
        probe.mkdir()
        conn.send((free_port(), str(data), str(run_dir), str(probe), resume))
        started.append(_Ranks(conn))
        return started[-1]

    yield start
    if started and started[-1].poll() is None:  # a failed test left its ranks running
        for pid in started[-1].pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    conn.send(None)
    launcher.join(timeout=60)


@pytest.mark.slow
def test_ddp_mc_layernorm_streams_and_kill_9_resume(prepared_dir, tmp_path, start_ranks):
    from ctrcal.train.results import load_run

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert start_ranks(prepared_dir, full, tmp_path / "probe_full").join() == [0, 0]
    model = load_run(full)[0]
    assert sum(isinstance(m, MCLayerNorm) for m in model.modules()) == 1
    records = read_records(tmp_path / "probe_full")
    assert sorted(rank for rank, _ in records) == [0, 1]  # one training process per rank
    steps = {rank: lines for (rank, _), lines in records.items()}
    per_epoch = len(steps[0]) // EPOCHS
    assert per_epoch >= 2 and len(steps[0]) == len(steps[1]) == EPOCHS * per_epoch
    # each rank its own subset stream: at no step do the two ranks start from one state
    assert all(a != b for a, b in zip(steps[0], steps[1], strict=True))
    assert len(set(steps[0])) == len(steps[0])  # and the stream moves on at every step

    # both ranks killed with -9 once the first epoch is checkpointed, then resumed
    ranks = start_ranks(prepared_dir, cut, tmp_path / "probe_killed")
    wait_for(cut / "checkpoints" / "last.pt", ranks)
    # both frozen first: a rank killed alone makes its peer fail on the closed connection
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in ranks.pids:
            with contextlib.suppress(ProcessLookupError):  # ended already: the assert says so
                os.kill(pid, sig)
    assert ranks.join() == [-signal.SIGKILL] * 2, "finished before the kill"
    done = load_checkpoint(cut / "checkpoints" / "last.pt")["epoch"]
    assert 1 <= done < EPOCHS
    assert start_ranks(prepared_dir, cut, tmp_path / "probe_resumed", resume=True).join() == [0, 0]
    assert_same_training(full, cut)
    # a rerun draws the same subsets on each rank, step for step, before the kill and after
    # the resume
    for (rank, _), lines in read_records(tmp_path / "probe_killed").items():
        assert len(lines) >= done * per_epoch
        assert lines == steps[rank][: len(lines)]
    resumed = read_records(tmp_path / "probe_resumed")
    assert sorted(rank for rank, _ in resumed) == [0, 1]
    for (rank, _), lines in resumed.items():
        assert lines == steps[rank][done * per_epoch :]
