"""The single training loop: config + prepared data -> a run directory.

``train(cfg, data_dir, run_dir)`` trains ``build_model(cfg.model, feature_map)`` with
binary cross-entropy on logits and writes::

    run_dir/config.yaml          the resolved config (load_config reads it back)
    run_dir/feature_map.json     copy of the data's feature map (the model's input contract)
    run_dir/data.json            where the data was (path, source hash, splits)
    run_dir/metrics.jsonl        one JSON line per epoch (train loss, valid AUC/logloss, LR, ...)
    run_dir/checkpoints/best.pt  best weights so far  {"model", "epoch", "metrics", ...}
    run_dir/checkpoints/last.pt  everything to resume {"model", "optimizer", "rng", ...}
    run_dir/result.json          the outcome (best epoch, valid and test metrics)

Every checkpoint loads with ``torch.load(path, weights_only=True)``.

Schedule (FuxiCTR's, which the MC-LayerNorm paper used on Criteo): after every epoch the
validation ``train.monitor`` is computed; no strict improvement multiplies the LR by
``lr_factor`` (never below ``min_lr``) and counts a bad epoch; ``patience`` bad epochs in a row
stop training; the best epoch's weights are restored at the end.

Embedding L2 (``train.emb_l2``) is FuxiCTR's ``embedding_regularizer``: (λ/2)·||W||² over the
WHOLE categorical table (rows a batch does not use shrink too, as in the published setups),
applied as its gradient λ·W: with Adam as the table group's coupled ``weight_decay`` inside the
fused optimizer kernel (no extra pass over the table; it is added after gradient clipping,
which only matters in the rare steps that clip), with AdamW added to the gradient before
clipping. The reported training loss is the BCE alone. Only ``nn.Embedding`` tables are
penalised, not the numeric embedding vectors (FuxiCTR's numeric embeddings are linear
layers, outside its embedding regulariser too).

Reproducibility: the model is initialised from ``train.seed``; epoch ``e`` visits the rows in a
permutation seeded by ``(seed, e)``; ``last.pt`` holds the optimizer, the schedule state and
every RNG state at the end of the last finished epoch, so ``resume=True`` after an
interruption replays the remaining epochs exactly (bit for bit on CPU).

Throughput: batches are contiguous tensors (device-resident on CUDA), one embedding gather per
batch, the table's gradient is sparse and lands in a persistent dense buffer (no table-sized
allocation per step), the loss is accumulated on the device and read once per epoch and once
per progress refresh (every ``PROGRESS_EVERY`` steps), never per step.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.config import Config, NormSpec, config_to_dict, dump_config, load_config
from ctrcal.data.loader import Batch
from ctrcal.errors import ConfigError, CtrcalError, DataError
from ctrcal.models.masknet import MaskNet, build_model
from ctrcal.train import distributed as dist_util
from ctrcal.train.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from ctrcal.train.cpu_matmul import cpu_matmul
from ctrcal.train.predict import predict_logits, predict_probs, predict_with_labels
from ctrcal.utils import resolve_device, seed_everything, write_json_atomic, write_text_atomic

__all__ = [
    "TrainResult",
    "epoch_seed",
    "evaluate_run",
    "load_run",
    "predict_logits",
    "predict_probs",
    "train",
]

PROGRESS_EVERY = 50
CONFIG_FILE = "config.yaml"
FEATURE_MAP_FILE = "feature_map.json"
DATA_FILE = "data.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
BEST = Path("checkpoints") / "best.pt"
LAST = Path("checkpoints") / "last.pt"

# Keys that may differ between a run's snapshot and the config it is resumed with: they change
# how fast or how visibly the run goes, not what it computes.
_RESUME_FREE = {"train.progress", "train.num_threads", "train.device", "train.data_mode",
                "train.epochs", "train.eval_batch_size", "train.cpu_matmul", "out_dir"}  # fmt: skip


@dataclass
class TrainResult:
    """What :func:`train` returns (and writes as ``result.json``, ``model`` excluded).

    Attributes:
        run_dir: the run directory.
        best_epoch: 1-based epoch whose weights were kept (0: no epoch finished).
        epochs_completed: epochs trained in total (resumed runs included).
        stopped_early: whether patience ran out before ``train.epochs``.
        valid: validation metrics of the best epoch (``auc``, ``logloss``, ``monitor``).
        test: metrics of the best weights on the test split (None without one).
        train_rows_per_s: mean training throughput over the epochs of this process.
        history: one dict per epoch (the lines of ``metrics.jsonl``).
        oracle: for synthetic data, the metrics of the true click probabilities on the test
            split (the best any model can do); None otherwise.
        model: the trained model with the best weights, on the training device.
    """

    run_dir: Path
    best_epoch: int
    epochs_completed: int
    stopped_early: bool
    valid: dict[str, float]
    test: dict[str, float] | None
    train_rows_per_s: float
    history: list[dict[str, Any]] = field(default_factory=list)
    oracle: dict[str, float] | None = None
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        """A few lines for the command line."""
        lines = [
            f"run {self.run_dir}: {self.epochs_completed} epochs"
            + (" (stopped early)" if self.stopped_early else "")
            + f", best epoch {self.best_epoch}, {self.train_rows_per_s:,.0f} training rows/s",
        ]
        if self.valid:
            lines.append(f"valid: AUC {self.valid['auc']:.4f}  logloss {self.valid['logloss']:.4f}")
        if self.test:
            lines.append(
                f"test:  AUC {self.test['auc']:.4f}  logloss {self.test['logloss']:.4f}  "
                f"ECE {self.test['ece']:.4f}"
            )
        if self.oracle:
            lines.append(
                f"oracle (true probabilities on test): AUC {self.oracle['auc']:.4f}  "
                f"logloss {self.oracle['logloss']:.4f}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("model")
        out["run_dir"] = str(self.run_dir)
        return out


# ---------------------------------------------------------------------------------------------
# Small pieces


def epoch_seed(seed: int, epoch: int) -> int:
    """The data-order seed of ``epoch`` (0-based) for a run seeded with ``seed``."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch)]).generate_state(1)[0])


