"""The training loop: config + prepared data -> a run directory.

``train(cfg, data_dir, run_dir)`` trains the config's model with binary cross-entropy on
logits and writes the run directory laid out in :mod:`ctrcal.train.runs`. The loop's parts each
have their own module: one optimizer step (:mod:`ctrcal.train.step`), where a split lives
(:mod:`ctrcal.train.splits`), checkpoints (:mod:`ctrcal.train.checkpoint`), fine-tuning
(:mod:`ctrcal.train.finetune`), scoring (:mod:`ctrcal.train.evaluate`) and the outcome
(:mod:`ctrcal.train.results`).

Schedule (FuxiCTR's, which the MC-LayerNorm paper used on Criteo): after every epoch the
validation ``train.monitor`` is computed; no strict improvement multiplies the LR by
``lr_factor`` (never below ``min_lr``) and counts a bad epoch; ``patience`` bad epochs in a row
stop training; the best epoch's weights are restored at the end. ``train.lr_schedule`` adds a
decay within training (:data:`~ctrcal.train.step.LR_SCHEDULES`): every step's LR is the plateau
rule's LR times the schedule's multiplier at that step's share of all planned steps.

Reproducibility: the model is initialised from ``train.seed``; epoch ``e`` visits the rows in a
permutation seeded by ``(seed, e)``; ``last.pt`` holds the optimizer, the schedule state (best
score and epoch included) and every RNG state at the end of the last finished epoch, so
``resume=True`` after an interruption at any instant replays the remaining epochs exactly
(bit for bit on CPU).

Throughput: batches are contiguous tensors (device-resident on CUDA), one embedding gather per
batch, the table's gradient is sparse and lands in a persistent dense buffer (no table-sized
allocation per step), the loss is accumulated on the device and read once per epoch and once
per progress refresh (every ``PROGRESS_EVERY`` steps), never per step.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ctrcal.config import Config
from ctrcal.core.batch import Batch
from ctrcal.core.devices import resolve_device, seed_everything
from ctrcal.core.errors import ConfigError, CtrcalError, DataError
from ctrcal.core.utils import directory_lock, make_dirs, remove_stale_temporaries
from ctrcal.layers.embedding import FeatureEmbedding
from ctrcal.models.build import create_model
from ctrcal.train import distributed as dist_util
from ctrcal.train.checkpoint import (
    capture_rng_state,
    commit_best,
    load_best,
    load_checkpoint,
    restore_rng_state,
    save_best,
    save_checkpoint,
)
from ctrcal.train.cpu_matmul import cpu_matmul
from ctrcal.train.evaluate import (
    monitor_value,
    score_split,
    training_monitor,
    valid_metrics,
)
from ctrcal.train.noise import TrainShift
from ctrcal.train.precision import (
    Bf16Probe,
    bf16_may_pay,
    cpu_bf16_probe,
    precision_name,
    resolve_precision,
)
from ctrcal.train.predict import predict_split
from ctrcal.train.results import (
    TrainResult,
    load_run,
    read_result,
    write_history,
    write_result,
)
from ctrcal.train.runs import BEST, LAST, check_resumable, run_progress, write_run_files
from ctrcal.train.splits import check_ids, is_labelled, open_split, resolve_data_mode
from ctrcal.train.step import (
    StepContext,
    make_optimizer,
    make_step_context,
    set_scheduled_lr,
    train_step,
    without_dynamo_import,
)

if TYPE_CHECKING:
    from ctrcal.data.feature_map import FeatureMap

__all__ = [
    "epoch_seed",
    "train",
]

PROGRESS_EVERY = 50


def epoch_seed(seed: int, epoch: int) -> int:
    """The data-order seed of ``epoch`` (0-based) for a run seeded with ``seed``."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch)]).generate_state(1)[0])


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    resume: bool = False,
) -> TrainResult:
    """Train ``cfg.model`` on a prepared directory; write and return the run's outcome.

    Args:
        cfg: a valid :class:`~ctrcal.config.Config` (:func:`ctrcal.api.train` checks it first;
            this function does not check it again).
        data_dir: a prepared directory (``feature_map.json``, ``train/``, ``valid/``,
            optionally ``test/``; an unlabelled test split is skipped with a note).
        run_dir: where the run's files go (created). It is locked while training
            (``.<name>.lock`` beside it): a second ``train`` into it is refused, naming the
            first.
        resume: continue an interrupted run in ``run_dir`` from ``checkpoints/last.pt``
            (a finished run is returned as it is). Without it, a ``run_dir`` that already
            holds a run is an error.

    Raises:
        CtrcalError: an existing run without ``resume``, a config or data that differ from
            the run being resumed (or fine-tuned from), unreadable data, a diverged loss, or
            another process training into ``run_dir``.
        OutputError: a file of the run could not be written (no space, read-only,
            permission); the previous checkpoint is left intact, so ``resume=True`` goes on
            once the cause is gone.
    """
    data_dir, run_dir = Path(data_dir), Path(run_dir)
    # one process writes a run directory at a time; torchrun's other ranks follow rank 0
    lock = (
        directory_lock(run_dir, "'ctrcal train'", wait=False)
        if os.environ.get("RANK", "0") == "0"
        else contextlib.nullcontext()
    )
    with lock:
        return _train_locked(cfg, data_dir, run_dir, resume)


