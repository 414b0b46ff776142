"""Process-group plumbing: sharding, exact gathers, and single-process no-ops."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from forked_cli import free_port, preloaded_context

from ctrcal.train.distributed import (
    DistContext,
    eval_block,
    gather_rows,
    init_distributed,
    shard_order,
    torchrun_command,
)


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed(torch.device("cpu"))
    assert ctx == DistContext() and ctx.is_main and not ctx.is_distributed
    x = torch.arange(5)
    assert shard_order(x, ctx) is x
    assert gather_rows(x, ctx) is x
    assert eval_block(7, ctx) == (0, 7)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 10, 11, 1001])
def test_shards_are_disjoint_and_equal(world, n):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    shards = [shard_order(order, DistContext(r, world)) for r in range(world)]
    assert len({s.numel() for s in shards}) == 1
    joined = torch.cat(shards)
    assert joined.unique().numel() == joined.numel() == (n // world) * world


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("n", [0, 1, 5, 100])
def test_eval_blocks_cover_every_row_in_order(world, n):
    blocks = [eval_block(n, DistContext(r, world)) for r in range(world)]
    covered = [i for start, stop in blocks for i in range(start, stop)]
    assert covered == list(range(n))


def test_torchrun_command_reinvokes_ctrcal():
    cmd = torchrun_command(2, ["train", "configs/demo.yaml"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc_per_node=2" in cmd and cmd[-3:] == ["ctrcal", "train", "configs/demo.yaml"]


def _worker(rank: int, world: int, port: int, out) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    ctx = init_distributed(torch.device("cpu"))
    try:
        start, stop = eval_block(11, ctx)
        local = torch.arange(start, stop, dtype=torch.float32).unsqueeze(1) * torch.ones(1, 2)
        out.put((rank, gather_rows(local, ctx)[:, 0].tolist()))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gather_rows_with_two_gloo_processes():
    context = preloaded_context()  # the ranks fork from a server that imported torch once
    out, port = context.Queue(), free_port()
    ranks = [context.Process(target=_worker, args=(r, 2, port, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    gathered = dict(out.get(timeout=120) for _ in ranks)
    for p in ranks:
        p.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    assert gathered[0] == gathered[1] == [float(i) for i in range(11)]
