"""Multi-process plumbing for torchrun / DistributedDataParallel.

A run launched by ``torchrun --nproc_per_node N -m ctrcal train CONFIG`` finds ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK`` in its environment; :func:`init_distributed` turns them into a
:class:`DistContext` (NCCL on GPUs, gloo on CPU). Without them everything degrades to one
process and no collective is ever called, so single-process code paths pay nothing.

Conventions the trainer relies on:

* every rank draws the *same* shuffled order of the epoch (same seed) and takes a disjoint,
  equally long shard of it (:func:`shard_order`), so all ranks run the same number of steps
  and no all-reduce waits forever;
* evaluation splits the rows into contiguous per-rank blocks (:func:`eval_block`) and
  :func:`gather_rows` concatenates the predictions back in row order, so metrics are computed
  exactly over the whole split (never an average of per-rank AUCs);
* only rank 0 writes files (:attr:`DistContext.is_main`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ctrcal.core.errors import ConfigError, CtrcalError


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when not launched by torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise CtrcalError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from None


def check_global_batch(batch_size: int, world: int) -> None:
    """``train.batch_size`` is the global batch: it must split evenly over the processes.
    Asked by ``ctrcal train --nproc`` before it starts them, and by each process.

    Raises:
        ConfigError: naming the key, the batch and the number of processes.
    """
    if batch_size % world:
        raise ConfigError(
            f"train.batch_size: {batch_size} rows cannot be split evenly over "
            f"{world} processes (train.batch_size is the global batch)"
        )


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group torchrun set up, or return a single-process context.

    Args:
        device: the device this process trains on; ``cuda`` selects NCCL and pins the
            process to ``cuda:LOCAL_RANK``, anything else selects gloo.
    """
    world = env_world_size()
    if world <= 1:
        return DistContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return DistContext(rank, world, local_rank, backend)


def process_device(ctx: DistContext, device: torch.device) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` under NCCL, else ``device`` unchanged."""
    if ctx.is_distributed and device.type == "cuda":
        return torch.device("cuda", ctx.local_rank)
    return device


def shutdown(ctx: DistContext) -> None:
    """Leave the process group (no-op for a single process)."""
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()


def shard_order(order: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """This rank's disjoint, equally long share of an epoch's row order.

    Rows are dealt round-robin after dropping the ``len(order) % world_size`` last ones of the
    (shuffled) order, so every rank runs the same number of steps; the dropped rows change
    from epoch to epoch with the shuffle.

    Args:
        order: int64 [N] permutation of row indices, identical on every rank.
    Returns:
        int64 [N // world_size] indices for this rank.
    """
    if not ctx.is_distributed:
        return order
    usable = (order.numel() // ctx.world_size) * ctx.world_size
    return order[ctx.rank : usable : ctx.world_size]


def eval_block(num_rows: int, ctx: DistContext) -> tuple[int, int]:
    """``[start, stop)`` of this rank's contiguous block of an evaluation split.

    Blocks cover every row exactly once, in order, so :func:`gather_rows` restores the
    split's row order.
    """
    per_rank = -(-num_rows // ctx.world_size)
    start = min(ctx.rank * per_rank, num_rows)
    return start, min(start + per_rank, num_rows)


def gather_rows(local: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Concatenate every rank's ``local`` [n_r, ...] along dim 0, in rank order.

    Ranks may hold different numbers of rows; the result is the same tensor on every rank.
    """
    if not ctx.is_distributed:
        return local
    n = torch.tensor([local.shape[0]], device=local.device, dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, n)
    counts = [int(s.item()) for s in sizes]
    padded = local.new_zeros((max(counts), *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """The command that re-runs ``ctrcal <argv>`` under torchrun with ``nproc`` processes."""
    if nproc < 1:
        raise CtrcalError(f"--nproc must be >= 1, got {nproc}")
    # The module form works wherever this torch is importable, with or without `torchrun`
    # on PATH, and always runs this interpreter.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "ctrcal",
        *argv,
    ]


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run ``ctrcal <argv>`` under torchrun and return its exit status."""
    return subprocess.call(torchrun_command(nproc, argv))


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum of ``t`` over ranks (``t`` itself for a single process)."""
    if not ctx.is_distributed:
        return t
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def rank0_flag(flag: bool, ctx: DistContext, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (``flag`` itself for a single process): a choice each
    rank made alone, such as ``auto``'s precision probe timing its own process, becomes one
    choice for all, so that no two ranks compute in different precisions."""
    if not ctx.is_distributed:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op for a single process)."""
    if ctx.is_distributed:
        dist.barrier()


class RankShard:
    """This rank's view of a training split under DDP.

    Each call of :meth:`batches` draws the same permutation on every rank (same ``seed``) and
    yields batches from this rank's :func:`shard_order` share of it. With a per-rank batch of
    ``B / world_size`` rows, step ``i`` of all ranks together covers exactly the rows of step
    ``i`` of a single process with batch ``B``, so averaging the ranks' gradients reproduces
    single-process training (up to the order of floating-point sums).

    Args:
        data: a split in memory or device mode (anything with ``all() -> Batch``).
        ctx: this process's :class:`DistContext`.
    """

    def __init__(self, data, ctx: DistContext) -> None:
        from ctrcal.core.batch import Batch

        full = data.all()
        # int32 ids halve the resident size; batches are widened to int64 one at a time
        self._cat = full.categorical.to(torch.int32)
        self._num, self._label = full.numeric, full.label
        self._batch = Batch
        self.ctx = ctx

    def __len__(self) -> int:
        return self._label.shape[0] // self.ctx.world_size

    def batches(self, batch_size: int, shuffle: bool = True, seed: int | None = None):
        """Yield this rank's batches of ``batch_size`` rows for one epoch."""
        n = self._label.shape[0]
        device = self._label.device
        if shuffle:
            if seed is None:  # an unseeded draw would give every rank another order
                raise ValueError("RankShard.batches needs a seed to shuffle")
            gen = torch.Generator(device=device)
            gen.manual_seed(seed)
            order = torch.randperm(n, generator=gen, device=device)
        else:
            order = torch.arange(n, device=device)
        mine = shard_order(order, self.ctx)
        for i in range(0, mine.numel(), batch_size):
            idx = mine[i : i + batch_size]
            yield self._batch(
                self._cat.index_select(0, idx).long(),
                self._num.index_select(0, idx),
                self._label.index_select(0, idx),
            )