def _train_locked(cfg: Config, data_dir: Path, run_dir: Path, resume: bool) -> TrainResult:
    tcfg = cfg.train
    progress = run_progress(run_dir)
    if progress != "none" and not resume:
        raise CtrcalError(
            f"{run_dir} already holds a run; pass --resume (resume=True) to continue it or "
            "choose another output directory"
        )
    if resume and progress != "none":
        check_resumable(run_dir, cfg, data_dir)
        if progress == "finished":
            result = read_result(run_dir)
            result.model = load_run(run_dir)[0]
            return result
    threads = torch.get_num_threads()
    if tcfg.num_threads > 0:
        torch.set_num_threads(tcfg.num_threads)
    # the oneDNN switch is for eager float32 CPU runs; compiled graphs pick their own GEMM
    # lowering, and under bf16 the products are bf16 (the check would route none of them,
    # and its dispatch mode would cost every op of the step)
    eager_cpu = (
        resolve_device(tcfg.device).type == "cpu" and not tcfg.compile and tcfg.precision != "bf16"
    )
    try:
        with cpu_matmul(tcfg.cpu_matmul if eager_cpu else "default"):
            return _train(cfg, data_dir, run_dir, resume)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: Config, data_dir: Path, run_dir: Path, resume: bool) -> TrainResult:
    from ctrcal.config import config_to_dict
    from ctrcal.train.loggers import open_loggers

    device = resolve_device(cfg.train.device)
    dctx = dist_util.init_distributed(device)  # a single-process context without torchrun
    loggers = None
    finished = False
    try:
        device = dist_util.process_device(dctx, device)
        loggers = open_loggers(cfg.train, run_dir, config_to_dict(cfg), dctx.is_main)
        result = _train_in_context(cfg, data_dir, run_dir, resume, device, dctx, loggers)
        finished = True
        return result
    finally:
        if loggers is not None:
            status = "FINISHED" if finished else "FAILED"
            loggers.finish(run_dir / BEST if finished else None, status)
        dist_util.shutdown(dctx)


def _open_training_splits(
    data_dir: Path, feature_map: Any, mode: str, device: torch.device, dctx: Any
) -> tuple[Any, Any]:
    """The train split (a rank's shard under DDP) and the rows of valid this rank scores."""
    for split in ("train", "valid"):
        if not is_labelled(feature_map, split):
            raise DataError(
                f"{data_dir}: the {split} split is empty or has no labels; training needs "
                "labelled train and valid splits"
            )
    train_data = open_split(data_dir, "train", mode, device)
    valid_data = open_split(data_dir, "valid", mode, device)
    if len(train_data) == 0 or len(valid_data) == 0:
        raise DataError(f"{data_dir}: the train and valid splits must not be empty")
    check_ids(train_data, feature_map, f"{data_dir}/train")
    check_ids(valid_data, feature_map, f"{data_dir}/valid")
    if dctx.is_distributed:
        # every rank takes an equal disjoint share of each epoch's order and evaluates a
        # contiguous block of the validation rows; predictions are gathered for exact metrics
        train_data = dist_util.RankShard(train_data, dctx)
        valid_all = valid_data.all()
        start, stop = dist_util.eval_block(len(valid_all), dctx)
        valid_data = Batch(
            valid_all.categorical[start:stop],
            valid_all.numeric[start:stop],
            valid_all.label[start:stop],
        )
    return train_data, valid_data