def _monitor_value(name: str, auc: float, logloss: float) -> float:
    value = {"auc": auc, "logloss": -logloss, "auc_logloss": auc - logloss}[name]
    return value if math.isfinite(value) else -math.inf


def _amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _data_mode(mode: str, device: torch.device, feature_map: Any = None) -> str:
    """``auto``: the splits live on the GPU when they fit in half its free memory, else in
    host memory (batches copied over); on the CPU memory and device mode are the same."""
    if mode != "auto":
        return mode
    if device.type != "cuda":
        return "memory"
    splits = getattr(feature_map, "splits", None) or {}
    rows = sum(int(splits.get(k, {}).get("rows", 0)) for k in ("train", "valid", "test"))
    fields = len(getattr(feature_map, "vocab_sizes", [])) + len(
        getattr(feature_map, "numeric_fields", [])
    )
    need = rows * 4 * (fields + 1)  # int32 ids, float32 numerics and label, as the loader keeps
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if need < 0.5 * free else "memory"


def make_optimizer(model: nn.Module, cfg_train: Any) -> torch.optim.Optimizer:
    """Adam or AdamW over two groups: dense layers (``weight_decay``) and embedding tables.

    With Adam, ``emb_l2`` is the table group's (coupled, i.e. L2) ``weight_decay``: Adam adds
    ``emb_l2 * W`` to the table's gradient inside its fused kernel, which is exactly the
    gradient of (emb_l2/2)*||W||^2 at no extra pass over the table. (AdamW's weight decay is
    decoupled, so there :func:`_train_step` adds the L2 gradient itself.)
    """
    tables = {id(p) for p in _embedding_tables(model)}
    dense = [p for p in model.parameters() if p.requires_grad and id(p) not in tables]
    emb = [p for p in model.parameters() if p.requires_grad and id(p) in tables]
    groups = [{"params": dense, "weight_decay": cfg_train.weight_decay}]
    if emb:
        decay = cfg_train.emb_l2 if cfg_train.optimizer == "adam" else 0.0
        groups.append({"params": emb, "weight_decay": decay})
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg_train.optimizer]
    devices = {p.device.type for p in model.parameters()}
    # The fused kernels (one per step instead of one per tensor) exist on CPU and CUDA.
    fused = devices <= {"cpu", "cuda"}
    return cls(groups, lr=cfg_train.lr, fused=fused)


