"""The shift-robustness report: variants × training seeds × noise seeds × shift intensities.

The protocol of the MC-LayerNorm paper's Criteo experiment (its Figure 3), on any prepared
data directory:

1. train every variant that owns its runs (``from_variant`` unset) once per training seed
   ``train.seed + k`` (k < ``report.seeds``), reusing finished runs under
   ``OUT/runs/<variant>/seed<k>`` (runs trained with ``ctrcal train`` elsewhere can be placed
   there: a run is reused when its config and data match); LayerNorm and MC-LayerNorm runs of
   the same k share the seed, so they are compared *paired by seed*. With ``report.workers``
   / ``report.devices`` (``--workers N``, ``--devices cuda:0,cuda:1|auto``) the pending runs
   train in parallel: one spawned worker process per device, one run at a time each (on CPU,
   N processes with ``cores // N`` threads each), see :mod:`ctrcal.eval.sweep`; the runs, and
   so every number of the report, are those of a sequential sweep (on CPU bit-identical when
   ``train.num_threads`` is set, else equal up to the rounding of multi-threaded sums);
2. for each variant (a variant with ``from_variant`` reuses that variant's runs and changes only
   how it predicts: MC integration with ``mc_samples`` passes, temperature or Platt scaling fit
   on clean validation predictions), each seed, each noise seed and each intensity, evaluate
   the test split with :class:`~ctrcal.eval.shift.GaussianShift` applied batch by batch
   (intensity 0 is evaluated once per seed: there is no noise to re-draw);
3. write ``results.csv`` (long: variant, seed, noise_seed, intensity, metric, value),
   ``summary.json``, ``report.md`` (tables of mean ± standard error over seeds, AUC retained vs
   clean, paired differences vs the baseline with a t-test, the verdict, metric definitions)
   and PNG figures.

The statistics (mean ± SE over seeds, paired t-tests with Holm adjustment, the verdict) live in
:mod:`ctrcal.eval.stats`, the files in :mod:`ctrcal.eval.render`, the figures in
:mod:`ctrcal.eval.figures`; this module runs the protocol.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.config import Config, VariantConfig, config_to_dict
from ctrcal.errors import ConfigError, DataError
from ctrcal.eval import metrics as M
from ctrcal.eval.render import ReportPaths, _fmt_seconds, finish_message, write_report
from ctrcal.eval.stats import RESULT_COLUMNS
from ctrcal.eval.sweep import (
    TrainJob,
    check_workers,
    ensure_run,
    run_state,
    train_in_processes,
    training_threads,
    worker_slots,
)

__all__ = [
    "ReportPaths",
    "VariantPlan",
    "ensure_run",
    "finish_message",
    "plan_variants",
    "run_shift_report",
    "run_state",
    "train_variants",
    "variant_train_config",
    "write_report",
]

# ---------------------------------------------------------------------------------------------
# Plan


@dataclass(frozen=True)
class VariantPlan:
    """A variant resolved against the config: whose runs it uses and how it predicts."""

    name: str
    run_variant: str  # the variant whose trained runs this one evaluates
    config: VariantConfig
    mc_samples: int
    calibration: str | None  # None | "temperature" | "platt"

    @property
    def trains(self) -> bool:
        return self.run_variant == self.name


def plan_variants(cfg: Config, source: str = "config") -> list[VariantPlan]:
    """Resolve ``cfg.report.variants`` (``from_variant`` chains, calibration) or raise.

    Raises:
        ConfigError: naming ``report.variants[i]`` and what is wrong.
    """
    variants = cfg.report.variants
    if not variants:
        raise ConfigError(f"{source}: report.variants: at least one variant is needed")
    by_name = {v.name: v for v in variants}
    if len(by_name) != len(variants):
        names = [v.name for v in variants]
        raise ConfigError(f"{source}: report.variants: variant names must be unique, got {names}")
    plans = []
    for i, v in enumerate(variants):
        key = f"{source}: report.variants[{i}]"
        if not v.name or "/" in v.name or v.name.startswith("."):
            raise ConfigError(f"{key}.name: {v.name!r} is not usable as a directory name")
        if v.mc_samples < 0 or v.mc_samples == 1:
            raise ConfigError(f"{key}.mc_samples: expected 0 (off) or >= 2, got {v.mc_samples}")
        if v.temperature_scaling and v.platt_scaling:
            raise ConfigError(f"{key}: choose temperature_scaling or platt_scaling, not both")
        root, seen = v, {v.name}
        while root.from_variant is not None:
            if root.from_variant not in by_name:
                raise ConfigError(
                    f"{key}.from_variant: unknown variant {root.from_variant!r} "
                    f"(valid: {', '.join(by_name)})"
                )
            root = by_name[root.from_variant]
            if root.name in seen:
                raise ConfigError(f"{key}.from_variant: variants refer to each other in a cycle")
            seen.add(root.name)
        calibration = (
            "temperature" if v.temperature_scaling else "platt" if v.platt_scaling else None
        )
        plans.append(VariantPlan(v.name, root.name, v, v.mc_samples, calibration))
    baseline = cfg.report.baseline
    if baseline is not None and baseline not in by_name:
        raise ConfigError(
            f"{source}: report.baseline: unknown variant {baseline!r} (valid: {', '.join(by_name)})"
        )
    r = cfg.report
    if r.seeds < 1:
        raise ConfigError(f"{source}: report.seeds: expected >= 1, got {r.seeds}")
    if r.noise_seeds < 1:
        raise ConfigError(f"{source}: report.noise_seeds: expected >= 1, got {r.noise_seeds}")
    if not r.intensities or any((not math.isfinite(s)) or s < 0 for s in r.intensities):
        raise ConfigError(
            f"{source}: report.intensities: expected non-negative numbers, got {r.intensities}"
        )
    if not 0.0 < r.mix_fraction <= 1.0:
        raise ConfigError(f"{source}: report.mix_fraction: expected (0, 1], got {r.mix_fraction}")
    if not 0.0 < r.alpha < 1.0:
        raise ConfigError(f"{source}: report.alpha: expected (0, 1), got {r.alpha}")
    if r.ece_bins < 1:
        raise ConfigError(f"{source}: report.ece_bins: expected >= 1, got {r.ece_bins}")
    check_workers(cfg, source)
    return plans


def variant_train_config(cfg: Config, plan: VariantPlan, k: int) -> Config:
    """The training config of variant ``plan`` for seed index ``k``."""
    out = copy.deepcopy(cfg)
    out.model = dataclasses.replace(out.model, net_norm=plan.config.net_norm)
    if plan.config.emb_norm is not None:
        out.model = dataclasses.replace(out.model, emb_norm=plan.config.emb_norm)
    out.train = dataclasses.replace(out.train, seed=cfg.train.seed + k)
    return out


# ---------------------------------------------------------------------------------------------
# Running the protocol


# ---------------------------------------------------------------------------------------------
# Training and prediction


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class _Prediction:
    probs: np.ndarray  # [n] float64
    logits: np.ndarray | None  # [n] float64 (None for MC integration)
    std: np.ndarray | None  # [n] per-row predictive std (MC integration)
    rows: np.ndarray  # [n] bool, True = shifted


def _predict(model, data, *, batch_size, device, shift, mc_samples) -> _Prediction:
    """Predictions on a split, the shift applied per batch where the batch lives."""
    import torch

    from ctrcal.train.predict import iter_batches, predict_logits

    masks: list[torch.Tensor] = []

    def transform(numeric: torch.Tensor) -> torch.Tensor:
        out, rows = shift.apply(numeric)
        masks.append(rows.cpu())
        return out

    hook = transform if shift is not None else None
    if mc_samples > 0:
        from ctrcal.layers.mc_layernorm import mc_predict

        means, stds = [], []
        with torch.no_grad():
            for batch in iter_batches(data, batch_size):
                numeric = batch.numeric if hook is None else hook(batch.numeric)
                mean, std = mc_predict(
                    model,
                    batch.categorical.to(device),
                    numeric.to(device),
                    n_samples=mc_samples,
                    max_rows=4 * batch_size,
                )
                means.append(mean.double().cpu())
                stds.append(std.double().cpu())
        probs = torch.cat(means).numpy()
        std = torch.cat(stds).numpy()
        logits = None
    else:
        z = predict_logits(model, data, batch_size, device, transform=hook)
        logits = z.detach().double().cpu().numpy()
        probs = 1.0 / (1.0 + np.exp(-logits))
        std = None
    n = probs.shape[0]
    rows = torch.cat(masks).numpy() if masks else np.ones(n, dtype=bool)
    if rows.shape[0] != n:
        raise RuntimeError(f"shift saw {rows.shape[0]} rows but {n} predictions came back")
    return _Prediction(probs, logits, std, rows)


def _labels(data, batch_size: int) -> np.ndarray:
    import torch

    from ctrcal.train.predict import iter_batches

    parts = [b.label.detach().double().cpu() for b in iter_batches(data, batch_size)]
    return torch.cat(parts).numpy()


def _calibrated(pred: _Prediction, scaler) -> np.ndarray:
    from ctrcal.eval.calibration import logit

    z = pred.logits if pred.logits is not None else logit(pred.probs)
    return np.asarray(scaler.predict_proba(z), dtype=np.float64)


def _data_mode(cfg: Config, device) -> str:
    mode = cfg.train.data_mode
    if mode == "auto":
        return "device" if getattr(device, "type", "cpu") == "cuda" else "memory"
    return mode


def _describe_variant(plan: VariantPlan) -> str:
    spec = plan.config.net_norm
    norm = spec.name + (
        "(" + ", ".join(f"{k}={v}" for k, v in spec.kwargs.items()) + ")" if spec.kwargs else ""
    )
    bits = [norm if plan.trains else f"runs of {plan.run_variant}"]
    if plan.mc_samples:
        bits.append(f"MC integration, {plan.mc_samples} passes")
    elif plan.trains:
        bits.append("one-shot")
    if plan.calibration:
        bits.append(f"{plan.calibration} scaling on clean validation")
    return f"{plan.name} ({'; '.join(bits)})"


@dataclass
class _Split:
    """A split loaded once for the whole grid, with its labels on the host."""

    data: Any
    labels: np.ndarray


@dataclass
class _Grid:
    """The evaluation grid and what it has produced so far."""

    cfg: Config
    test: _Split
    valid: _Split | None
    std: np.ndarray  # [Fn] train-split stds of the numerics (model-input space)
    device: Any
    batch_size: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    # variant -> intensity -> summed reliability bins (pooled over seeds)
    bins: dict[str, dict[float, dict[str, np.ndarray]]] = field(default_factory=dict)

    @property
    def shifted_levels(self) -> list[float]:
        return [float(s) for s in self.cfg.report.intensities if s > 0]

    @property
    def has_clean(self) -> bool:
        return any(s == 0 for s in self.cfg.report.intensities)

    def points(self) -> list[tuple[int, float]]:
        """(noise seed, intensity) pairs evaluated per variant and seed; clean only once."""
        r = self.cfg.report
        clean = [(0, 0.0)] if self.has_clean else []
        return clean + [(ns, s) for ns in range(r.noise_seeds) for s in self.shifted_levels]

    def predict(self, model, split: _Split, shift, mc_samples: int) -> _Prediction:
        return _predict(
            model,
            split.data,
            batch_size=self.batch_size,
            device=self.device,
            shift=shift,
            mc_samples=mc_samples,
        )

    def record(self, variant: str, k: int, noise_seed: int, s: float, values: dict) -> None:
        self.rows.extend(
            {
                "variant": variant,
                "seed": k,
                "noise_seed": noise_seed,
                "intensity": s,
                "metric": metric,
                "value": float(value),
            }
            for metric, value in values.items()
        )

    def accumulate(self, variant: str, s: float, probs: np.ndarray, y: np.ndarray) -> None:
        curve = M.reliability_curve(probs, y, n_bins=self.cfg.report.ece_bins)
        zeros = np.zeros_like(curve.counts)
        acc = self.bins.setdefault(variant, {}).setdefault(
            s, {"edges": curve.edges, "counts": zeros, "sum_p": zeros.copy(), "sum_y": zeros.copy()}
        )
        acc["counts"] += curve.counts
        acc["sum_p"] += np.nan_to_num(curve.mean_prob) * curve.counts
        acc["sum_y"] += np.nan_to_num(curve.frac_pos) * curve.counts

    def curves(self) -> dict[str, dict[float, dict[str, np.ndarray]]]:
        """Pooled reliability curves: {variant: {intensity: edges/counts/mean_prob/frac_pos}}."""
        out: dict[str, dict[float, dict[str, np.ndarray]]] = {}
        for variant, by_s in self.bins.items():
            for s, a in by_s.items():
                n = a["counts"]
                with np.errstate(invalid="ignore", divide="ignore"):
                    out.setdefault(variant, {})[s] = {
                        "edges": a["edges"],
                        "counts": n,
                        "mean_prob": np.where(n > 0, a["sum_p"] / n, np.nan),
                        "frac_pos": np.where(n > 0, a["sum_y"] / n, np.nan),
                    }
        return out

    def fit_calibration(self, model, plan: VariantPlan, k: int):
        """Temperature or Platt scaling fitted on the clean validation split (or None)."""
        from ctrcal.eval.calibration import PlattScaling, TemperatureScaling, logit
        from ctrcal.utils import seed_everything

        if plan.calibration is None:
            return None
        if self.valid is None:  # pragma: no cover - run_shift_report loads it when needed
            raise RuntimeError("calibration needs the validation split")
        seed_everything(7919 * (k + 1))
        pred = self.predict(model, self.valid, None, plan.mc_samples)
        z = pred.logits if pred.logits is not None else logit(pred.probs)
        scaler = TemperatureScaling() if plan.calibration == "temperature" else PlattScaling()
        return scaler.fit(z, self.valid.labels)

    def evaluate(self, model, plan: VariantPlan, k: int, bar) -> None:
        """Every (noise seed, intensity) of one variant and training seed."""
        from ctrcal.eval.shift import GaussianShift
        from ctrcal.utils import seed_everything

        r = self.cfg.report
        scaler = self.fit_calibration(model, plan, k)
        labels = self.test.labels
        max_s = max(float(s) for s in r.intensities)
        clean_std: np.ndarray | None = None
        for noise_seed, s in self.points():
            # MC sampling draws from the global RNG: seed it per evaluation for reproducibility
            seed_everything(1_000_003 * (k + 1) + 1009 * noise_seed + int(s * 1e6))
            shift = None
            if s > 0:
                shift = GaussianShift(self.std, s, seed=noise_seed, mix_fraction=r.mix_fraction)
                if plan.mc_samples and r.mix_fraction >= 1.0 and clean_std is None:
                    # the AUROC of the std pools shifted rows with the same rows clean
                    clean_std = self.predict(model, self.test, None, plan.mc_samples).std
            pred = self.predict(model, self.test, shift, plan.mc_samples)
            probs = _calibrated(pred, scaler) if scaler is not None else pred.probs
            sel = pred.rows if s > 0 else np.ones_like(pred.rows)
            values = M.compute_all(probs[sel], labels[sel], n_bins=r.ece_bins)
            if pred.std is not None:
                values["pred_std"] = float(pred.std[sel].mean())
                if s == 0:
                    clean_std = pred.std
                elif r.mix_fraction < 1.0:
                    values["std_auroc"] = M.auc(pred.std, pred.rows.astype(np.float64))
                elif clean_std is not None:
                    both = np.concatenate([clean_std, pred.std])
                    which = np.concatenate([np.zeros(clean_std.size), np.ones(pred.std.size)])
                    values["std_auroc"] = M.auc(both, which)
            self.record(plan.name, k, noise_seed, s, values)
            if noise_seed == 0 and s in (0.0, max_s):
                self.accumulate(plan.name, s, probs[sel], labels[sel])
            bar.update(1)


def _oracle(data_dir: Path, split: str) -> dict[str, float] | None:
    """The true-probability AUC/logloss of synthetic data (None for real data)."""
    try:
        fm = json.loads((data_dir / "feature_map.json").read_text())
    except (OSError, ValueError):
        return None
    oracle = fm.get("oracle") or {}
    return oracle.get(split) if isinstance(oracle, dict) else None


def _open_split(data_dir: Path, split: str, cfg: Config, device, batch_size: int) -> _Split:
    from ctrcal.data.loader import ParquetCTRData

    mode = _data_mode(cfg, device)
    data = ParquetCTRData(data_dir, split, mode=mode, device=device if mode == "device" else None)
    return _Split(data, _labels(data, batch_size))


def train_variants(
    cfg: Config,
    plans: list[VariantPlan],
    data_dir: Path,
    runs_dir: Path,
    log: Callable[[str], None] = _log,
    *,
    slots: list[str] | None = None,
    progress: bool = False,
) -> dict[str, int]:
    """Train (or reuse / resume) every run the plans need; returns counts by outcome.

    Args:
        slots: one device per worker (:func:`~ctrcal.eval.sweep.worker_slots`); with two or
            more, the pending runs train in parallel processes, else one after another here
            (on ``slots[0]`` when given, else ``train.device``).
        progress: a progress bar over the runs trained in parallel.
    """
    outcomes: dict[str, int] = {}
    jobs = [
        TrainJob(plan.name, k, variant_train_config(cfg, plan, k), data_dir, run_dir)
        for plan in plans
        if plan.trains
        for k in range(cfg.report.seeds)
        for run_dir in [runs_dir / plan.name / f"seed{k}"]
    ]
    if slots is not None and len(slots) > 1:
        pending = []
        # seed-major: a sweep stopped half-way leaves complete (paired) seeds behind
        for job in sorted(jobs, key=lambda j: j.k):
            state = run_state(job.cfg, data_dir, job.run_dir)
            if state == "finished":
                outcomes["reused"] = outcomes.get("reused", 0) + 1
                continue
            if state == "stale":
                log(f"{job.run_dir}: trained with another config or data; training it again")
            pending.append(job)
        if pending:
            log(
                f"training {len(pending)} run(s) in {min(len(slots), len(pending))} parallel "
                f"process(es) on {', '.join(slots)}, {training_threads(cfg, slots)} thread(s) "
                f"per run; reused {outcomes.get('reused', 0)}"
            )
            done = train_in_processes(pending, slots, log=log, progress=progress)
            for status, n in done.items():
                outcomes[status] = outcomes.get(status, 0) + n
        return outcomes
    for job in jobs:
        vcfg = job.cfg
        if slots and vcfg.train.device != slots[0]:
            vcfg = dataclasses.replace(vcfg, train=dataclasses.replace(vcfg.train, device=slots[0]))
        log(f"[{job.name} (train.seed={vcfg.train.seed})] {job.run_dir}")
        status = ensure_run(vcfg, data_dir, job.run_dir, log)
        log(f"[{job.name}] {status}")
        outcomes[status] = outcomes.get(status, 0) + 1
    return outcomes


def run_shift_report(
    cfg: Config,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    *,
    seeds: int | None = None,
    workers: int | None = None,
    devices: str | list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = _log,
    source: str = "config",
) -> ReportPaths:
    """Train what is missing, evaluate the grid and write the report.

    Args:
        cfg: the whole config (``report`` section drives the protocol).
        out_dir: report directory; runs go to ``out_dir/runs/<variant>/seed<k>``.
        data_dir: prepared data; default ``cfg.data.prepared_dir`` or, with neither, data
            prepared from ``cfg.data`` into ``out_dir/data``.
        seeds: override ``cfg.report.seeds``.
        workers: override ``cfg.report.workers`` (runs training at once, each in its own
            process; see :mod:`ctrcal.eval.sweep`).
        devices: override ``cfg.report.devices`` (``"auto"``, ``"cuda:0,cuda:1"`` or a list).
        progress: show progress bars over the parallel training runs and the evaluation grid.
        log: where progress lines go (stderr by default).
        source: the config's file name, for error messages.

    Returns:
        The paths written (report.md, results.csv, summary.json, figures).
    """
    from tqdm.auto import tqdm

    from ctrcal.train.trainer import load_run
    from ctrcal.utils import resolve_device

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    if seeds is not None or workers is not None or devices is not None:
        cfg = copy.deepcopy(cfg)
        if seeds is not None:
            cfg.report.seeds = int(seeds)
        if workers is not None:
            cfg.report.workers = int(workers)
        if devices is not None:
            cfg.report.devices = devices
    plans = plan_variants(cfg, source)
    slots = worker_slots(cfg, source)  # before any work: a GPU that is not there fails now
    r = cfg.report
    if data_dir is None and cfg.data.prepared_dir:
        data_dir = Path(cfg.data.prepared_dir)
    if data_dir is None:
        from ctrcal.data.prepare import prepare_from_config

        data_dir = prepare_from_config(cfg, out_dir / "data")
    data_dir = Path(data_dir)
    if not (data_dir / "feature_map.json").is_file():
        raise DataError(
            f"{data_dir}: not a prepared data directory (no feature_map.json); "
            "prepare it with 'ctrcal prepare' or leave out --data"
        )
    runs_dir = out_dir / "runs"
    if r.split == "valid" and any(p.calibration for p in plans):
        log(
            "note: report.split is 'valid', the split that temperature/Platt scaling is fitted "
            "on; their clean numbers are in-sample"
        )

    t_train = time.perf_counter()
    outcomes = train_variants(cfg, plans, data_dir, runs_dir, log, slots=slots, progress=progress)
    train_s = time.perf_counter() - t_train

    t_eval = time.perf_counter()
    # explicit report.devices: evaluate on the first of them, as a sequential run would train
    device = resolve_device(slots[0] if r.devices else cfg.train.device)
    bs = cfg.train.eval_batch_size
    test = _open_split(data_dir, r.split, cfg, device, bs)
    valid = (
        _open_split(data_dir, "valid", cfg, device, bs)
        if any(p.calibration for p in plans)
        else None
    )
    grid = _Grid(cfg, test, valid, np.asarray(test.data.feature_map.numeric_std), device, bs)
    total = len(plans) * r.seeds * len(grid.points())
    bar = tqdm(total=total, desc="shift report", unit="eval", disable=not progress, file=sys.stderr)
    by_run: dict[str, list[VariantPlan]] = {}
    for plan in plans:
        by_run.setdefault(plan.run_variant, []).append(plan)
    for run_variant, group in by_run.items():
        for k in range(r.seeds):
            model = load_run(runs_dir / run_variant / f"seed{k}")[0].to(device).eval()
            for plan in group:
                bar.set_postfix_str(f"{plan.name} seed {k}")
                grid.evaluate(model, plan, k, bar)
            del model
    bar.close()
    eval_s = time.perf_counter() - t_eval

    curves = grid.curves()
    total_s = time.perf_counter() - t_start
    device_note = str(device)
    if len(slots) > 1:
        device_note += f"; training in {len(slots)} parallel processes ({', '.join(slots)})"
    meta = {
        "split": r.split,
        "rows": int(test.labels.shape[0]),
        "mix_fraction": r.mix_fraction,
        "noise_seeds": r.noise_seeds,
        "device": device_note,
        "training": {
            "workers": slots,
            "threads_per_run": training_threads(cfg, slots),
            "runs": outcomes,
        },
        "oracle": _oracle(data_dir, r.split),
        "elapsed": f"{_fmt_seconds(total_s)} (training {_fmt_seconds(train_s)}, evaluation "
        f"{_fmt_seconds(eval_s)})",
        "variant_descriptions": [_describe_variant(p) for p in plans],
        "runs_dir": str(runs_dir),
        "data_dir": str(data_dir),
        "train_seeds": [cfg.train.seed + k for k in range(r.seeds)],
        "timing_s": {"train": train_s, "eval": eval_s, "total": total_s},
        "config": config_to_dict(cfg),
    }
    paths = write_report(
        pd.DataFrame(grid.rows, columns=RESULT_COLUMNS),
        out_dir,
        baseline=r.baseline or plans[0].name,
        alpha=r.alpha,
        meta=meta,
        reliability={p.name: curves[p.name] for p in plans if p.name in curves},
        figures=r.figures,
        variants=[p.name for p in plans],
    )
    log(f"shift report: {total} evaluations, total time {_fmt_seconds(total_s)}")
    return paths