class _Schedule:
    """The plateau schedule's state: best score and epoch, bad epochs, stop flag."""

    def __init__(self) -> None:
        self.best_value = -math.inf
        self.best_epoch = 0
        self.best_metrics: dict[str, float] = {}
        self.bad_epochs = 0
        self.stopped = False

    def state(self) -> dict[str, Any]:
        return {
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "best_metrics": self.best_metrics,
            "bad_epochs": self.bad_epochs,
            "stopped": self.stopped,
        }

    def load(self, last: dict[str, Any], run_dir: Path) -> None:
        if "best_value" not in last:  # written before last.pt held the schedule
            best = load_best(run_dir) or {}
            last = {
                **last,
                "best_value": best.get("monitor", -math.inf),
                "best_epoch": best.get("epoch", 0),
                "best_metrics": best.get("metrics", {}),
            }
        self.best_value = float(last["best_value"])
        self.best_epoch = int(last["best_epoch"])
        self.best_metrics = dict(last["best_metrics"])
        self.bad_epochs = int(last["bad_epochs"])
        self.stopped = bool(last.get("stopped", False))


@dataclass
class _TrainingData:
    """The checked, opened data of a run and what it selects epochs by."""

    feature_map: FeatureMap
    mode: str  # train.data_mode resolved: memory, device or stream
    train: Any  # the train split (this rank's shard under DDP)
    valid: Any  # the validation rows this rank scores
    shift: TrainShift | None  # train.train_shift on the training batches
    monitor: str  # train.monitor, or logloss where the validation AUC is undefined
    monitor_note: str | None  # why monitor is not train.monitor
    score_test: bool  # the test split is labelled


@dataclass
class _Progress:
    """Where the run stands: epochs finished, their history, the schedule, the best weights."""

    epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    sched: _Schedule = field(default_factory=_Schedule)
    best_state: dict[str, torch.Tensor] | None = None
    speeds: list[float] = field(default_factory=list)  # rows/s of the epochs this process ran


def _train_in_context(
    cfg: Config,
    data_dir: Path,
    run_dir: Path,
    resume: bool,
    device: torch.device,
    dctx: dist_util.DistContext,
    loggers: Any = None,
) -> TrainResult:
    """Train on this process's ``device`` (one rank of ``dctx``): the recipe, step by step."""
    data = _open_training_data(cfg, data_dir, device, dctx)
    resuming = resume and (run_dir / LAST).exists()
    model, optimizer = _build_model(cfg, data.feature_map, data_dir, resuming, device)
    progress, resumed_precision = _start_or_resume(
        cfg, data_dir, run_dir, resuming, model, optimizer, dctx.is_main
    )
    ctx = _set_up_step(model, optimizer, cfg.train, device, dctx, data.train, resumed_precision)
    _run_epochs(ctx, data, progress, cfg.train, run_dir, device, dctx, loggers)
    _hand_back_model(model, progress.best_state)
    return _finish(ctx, data, progress, cfg.train, data_dir, run_dir, device, dctx)