def _embedding_tables(model: nn.Module) -> list[nn.Parameter]:
    """Weights of every ``nn.Embedding`` in the model (what ``emb_l2`` applies to)."""
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            seen[id(module.weight)] = module.weight
    return list(seen.values())


@dataclass
class _StepContext:
    """Everything one training step needs (built once by :func:`make_step_context`)."""

    model: nn.Module
    forward: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]
    tables: list[nn.Parameter]
    emb_l2: float  # added by the step itself (AdamW); 0 when the optimizer applies it (Adam)
    grad_clip: float
    device_type: str
    amp_dtype: torch.dtype | None
    sparse_tables: bool = False  # tables emit sparse grads into persistent dense .grad buffers


def make_step_context(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg_train: Any,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    forward: Callable[..., torch.Tensor] | None = None,
    sparse_tables: bool = True,
) -> _StepContext:
    """Set up the training step for ``model`` (switching its tables to sparse gradients).

    With ``sparse_tables`` every ``nn.Embedding`` of the model gets ``sparse=True``: the
    lookup's backward then yields only the B*F touched rows, which autograd adds into the
    table's dense ``.grad`` kept allocated across steps (zeroed in place), instead of
    allocating, zeroing and filling a fresh table-sized gradient every step. The optimizer
    still sees an ordinary dense gradient, so Adam's update of every row is unchanged.
    """
    tables = _embedding_tables(model)
    if sparse_tables:
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.sparse = True
    return _StepContext(
        model=model,
        forward=forward if forward is not None else model,
        optimizer=optimizer,
        params=[p for p in model.parameters() if p.requires_grad],
        tables=tables,
        emb_l2=cfg_train.emb_l2 if cfg_train.optimizer != "adam" else 0.0,
        grad_clip=cfg_train.grad_clip,
        device_type=device.type,
        amp_dtype=amp_dtype,
        sparse_tables=sparse_tables and bool(tables),
    )


def _zero_grads(ctx: _StepContext) -> None:
    if not ctx.sparse_tables:
        ctx.optimizer.zero_grad(set_to_none=True)
        return
    table_ids = {id(t) for t in ctx.tables}
    for p in ctx.params:
        if id(p) not in table_ids:
            p.grad = None
        elif p.grad is None or p.grad.is_sparse:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()


def _clip_grads(ctx: _StepContext) -> None:
    grads = [p.grad for p in ctx.params if p.grad is not None]
    if ctx.device_type != "cpu":
        # no host sync on accelerators: always multiply by min(1, clip / norm) on the device
        nn.utils.clip_grad_norm_(ctx.params, ctx.grad_clip, foreach=True)
        return
    # On the CPU reading the norm costs nothing, and skipping the (rarely needed) rescale
    # saves a pass over the whole table. Same threshold as clip_grad_norm_.
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = ctx.grad_clip / (float(total) + 1e-6)
    if coef < 1.0:
        torch._foreach_mul_(grads, coef)


def _train_step(ctx: _StepContext, batch: Batch) -> torch.Tensor:
    """One optimizer step; returns the (device) mean BCE of the batch, without a host sync."""
    _zero_grads(ctx)
    with torch.autocast(ctx.device_type, dtype=ctx.amp_dtype or torch.bfloat16,
                        enabled=ctx.amp_dtype is not None):  # fmt: skip
        logits = ctx.forward(batch.categorical, batch.numeric)
    loss = F.binary_cross_entropy_with_logits(logits.float(), batch.label)
    loss.backward()
    if ctx.emb_l2 > 0:
        with_grad = [t for t in ctx.tables if t.grad is not None]
        with torch.no_grad():
            torch._foreach_add_([t.grad for t in with_grad], with_grad, alpha=ctx.emb_l2)
    if ctx.grad_clip > 0:
        _clip_grads(ctx)
    ctx.optimizer.step()
    return loss.detach()


def _check_ids(data: Any, feature_map: Any, where: str) -> None:
    """Fail early, with the field's name, on ids outside a field's vocabulary."""
    tensors = getattr(data, "_tensors", None)
    if tensors is None:
        return  # streamed: the embedding lookup itself raises on a bad id
    cat = tensors[0]
    if cat.numel() == 0:
        return
    lo = cat.amin(dim=0).cpu()
    hi = cat.amax(dim=0).cpu()
    sizes = torch.tensor(feature_map.vocab_sizes)
    bad = ((lo < 0) | (hi >= sizes)).nonzero().flatten().tolist()
    if bad:
        j = bad[0]
        raise DataError(
            f"{where}: field {feature_map.categorical_fields[j]} has ids in "
            f"[{int(lo[j])}, {int(hi[j])}] but its vocabulary size is {int(sizes[j])} "
            "(was the data prepared with another feature map?)"
        )


def resolve_data_dir(cfg: Config, data_dir: str | Path | None = None) -> Path:
    """The prepared directory to train on: ``data_dir`` if given, else prepare ``cfg.data``.

    Without ``data_dir`` the data named by the config (raw inputs, or the synthetic default)
    is prepared into ``cfg.data.prepared_dir`` or ``<out_dir>/data``; an unchanged prepared
    directory is reused, not rebuilt.
    """
    if data_dir is not None:
        return Path(data_dir)
    from ctrcal.data.prepare import prepare_from_config

    target = Path(cfg.data.prepared_dir) if cfg.data.prepared_dir else Path(cfg.out_dir) / "data"
    return Path(prepare_from_config(cfg, target))


def _open_split(data_dir: Path, split: str, mode: str, device: torch.device) -> Any:
    from ctrcal.data.loader import ParquetCTRData

    return ParquetCTRData(data_dir, split, mode=mode, device=device if mode == "device" else None)


# ---------------------------------------------------------------------------------------------
# Run directory


def _write_run_files(run_dir: Path, cfg: Config, data_dir: Path, feature_map: Any) -> None:
    write_text_atomic(run_dir / CONFIG_FILE, dump_config(cfg))
    fm_src = data_dir / FEATURE_MAP_FILE
    write_text_atomic(run_dir / FEATURE_MAP_FILE, fm_src.read_text())
    write_json_atomic(
        run_dir / DATA_FILE,
        {
            "data_dir": str(data_dir.resolve()),
            "source_hash": getattr(feature_map, "source_hash", None),
            "splits": getattr(feature_map, "splits", {}),
        },
    )


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _check_resume_config(run_dir: Path, cfg: Config) -> None:
    saved = _flatten(config_to_dict(load_config(run_dir / CONFIG_FILE, check_names=False)))
    now = _flatten(config_to_dict(cfg))
    diff = sorted(
        k for k in set(saved) | set(now)
        if saved.get(k) != now.get(k) and k not in _RESUME_FREE
        and not k.startswith("report.")  # the report section does not change what trains
    )  # fmt: skip
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in diff[:5])
        raise ConfigError(
            f"{run_dir}: cannot resume with a different config ({shown}); "
            "resume with the same config or train into a new --out"
        )


def _write_history(run_dir: Path, history: list[dict[str, Any]]) -> None:
    write_text_atomic(run_dir / METRICS_FILE, "".join(json.dumps(h) + "\n" for h in history))


def read_result(run_dir: str | Path) -> TrainResult:
    """The :class:`TrainResult` of a finished run (from ``result.json``; no model)."""
    path = Path(run_dir) / RESULT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CtrcalError(f"{path}: the run has not finished (no result.json)") from None
    data["run_dir"] = Path(run_dir)
    return TrainResult(**data)


def _norm_key(spec: NormSpec) -> tuple[str, tuple]:
    from ctrcal.layers.registry import normalize_name

    name = normalize_name(spec.name)
    name = "none" if name in ("none", "identity") else name
    return name, tuple(sorted(spec.kwargs.items()))