def _open_training_data(
    cfg: Config, data_dir: Path, device: torch.device, dctx: dist_util.DistContext
) -> _TrainingData:
    """Check the prepared data against ``cfg`` and open its splits, before anything is built.

    What ``validate --data`` refuses is refused here too, and a train shift that cannot act on
    the data fails here, so a refused run leaves no run directory behind.
    """
    from ctrcal.data.feature_map import FeatureMap, check_prepared_layout
    from ctrcal.shifts.data_check import check_training_data
    from ctrcal.train.table_limit import check_table_size

    tcfg = cfg.train
    feature_map = FeatureMap.load(data_dir)
    check_training_data(cfg, feature_map, data_dir, report=False)
    check_prepared_layout(cfg, feature_map, data_dir)
    check_table_size(cfg, feature_map)
    mode = resolve_data_mode(tcfg.data_mode, device, feature_map)
    if dctx.is_distributed and mode == "stream":
        raise ConfigError(
            "train.data_mode: 'stream' does not support multi-process training yet; "
            "use 'memory' or 'device' under torchrun"
        )
    dist_util.check_global_batch(tcfg.batch_size, dctx.world_size)
    score_test = is_labelled(feature_map, "test")
    test_rows = int(((feature_map.splits or {}).get("test") or {}).get("rows", 0) or 0)
    if dctx.is_main and test_rows and not score_test:
        _note(f"note: {data_dir}: the test split has no labels; it is not scored")
    train_data, valid_data = _open_training_splits(data_dir, feature_map, mode, device, dctx)
    # input noise on the training batches only (validation and test are scored clean)
    shift = TrainShift(tcfg.train_shift, feature_map) if tcfg.train_shift is not None else None
    monitor, monitor_note = training_monitor(tcfg.monitor, feature_map, data_dir)
    if dctx.is_main and monitor_note:
        _note(f"note: {monitor_note}")
    return _TrainingData(
        feature_map, mode, train_data, valid_data, shift, monitor, monitor_note, score_test
    )