def _finetune_model(cfg: Config, feature_map: Any) -> MaskNet:
    """A model for ``cfg`` initialised from ``cfg.train.finetune_from``'s best weights.

    The source run's model is loaded, its norms at the ``emb_norm`` and ``net_norm`` positions
    are swapped with :func:`~ctrcal.layers.registry.replace_norms` for this config's (weights
    and biases carried over), and the result is loaded into a model built from ``cfg``, which
    must otherwise have the same architecture.
    """
    from ctrcal.layers.registry import replace_norms

    src_dir = Path(cfg.train.finetune_from)  # type: ignore[arg-type]
    src_model, src_cfg, src_fm = load_run(src_dir)
    if list(src_fm.vocab_sizes) != list(feature_map.vocab_sizes) or list(
        src_fm.numeric_fields
    ) != list(feature_map.numeric_fields):
        raise ConfigError(
            f"train.finetune_from: {src_dir} was trained on data with another feature map "
            "(vocabularies or numeric fields differ)"
        )
    positions = [("net_norm", src_model.blocks, [b.norm for b in src_model.blocks])]
    if src_model.emb_norm is not None:
        positions.append(("emb_norm", src_model.emb_norm, list(src_model.emb_norm.norms)))
    elif not cfg.model.emb_norm.is_none:
        raise ConfigError(
            f"train.finetune_from: {src_dir} has no emb_norm; fine-tuning can swap a norm but "
            "not add one (set model.emb_norm: none)"
        )
    for key, container, current in positions:
        old: NormSpec = getattr(src_cfg.model, key)
        new: NormSpec = getattr(cfg.model, key)
        if _norm_key(old) == _norm_key(new):
            continue
        if old.is_none:
            raise ConfigError(
                f"train.finetune_from: {src_dir} has no {key}; fine-tuning can swap a norm but "
                f"not add one (set model.{key}: none)"
            )
        replace_norms(container, new, target=tuple({type(m) for m in current}))
    model = build_model(cfg.model, feature_map)
    try:
        model.load_state_dict(src_model.state_dict(), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"train.finetune_from: {src_dir}'s architecture differs from model: ... beyond "
            f"the norms ({first})"
        ) from None
    return model


# ---------------------------------------------------------------------------------------------
# The loop


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    resume: bool = False,
) -> TrainResult:
    """Train ``cfg.model`` on a prepared directory; write and return the run's outcome.

    Args:
        cfg: a validated :class:`~ctrcal.config.Config`.
        data_dir: a prepared directory (``feature_map.json``, ``train/``, ``valid/``,
            optionally ``test/``).
        run_dir: where the run's files go (created).
        resume: continue an interrupted run in ``run_dir`` from ``checkpoints/last.pt``
            (a finished run is returned as it is). Without it, a ``run_dir`` that already
            holds a run is an error.

    Raises:
        CtrcalError: an existing run without ``resume``, a config that differs from the
            run being resumed, unreadable data, or a diverged loss.
    """
    tcfg = cfg.train
    data_dir, run_dir = Path(data_dir), Path(run_dir)
    has_run = (run_dir / LAST).exists() or (run_dir / RESULT_FILE).exists()
    if has_run and not resume:
        raise CtrcalError(
            f"{run_dir} already holds a run; pass --resume (resume=True) to continue it or "
            "choose another output directory"
        )
    if resume and has_run:
        _check_resume_config(run_dir, cfg)
        if (run_dir / RESULT_FILE).exists():
            result = read_result(run_dir)
            result.model = load_run(run_dir)[0]
            return result
    if tcfg.epochs < 1 or tcfg.batch_size < 1 or tcfg.eval_batch_size < 1:
        raise ConfigError("train: epochs, batch_size and eval_batch_size must be >= 1")
    if tcfg.patience < 1:
        raise ConfigError(f"train.patience: must be >= 1, got {tcfg.patience}")
    threads = torch.get_num_threads()
    if tcfg.num_threads > 0:
        torch.set_num_threads(tcfg.num_threads)
    # the oneDNN switch is for eager CPU runs; compiled graphs pick their own GEMM lowering
    eager_cpu = resolve_device(tcfg.device).type == "cpu" and not tcfg.compile
    try:
        with cpu_matmul(tcfg.cpu_matmul if eager_cpu else "default"):
            return _train(cfg, data_dir, run_dir, resume)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: Config, data_dir: Path, run_dir: Path, resume: bool) -> TrainResult:
    device = resolve_device(cfg.train.device)
    dctx = dist_util.init_distributed(device)  # a single-process context without torchrun
    try:
        device = dist_util.process_device(dctx, device)
        return _train_in_context(cfg, data_dir, run_dir, resume, device, dctx)
    finally:
        dist_util.shutdown(dctx)


def _train_in_context(
    cfg: Config,
    data_dir: Path,
    run_dir: Path,
    resume: bool,
    device: torch.device,
    dctx: dist_util.DistContext,
) -> TrainResult:
    from ctrcal.data.features import FeatureMap

    tcfg = cfg.train
    world, main = dctx.world_size, dctx.is_main
    feature_map = FeatureMap.load(data_dir)
    mode = _data_mode(tcfg.data_mode, device, feature_map)
    if dctx.is_distributed and mode == "stream":
        raise ConfigError(
            "train.data_mode: 'stream' does not support multi-process training yet; "
            "use 'memory' or 'device' under torchrun"
        )
    if tcfg.batch_size % world:
        raise ConfigError(
            f"train.batch_size: {tcfg.batch_size} rows cannot be split evenly over "
            f"{world} processes (train.batch_size is the global batch)"
        )
    train_data = _open_split(data_dir, "train", mode, device)
    valid_data = _open_split(data_dir, "valid", mode, device)
    if len(train_data) == 0 or len(valid_data) == 0:
        raise DataError(f"{data_dir}: the train and valid splits must not be empty")
    _check_ids(train_data, feature_map, f"{data_dir}/train")
    _check_ids(valid_data, feature_map, f"{data_dir}/valid")
    if dctx.is_distributed:
        # every rank takes an equal disjoint share of each epoch's order and evaluates a
        # contiguous block of the validation rows; predictions are gathered for exact metrics
        train_data = dist_util.RankShard(train_data, dctx)
        valid_all = valid_data.all()
        start, stop = dist_util.eval_block(len(valid_all), dctx)
        valid_data = Batch(
            valid_all.categorical[start:stop], valid_all.numeric[start:stop],
            valid_all.label[start:stop],
        )  # fmt: skip

    seed_everything(tcfg.seed)
    resuming = resume and (run_dir / LAST).exists()
    if tcfg.finetune_from and not resuming:
        model = _finetune_model(cfg, feature_map)
    else:
        model = build_model(cfg.model, feature_map)
    model.to(device)
    optimizer = make_optimizer(model, tcfg)

    history: list[dict[str, Any]] = []
    start_epoch, bad_epochs = 0, 0
    best_value, best_epoch, best_metrics = -math.inf, 0, {}
    best_state: dict[str, torch.Tensor] | None = None
    if resuming:
        last = load_checkpoint(run_dir / LAST)
        model.load_state_dict(last["model"])
        optimizer.load_state_dict(last["optimizer"])
        start_epoch, bad_epochs = int(last["epoch"]), int(last["bad_epochs"])
        history = list(last["history"])
        if (run_dir / BEST).exists():
            best = load_checkpoint(run_dir / BEST)
            best_state = best["model"]
            best_value, best_epoch = float(best["monitor"]), int(best["epoch"])
            best_metrics = dict(best["metrics"])
        restore_rng_state(last["rng"])
        stopped = bool(last.get("stopped", False))
    else:
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            _write_run_files(run_dir, cfg, data_dir, feature_map)
        stopped = False

    forward: Callable[..., torch.Tensor] = model
    if dctx.is_distributed:
        from torch.nn.parallel import DistributedDataParallel

        # parameters are broadcast from rank 0 here, so every rank starts from one model
        forward = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if tcfg.compile:
        forward = torch.compile(forward)  # type: ignore[assignment]
    amp = _amp_dtype(tcfg.precision, device)
    # torch.compile traces the dense lookup, and DDP all-reduces dense gradients only:
    # sparse table gradients are for single-process eager mode
    ctx = make_step_context(model, optimizer, tcfg, device, amp, forward,
                            sparse_tables=not (tcfg.compile or dctx.is_distributed))  # fmt: skip
    speeds: list[float] = []
    epoch = start_epoch
    while epoch < tcfg.epochs and not stopped:
        lr = optimizer.param_groups[0]["lr"]
        if dctx.is_distributed:
            # MC-LayerNorm subsets and dropout masks must differ across ranks, and resuming
            # must redraw the same ones: a per-(epoch, rank) seed gives both
            torch.manual_seed(epoch_seed(tcfg.seed, epoch) * 1_000_003 + dctx.rank)
        train_loss, rows_per_s, seconds = _train_epoch(
            ctx, train_data, tcfg, epoch, device, tcfg.batch_size // world, dctx
        )
        speeds.append(rows_per_s)
        logits, labels = predict_with_labels(model, valid_data, tcfg.eval_batch_size, device)
        logits = dist_util.gather_rows(logits.to(device), dctx).cpu()
        labels = dist_util.gather_rows(labels.to(device), dctx).cpu()
        auc, logloss = _valid_metrics(logits, labels)
        value = _monitor_value(tcfg.monitor, auc, logloss)
        improved = value > best_value
        if improved:
            best_value, best_epoch, bad_epochs = value, epoch + 1, 0
            best_metrics = {"auc": auc, "logloss": logloss, "monitor": value}
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if main:
                save_checkpoint(
                    run_dir / BEST,
                    {
                        "model": best_state,
                        "epoch": best_epoch,
                        "monitor": value,
                        "metrics": best_metrics,
                    },  # fmt: skip
                )
        else:
            bad_epochs += 1
            for group in optimizer.param_groups:
                group["lr"] = max(group["lr"] * tcfg.lr_factor, tcfg.min_lr)
        stopped = bad_epochs >= tcfg.patience
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                "valid_auc": auc,
                "valid_logloss": logloss,
                "monitor": value if math.isfinite(value) else None,
                "lr": lr,
                "improved": improved,
                "best_epoch": best_epoch,
                "rows_per_s": rows_per_s,
                "seconds": seconds,
            }
        )
        epoch += 1
        if not main:
            continue
        save_checkpoint(
            run_dir / LAST,
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "bad_epochs": bad_epochs,
                "stopped": stopped,
                "history": history,
                "rng": capture_rng_state(),
            },
        )
        _write_history(run_dir, history)

    for module in model.modules():  # hand back a plain model: dense lookups, no grads held
        if isinstance(module, nn.Embedding):
            module.sparse = False
    model.zero_grad(set_to_none=True)
    if best_state is not None:
        model.load_state_dict(best_state)
    if not main:  # rank 0 alone scores the test split and writes the result
        dist_util.barrier(dctx)
        return TrainResult(
            run_dir=run_dir, best_epoch=best_epoch, epochs_completed=epoch,
            stopped_early=stopped and epoch < tcfg.epochs, valid=best_metrics, test=None,
            train_rows_per_s=float(np.mean(speeds)) if speeds else 0.0, history=history,
            oracle=None, model=model,
        )  # fmt: skip
    test = None
    if (data_dir / "test").is_dir():
        from ctrcal.eval.metrics import compute_all

        test_data = _open_split(data_dir, "test", mode, device)
        if len(test_data):
            probs, labels = predict_probs(model, test_data, tcfg.eval_batch_size, device)
            test = compute_all(probs, labels)
    result = TrainResult(
        run_dir=run_dir,
        best_epoch=best_epoch,
        epochs_completed=epoch,
        stopped_early=stopped and epoch < tcfg.epochs,
        valid=best_metrics,
        test=test,
        train_rows_per_s=float(np.mean(speeds)) if speeds else 0.0,
        history=history,
        oracle=(getattr(feature_map, "extra", None) or {}).get("oracle", {}).get("test"),
        model=model,
    )
    write_json_atomic(run_dir / RESULT_FILE, result.to_json())
    dist_util.barrier(dctx)
    return result