def _build_model(
    cfg: Config, feature_map: FeatureMap, data_dir: Path, resuming: bool, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model initialised from ``train.seed`` (or fine-tuned from ``train.finetune_from``,
    unless a resume loads its weights anyway) on ``device``, and its optimizer."""
    from ctrcal.train.finetune import finetune_model

    seed_everything(cfg.train.seed)
    if cfg.train.finetune_from and not resuming:
        model = finetune_model(cfg, feature_map, data_dir)
    else:
        model = create_model(cfg.model, feature_map)  # checks the model contract
    model.to(device)
    return model, make_optimizer(model, cfg.train)


def _start_or_resume(
    cfg: Config,
    data_dir: Path,
    run_dir: Path,
    resuming: bool,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    main: bool,
) -> tuple[_Progress, str | None]:
    """A fresh run's files (rank 0), or ``last.pt`` loaded into ``model``, ``optimizer``, the
    schedule and the RNGs; returns the progress and the precision the resumed run trained in
    (``None`` for a fresh run)."""
    if not resuming:
        if main:
            make_dirs(run_dir)
            write_run_files(run_dir, cfg, data_dir)
        return _Progress(), None
    last = load_checkpoint(run_dir / LAST)
    model.load_state_dict(last["model"])
    with without_dynamo_import():
        optimizer.load_state_dict(last["optimizer"])
    for group in optimizer.param_groups:  # a last.pt written before groups kept a base LR
        group.setdefault("base_lr", group["lr"])
    progress = _Progress(epoch=int(last["epoch"]), history=list(last["history"]))
    progress.sched.load(last, run_dir)
    if progress.sched.best_epoch:
        best = load_best(run_dir, progress.sched.best_epoch) if main else None
        progress.best_state = best["model"] if best is not None else None
    restore_rng_state(last["rng"])
    if main:
        # what a kill inside an atomic write left behind, then the history that a kill
        # may have stopped before its last rewrite
        for directory in (run_dir, (run_dir / LAST).parent):
            remove_stale_temporaries(directory)
        write_history(run_dir, progress.history)
    return progress, last.get("precision")


def _set_up_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tcfg: Any,
    device: torch.device,
    dctx: dist_util.DistContext,
    train_data: Any,
    resumed_precision: str | None,
) -> StepContext:
    """The training step the epochs run: the forward (DDP across ranks, ``torch.compile``),
    the precision of training and scoring alike (``ctx.amp_dtype``) and the step context."""
    forward: Callable[..., torch.Tensor] = model
    if dctx.is_distributed:
        from torch.nn.parallel import DistributedDataParallel

        # parameters are broadcast from rank 0 here, so every rank starts from one model
        forward = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if tcfg.compile:
        forward = torch.compile(forward)  # type: ignore[assignment]
    # auto on a CPU times this model's own step both ways
    if resumed_precision in ("fp32", "bf16"):  # a resumed run keeps the precision it had
        amp = torch.bfloat16 if resumed_precision == "bf16" else None
    else:
        world = dctx.world_size
        amp = resolve_precision(
            tcfg.precision, device, lambda: _probe_precision(model, train_data, tcfg, device, world)
        )
    # each rank probed its own process: rank 0's verdict holds for all
    amp = torch.bfloat16 if dist_util.rank0_flag(amp is not None, dctx, device) else None
    # torch.compile traces the dense lookup, and DDP all-reduces dense gradients only:
    # sparse table gradients are for single-process eager mode
    return make_step_context(
        model,
        optimizer,
        tcfg,
        device,
        amp,
        forward,
        sparse_tables=not (tcfg.compile or dctx.is_distributed),
    )


def _run_epochs(
    ctx: StepContext,
    data: _TrainingData,
    progress: _Progress,
    tcfg: Any,
    run_dir: Path,
    device: torch.device,
    dctx: dist_util.DistContext,
    loggers: Any,
) -> None:
    """Epochs until ``train.epochs`` or the schedule stops; each one trains, scores the
    validation split, steps the schedule and (rank 0) writes ``last.pt``, so an interruption
    resumes from the last finished epoch."""
    while progress.epoch < tcfg.epochs and not progress.sched.stopped:
        epoch = progress.epoch
        if tcfg.lr_schedule != "constant":
            steps = -(-len(data.train) // (tcfg.batch_size // dctx.world_size))
            set_scheduled_lr(ctx.optimizer, tcfg.lr_schedule, epoch * steps, tcfg.epochs * steps)
        lr = ctx.optimizer.param_groups[0]["lr"]
        if dctx.is_distributed:
            # MC-LayerNorm subsets and dropout masks must differ across ranks, and resuming
            # must redraw the same ones: a per-(epoch, rank) seed gives both
            torch.manual_seed(epoch_seed(tcfg.seed, epoch) * 1_000_003 + dctx.rank)
        train_loss, rows_per_s, seconds = _train_epoch(
            ctx,
            data.train,
            tcfg,
            epoch,
            device,
            tcfg.batch_size // dctx.world_size,
            dctx,
            data.shift,
            loggers,
        )
        progress.speeds.append(rows_per_s)
        scores = _score_validation(ctx, data.valid, tcfg, device, dctx)
        value = monitor_value(data.monitor, scores["auc"], scores["logloss"])
        improved = _step_schedule(progress, value, scores, ctx, tcfg, run_dir, dctx.is_main)
        if loggers:
            loggers.epoch(epoch + 1, train_loss, scores)
        progress.history.append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                **{f"valid_{k}": v for k, v in scores.items()},
                "monitor": value if math.isfinite(value) else None,
                "lr": lr,
                "improved": improved,
                "best_epoch": progress.sched.best_epoch,
                "rows_per_s": rows_per_s,
                "seconds": seconds,
            }
        )
        progress.epoch += 1
        if dctx.is_main:
            _save_last(run_dir, ctx, progress)


def _score_validation(
    ctx: StepContext, valid: Any, tcfg: Any, device: torch.device, dctx: dist_util.DistContext
) -> dict[str, float]:
    """The epoch's validation metrics, in the run's precision; under DDP each rank scores its
    block and the predictions are gathered, so the metrics are exact, not averaged."""
    pred = predict_split(
        [ctx.model], valid, batch_size=tcfg.eval_batch_size, device=device, precision=ctx.amp_dtype
    )
    logits, labels = torch.from_numpy(pred.logits).float(), torch.from_numpy(pred.labels)
    logits = dist_util.gather_rows(logits.to(device), dctx).cpu()
    labels = dist_util.gather_rows(labels.to(device), dctx).cpu()
    return valid_metrics(logits, labels)


def _step_schedule(
    progress: _Progress,
    value: float,
    scores: dict[str, float],
    ctx: StepContext,
    tcfg: Any,
    run_dir: Path,
    main: bool,
) -> bool:
    """The plateau schedule after the epoch ``progress.epoch`` scored ``value``; True when it
    is the best yet.

    A strict improvement keeps the model's weights (and rank 0 writes ``best.pt``); anything
    else multiplies the LR by ``lr_factor`` (never below ``min_lr``) and counts a bad epoch;
    ``patience`` bad epochs in a row stop training.
    """
    sched = progress.sched
    improved = value > sched.best_value
    if improved:
        sched.best_value, sched.best_epoch, sched.bad_epochs = value, progress.epoch + 1, 0
        sched.best_metrics = {**scores, "monitor": value}
        progress.best_state = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
        if main:
            save_best(
                run_dir,
                {
                    "model": progress.best_state,
                    "epoch": sched.best_epoch,
                    "monitor": value,
                    "metrics": sched.best_metrics,
                },
            )
    else:
        sched.bad_epochs += 1
        for group in ctx.optimizer.param_groups:
            group["base_lr"] = max(group["base_lr"] * tcfg.lr_factor, tcfg.min_lr)
            group["lr"] = group["base_lr"]  # a decaying schedule rescales it at the next step
    sched.stopped = sched.bad_epochs >= tcfg.patience
    return improved


def _save_last(run_dir: Path, ctx: StepContext, progress: _Progress) -> None:
    """Write ``last.pt`` (model, optimizer, schedule, history, RNGs, precision) for the epochs
    finished so far, then commit ``best.pt`` and the history beside it."""
    with without_dynamo_import():
        optimizer_state = ctx.optimizer.state_dict()
    save_checkpoint(
        run_dir / LAST,
        {
            "model": ctx.model.state_dict(),
            "optimizer": optimizer_state,
            "epoch": progress.epoch,
            **progress.sched.state(),
            "history": progress.history,
            "rng": capture_rng_state(),
            "precision": precision_name(ctx.amp_dtype),
        },
    )
    commit_best(run_dir)
    write_history(run_dir, progress.history)


def _hand_back_model(model: nn.Module, best_state: dict[str, torch.Tensor] | None) -> None:
    """Make ``model`` a plain one (dense lookups, no gradients held) with the best epoch's
    weights, as a caller expects to use it."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.sparse = False
        if isinstance(module, FeatureEmbedding):
            module.grad_in_place = False
    model.zero_grad(set_to_none=True)
    if best_state is not None:
        model.load_state_dict(best_state)


def _finish(
    ctx: StepContext,
    data: _TrainingData,
    progress: _Progress,
    tcfg: Any,
    data_dir: Path,
    run_dir: Path,
    device: torch.device,
    dctx: dist_util.DistContext,
) -> TrainResult:
    """The run's outcome; rank 0 alone scores the test split and writes ``result.json``."""
    common = dict(
        run_dir=run_dir,
        best_epoch=progress.sched.best_epoch,
        epochs_completed=progress.epoch,
        stopped_early=progress.sched.stopped and progress.epoch < tcfg.epochs,
        valid=progress.sched.best_metrics,
        train_rows_per_s=float(np.mean(progress.speeds)) if progress.speeds else 0.0,
        history=progress.history,
        model=ctx.model,
        monitor=data.monitor,
        monitor_note=data.monitor_note,
        precision=precision_name(ctx.amp_dtype),
    )
    if not dctx.is_main:
        dist_util.barrier(dctx)
        return TrainResult(test=None, oracle=None, **common)
    test = None
    if data.score_test:
        test_data = open_split(data_dir, "test", data.mode, device)
        test = score_split(
            ctx.model, test_data, tcfg.eval_batch_size, device, precision=ctx.amp_dtype
        )
    oracle = (getattr(data.feature_map, "extra", None) or {}).get("oracle", {}).get("test")
    result = TrainResult(test=test, oracle=oracle, **common)
    write_result(run_dir, result)
    dist_util.barrier(dctx)
    return result


def _probe_precision(
    model: nn.Module, data: Any, tcfg: Any, device: torch.device, world: int
) -> Bf16Probe:
    """:func:`~ctrcal.train.precision.cpu_bf16_probe` on the run's model and the first batch
    of its training split (in file order); a model too small for bf16 to pay
    (:func:`~ctrcal.train.precision.bf16_may_pay`) is not timed."""
    if not bf16_may_pay(model):
        return Bf16Probe(0.0, 0.0, float("nan"), False)
    batch = next(iter(data.batches(max(1, tcfg.batch_size // world), shuffle=False)))
    return cpu_bf16_probe(model, batch.to(device))


def _train_epoch(
    ctx: StepContext,
    data: Any,
    tcfg: Any,
    epoch: int,
    device: torch.device,
    batch_size: int | None = None,
    dctx: dist_util.DistContext | None = None,
    shift: TrainShift | None = None,
    loggers: Any = None,
) -> tuple[float, float, float]:
    """One pass over the training split; returns (mean loss, rows/s, seconds).

    ``shift`` (``train.train_shift``) perturbs every batch, from a stream seeded at the start
    of the epoch by torch's global generator (see :mod:`ctrcal.train.noise`). ``loggers``
    (:class:`~ctrcal.train.loggers.RunLoggers`) get the running loss, the LR and rows/s every
    ``train.log_every`` steps: the only host syncs they add.

    Under DDP, ``batch_size`` is this rank's share of the global batch, and the loss and
    rows/s are totals over all ranks (one all-reduce per epoch).
    """
    dctx = dctx or dist_util.DistContext()
    batch_size = batch_size or tcfg.batch_size
    from tqdm.auto import tqdm

    ctx.model.train()
    total = len(data)
    bar = tqdm(
        total=total,
        unit="rows",
        unit_scale=True,
        desc=f"epoch {epoch + 1}/{tcfg.epochs}",
        disable=not (tcfg.progress and dctx.is_main),
        leave=False,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    acc_dtype = torch.float64 if device.type in ("cpu", "cuda") else torch.float32
    loss_sum = torch.zeros((), dtype=acc_dtype, device=device)
    rows = steps = 0
    # a global step count for the loggers: every epoch has the same number of batches
    steps_per_epoch = -(-len(data) // batch_size)
    first_step = epoch * steps_per_epoch
    decay = tcfg.lr_schedule != "constant"
    if shift is not None:
        shift.start_epoch()
    start = time.perf_counter()
    try:
        for batch in data.batches(batch_size, shuffle=True, seed=epoch_seed(tcfg.seed, epoch)):
            batch = batch.to(device, non_blocking=True)
            if shift is not None:
                batch = shift(batch)
            if decay:
                set_scheduled_lr(
                    ctx.optimizer,
                    tcfg.lr_schedule,
                    first_step + steps,
                    tcfg.epochs * steps_per_epoch,
                )
            loss = train_step(ctx, batch)
            n = len(batch)
            loss_sum += loss.to(acc_dtype) * n
            rows += n
            steps += 1
            bar.update(n)
            if tcfg.progress and steps % PROGRESS_EVERY == 0:
                bar.set_postfix(loss=f"{float(loss_sum) / rows:.4f}", refresh=False)
            if loggers and steps % tcfg.log_every == 0:
                elapsed = max(time.perf_counter() - start, 1e-9)
                loggers.step(
                    first_step + steps,
                    float(loss_sum) / rows,
                    ctx.optimizer.param_groups[0]["lr"],
                    rows / elapsed,
                )
        if dctx.is_distributed:
            totals = torch.stack(
                [loss_sum, torch.tensor(float(rows), dtype=acc_dtype, device=device)]
            )
            loss_sum, rows_t = dist_util.all_reduce_sum(totals, dctx)
            rows = int(rows_t)
        mean_loss = float(loss_sum) / max(rows, 1)  # the epoch's one host sync
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    if not math.isfinite(mean_loss):
        raise CtrcalError(
            f"training diverged at epoch {epoch + 1} (loss {mean_loss}); lower train.lr or "
            "set train.grad_clip"
        )
    return mean_loss, rows / max(seconds, 1e-9), seconds