def _valid_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    from ctrcal.eval.metrics import auc, logloss

    probs = torch.sigmoid(logits)
    return float(auc(probs, labels)), float(logloss(probs, labels))


def _train_epoch(
    ctx: _StepContext,
    data: Any,
    tcfg: Any,
    epoch: int,
    device: torch.device,
    batch_size: int | None = None,
    dctx: dist_util.DistContext | None = None,
) -> tuple[float, float, float]:
    """One pass over the training split; returns (mean loss, rows/s, seconds).

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
    start = time.perf_counter()
    try:
        for batch in data.batches(batch_size, shuffle=True, seed=epoch_seed(tcfg.seed, epoch)):
            batch = batch.to(device, non_blocking=True)
            loss = _train_step(ctx, batch)
            n = len(batch)
            loss_sum += loss.to(acc_dtype) * n
            rows += n
            steps += 1
            bar.update(n)
            if tcfg.progress and steps % PROGRESS_EVERY == 0:
                bar.set_postfix(loss=f"{float(loss_sum) / rows:.4f}", refresh=False)
        if dctx.is_distributed:
            totals = torch.stack([loss_sum, torch.tensor(float(rows), dtype=acc_dtype,
                                                         device=device)])  # fmt: skip
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


# ---------------------------------------------------------------------------------------------
# Reading runs back


def load_run(run_dir: str | Path) -> tuple[MaskNet, Config, Any]:
    """The best model of a run (CPU, eval mode), its config and its feature map.

    Works on finished and on interrupted runs (whatever ``checkpoints/best.pt`` holds).
    """
    from ctrcal.data.features import FeatureMap

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise CtrcalError(f"{run_dir}: not a run directory (no {CONFIG_FILE})")
    cfg = load_config(run_dir / CONFIG_FILE)
    feature_map = FeatureMap.load(run_dir / FEATURE_MAP_FILE)
    if not (run_dir / BEST).exists():
        raise CtrcalError(f"{run_dir}: no trained weights yet ({BEST} is missing)")
    model = build_model(cfg.model, feature_map)
    state = load_checkpoint(run_dir / BEST)
    model.load_state_dict(state["model"])
    model.eval()
    return model, cfg, feature_map


def run_data_dir(run_dir: str | Path) -> Path:
    """The prepared directory a run was trained on (from ``data.json``)."""
    path = Path(run_dir) / DATA_FILE
    try:
        return Path(json.loads(path.read_text())["data_dir"])
    except FileNotFoundError:
        raise CtrcalError(f"{path}: missing; pass the data directory explicitly") from None


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    data_dir: str | Path | None = None,
    mc_samples: int = 0,
    device: str = "auto",
    batch_size: int | None = None,
) -> dict[str, float]:
    """All metrics (:func:`ctrcal.eval.metrics.compute_all`) of a run's best model on a split.

    Args:
        run_dir: a run directory written by :func:`train`.
        split: ``train``, ``valid`` or ``test``.
        data_dir: the prepared directory (default: the one the run was trained on).
        mc_samples: > 0 averages that many MC-LayerNorm sampling passes per row.
        device: ``auto``, ``cpu``, ``cuda``, ...
        batch_size: rows per pass (default: the run's ``train.eval_batch_size``).
    """
    from ctrcal.data.features import FeatureMap
    from ctrcal.eval.metrics import compute_all

    model, cfg, feature_map = load_run(run_dir)
    data_dir = Path(data_dir) if data_dir is not None else run_data_dir(run_dir)
    current = FeatureMap.load(data_dir)
    if list(current.vocab_sizes) != list(feature_map.vocab_sizes):
        raise DataError(f"{data_dir}: its feature map differs from the one {run_dir} used")
    dev = resolve_device(device)
    model.to(dev)
    data = _open_split(data_dir, split, _data_mode(cfg.train.data_mode, dev, feature_map), dev)
    probs, labels = predict_probs(
        model, data, batch_size or cfg.train.eval_batch_size, dev, mc_samples=mc_samples
    )
    return compute_all(probs, labels)
