"""The shift-robustness report: variants × training seeds × shifts × noise seeds × intensities.

The protocol of the MC-LayerNorm paper's Criteo experiment (its Figure 3), generalised to the
shifts and baselines of the uncertainty literature, on any prepared data directory:

1. train every variant that owns its runs (``from_variant`` unset) once per training seed
   ``train.seed + k`` (k < ``report.seeds``), plus the extra member seeds of its deep
   ensembles (:meth:`~ctrcal.eval.plan.VariantPlan.member_seeds`), reusing finished runs under
   ``OUT/runs/<variant>/seed<k>`` (runs trained with ``ctrcal train`` elsewhere can be placed
   there: a run is reused when its config and data match); the variants of the same k share
   the seed, so they are compared *paired by seed*. With ``report.workers`` /
   ``report.devices`` the pending runs train in parallel (see :mod:`ctrcal.eval.sweep`);
2. for each variant (a variant with ``from_variant`` reuses that variant's runs and changes only
   how it predicts: MC integration over ``mc_samples`` passes with MC-LayerNorm sampling
   and/or dropout on (``mc_dropout``), an ensemble of ``ensemble`` runs, temperature or Platt
   scaling fit on clean validation predictions) and each seed, evaluate the clean test split
   once, then every shift of ``report.shifts`` (:mod:`ctrcal.eval.shifts`) at every intensity
   of its own grid and every noise seed. A shift's noise depends only on its seed, never on the
   variant: all variants see the same shifted rows;
3. write ``results.csv`` (long: variant, shift, seed, noise_seed, intensity, metric, value),
   ``summary.json``, ``report.md`` (tables per shift, paired differences with the family-wise
   correction and the detectable difference, the verdict, uncertainty quality, metric
   definitions) and PNG figures.

The plan (config checks) lives in :mod:`ctrcal.eval.plan`, predictions in
:mod:`ctrcal.eval.predictive`, the statistics in :mod:`ctrcal.eval.stats`, the files in
:mod:`ctrcal.eval.render`, the figures in :mod:`ctrcal.eval.figures`; this module runs the
protocol.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ctrcal.config import Config, config_to_dict
from ctrcal.errors import ConfigError, DataError
from ctrcal.eval import metrics as M
from ctrcal.eval.plan import (
    ShiftPlan,
    VariantPlan,
    check_report,
    plan_shifts,
    plan_variants,
    variant_train_config,
)
from ctrcal.eval.predictive import Prediction, predict_split
from ctrcal.eval.render import (
    REPORT_OUTPUTS,
    ReportPaths,
    _fmt_seconds,
    finish_message,
    write_report,
)
from ctrcal.eval.report_calibration import (
    ReportCalibrator,
    SplitFields,
    evaluation_metrics,
    load_split_fields,
    oracle_calibration,
)
from ctrcal.eval.stats import CLEAN, RESULT_COLUMNS
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
    "ShiftPlan",
    "VariantPlan",
    "check_report",
    "ensure_run",
    "finish_message",
    "plan_shifts",
    "plan_variants",
    "run_shift_report",
    "run_state",
    "train_variants",
    "variant_train_config",
    "write_report",
]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _labels(data, batch_size: int) -> np.ndarray:
    import torch

    from ctrcal.train.predict import iter_batches

    parts = [b.label.detach().double().cpu() for b in iter_batches(data, batch_size)]
    return torch.cat(parts).numpy()


def _calibrated(pred: Prediction, scaler, fields) -> np.ndarray:
    from ctrcal.eval.calibration import logit

    if scaler is None:
        return pred.probs
    z = pred.logits if pred.logits is not None else logit(pred.probs)
    return scaler.predict_proba(z, fields)


def _norm_text(spec) -> str:
    if spec is None:
        return "none"
    return spec.name + (
        "(" + ", ".join(f"{k}={v}" for k, v in spec.kwargs.items()) + ")" if spec.kwargs else ""
    )


def _describe_variant(plan: VariantPlan, cfg: Config) -> str:
    bits = []
    if plan.trains:
        emb = plan.config.emb_norm
        emb = emb if emb is not None else cfg.model.get("emb_norm")
        where = "MaskBlocks" if cfg.model.name == "masknet" else f"{cfg.model.name} net_norm"
        bits.append(f"{where} {_norm_text(plan.config.net_norm)}, fields {_norm_text(emb)}")
    else:
        bits.append(f"runs of {plan.run_variant}")
    if plan.ensemble:
        bits.append(f"deep ensemble of {plan.ensemble} runs")
    if plan.mc_samples:
        what = "dropout on" if plan.mc_dropout else "MC-LayerNorm sampling"
        bits.append(f"MC integration, {plan.mc_samples} passes ({what})")
    elif not plan.ensemble:
        bits.append("one-shot")
    if plan.calibration:
        bits.append(ReportCalibrator.for_variant(plan.config).describe())
    return f"{plan.name} ({'; '.join(bits)})"


def shift_seed(label: str, noise_seed: int) -> int:
    """The seed of a shift's stream: by shift label and noise seed, never by variant or model."""
    return (zlib.crc32(label.encode()) + 1_000_003 * noise_seed) % (2**31)


@dataclass
class _Split:
    """A split loaded once for the whole grid, with its labels on the host."""

    data: Any
    labels: np.ndarray
    fields: SplitFields | None = None  # clean field codes (segments of the field metrics)


@dataclass
class _Grid:
    """The evaluation grid and what it has produced so far."""

    cfg: Config
    shifts: list[ShiftPlan]
    test: _Split
    valid: _Split | None
    feature_map: Any
    device: Any
    batch_size: int
    # a natural shift (temporal): this grid's clean split *is* the shifted data, recorded
    # under the shift's label at intensity 1
    natural: ShiftPlan | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    # variant -> (shift, intensity) -> summed reliability bins (pooled over seeds)
    bins: dict[str, dict[tuple[str, float], dict[str, np.ndarray]]] = field(default_factory=dict)

    def points(self) -> list[tuple[ShiftPlan | None, int, float]]:
        """(shift, noise seed, intensity) evaluated per variant and seed; clean only once."""
        r = self.cfg.report
        out: list[tuple[ShiftPlan | None, int, float]] = [(None, 0, 0.0)]
        if self.natural is not None:
            return out
        for sp in self.shifts:
            if not sp.kind.needs_time_split:
                out += [(sp, ns, s) for ns in range(r.noise_seeds) for s in sp.intensities]
        return out

    def make_shift(self, sp: ShiftPlan, noise_seed: int, s: float):
        from ctrcal.eval.shifts import create_shift

        return create_shift(
            sp.spec,
            self.feature_map,
            intensity=s,
            seed=shift_seed(sp.label, noise_seed),
            mix_fraction=self.cfg.report.mix_fraction,
        )

    def predict(self, models, plan: VariantPlan, split: _Split, shift) -> Prediction:
        return predict_split(
            models,
            split.data,
            batch_size=self.batch_size,
            device=self.device,
            shift=shift,
            mc_samples=plan.mc_samples,
            mc_dropout_on=plan.mc_dropout,
        )

    def record(self, variant: str, shift: str, k: int, ns: int, s: float, values: dict) -> None:
        self.rows.extend(
            {
                "variant": variant,
                "shift": shift,
                "seed": k,
                "noise_seed": ns,
                "intensity": s,
                "metric": metric,
                "value": float(value),
            }
            for metric, value in values.items()
        )

    def accumulate(self, variant: str, key: tuple[str, float], probs, y) -> None:
        curve = M.reliability_curve(probs, y, n_bins=self.cfg.report.ece_bins)
        zeros = np.zeros_like(curve.counts)
        acc = self.bins.setdefault(variant, {}).setdefault(
            key,
            {"edges": curve.edges, "counts": zeros, "sum_p": zeros.copy(), "sum_y": zeros.copy()},
        )
        acc["counts"] += curve.counts
        acc["sum_p"] += np.nan_to_num(curve.mean_prob) * curve.counts
        acc["sum_y"] += np.nan_to_num(curve.frac_pos) * curve.counts

    def curves(self) -> dict[str, dict[tuple[str, float], dict[str, np.ndarray]]]:
        """Pooled reliability curves: {variant: {(shift, intensity): edges/counts/...}}."""
        out: dict[str, dict[tuple[str, float], dict[str, np.ndarray]]] = {}
        for variant, by_point in self.bins.items():
            for key, a in by_point.items():
                n = a["counts"]
                with np.errstate(invalid="ignore", divide="ignore"):
                    out.setdefault(variant, {})[key] = {
                        "edges": a["edges"],
                        "counts": n,
                        "mean_prob": np.where(n > 0, a["sum_p"] / n, np.nan),
                        "frac_pos": np.where(n > 0, a["sum_y"] / n, np.nan),
                    }
        return out

    def fit_calibration(self, models, plan: VariantPlan, k: int):
        """The variant's calibrator fitted on the clean validation split (or None)."""
        from ctrcal.eval.calibration import logit
        from ctrcal.utils import seed_everything

        if plan.calibration is None:
            return None
        if self.valid is None:  # pragma: no cover - run_shift_report loads it when needed
            raise RuntimeError("calibration needs the validation split")
        seed_everything(7919 * (k + 1))
        pred = self.predict(models, plan, self.valid, None)
        z = pred.logits if pred.logits is not None else logit(pred.probs)
        scaler = ReportCalibrator.for_variant(plan.config)
        return scaler.fit(z, self.valid.labels, self.valid.fields)

    def evaluate(self, models, plan: VariantPlan, k: int, bar) -> None:
        """The clean point and every (shift, noise seed, intensity) of one variant and seed."""
        from ctrcal.utils import seed_everything

        r = self.cfg.report
        scaler = self.fit_calibration(models, plan, k)
        labels = self.test.labels
        clean_std: np.ndarray | None = None
        for sp, noise_seed, s in self.points():
            label = CLEAN if sp is None else sp.label
            # MC sampling draws from the global RNG: seed it per evaluation for reproducibility
            seed_everything(
                1_000_003 * (k + 1) + 1009 * noise_seed + int(s * 1e6) + zlib.crc32(label.encode())
            )
            shift = None if sp is None else self.make_shift(sp, noise_seed, s)
            pred = self.predict(models, plan, self.test, shift)
            probs = _calibrated(pred, scaler, self.test.fields)
            sel = pred.rows if sp is not None else np.ones_like(pred.rows)
            values = evaluation_metrics(probs, labels, self.test.fields, r, rows=sel)
            if pred.std is not None:
                values["pred_std"] = float(pred.std[sel].mean())
                if sp is None:
                    clean_std = pred.std
                elif r.mix_fraction < 1.0:
                    values["std_auroc"] = M.auc(pred.std, pred.rows.astype(np.float64))
                elif clean_std is not None:
                    # the same rows clean (negative) vs shifted (positive)
                    both = np.concatenate([clean_std, pred.std])
                    which = np.concatenate([np.zeros(clean_std.size), np.ones(pred.std.size)])
                    values["std_auroc"] = M.auc(both, which)
            if self.natural is not None:
                label, s = self.natural.label, 1.0
            self.record(plan.name, label, k, noise_seed, s, values)
            strongest = sp is not None and s == max(sp.intensities)
            if noise_seed == 0 and (sp is None or strongest):
                self.accumulate(plan.name, (label, s), probs[sel], labels[sel])
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
    from ctrcal.data.features import FeatureMap
    from ctrcal.train.splits import open_split, resolve_data_mode

    mode = resolve_data_mode(cfg.train.data_mode, device, FeatureMap.load(data_dir))
    data = open_split(data_dir, split, mode, device)
    r = cfg.report
    needs_fields = r.field_metrics or any(v.field_calibration for v in r.variants)
    fields = load_split_fields(data, batch_size, r.field_numeric_buckets) if needs_fields else None
    return _Split(data, _labels(data, batch_size), fields)


def run_seeds(plans: list[VariantPlan], n_seeds: int) -> dict[str, list[int]]:
    """Seed indices each training variant must have runs for (ensemble members included)."""
    out: dict[str, set[int]] = {p.name: set() for p in plans if p.trains}
    for plan in plans:
        for k in range(n_seeds):
            out[plan.run_variant].update(plan.member_seeds(k, n_seeds))
    return {name: sorted(seeds) for name, seeds in out.items()}


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
    needed = run_seeds(plans, cfg.report.seeds)
    jobs = [
        TrainJob(plan.name, k, variant_train_config(cfg, plan, k), data_dir, run_dir)
        for plan in plans
        if plan.trains
        for k in needed[plan.name]
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

    from ctrcal.data.features import FeatureMap
    from ctrcal.runs import prepared_data_dir
    from ctrcal.train.splits import require_labelled
    from ctrcal.utils import remove_stale_temporaries, resolve_device

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
    plans, shift_plans = check_report(cfg, source)
    check_workers(cfg, source)
    slots = worker_slots(cfg, source)  # before any work: a GPU that is not there fails now
    r = cfg.report
    # a killed report may have left its outputs' temporaries; the data's and the runs'
    # own temporaries beside them are cleaned by their owners
    remove_stale_temporaries(out_dir, REPORT_OUTPUTS)
    data_dir = prepared_data_dir(cfg, out_dir, data_dir)
    feature_map = FeatureMap.load(data_dir)
    _check_data_for_shifts(shift_plans, feature_map, data_dir, source)
    require_labelled(feature_map, r.split, data_dir, f"the shift report (report.split: {r.split})")
    if any(p.calibration for p in plans):
        require_labelled(feature_map, "valid", data_dir, "temperature/Platt scaling")
    runs_dir = out_dir / "runs"
    if r.split == "valid" and any(p.calibration for p in plans):
        log(
            "note: report.split is 'valid', the split that temperature/Platt scaling is fitted "
            "on; their clean numbers are in-sample"
        )

    t_train = time.perf_counter()
    outcomes = train_variants(cfg, plans, data_dir, runs_dir, log, slots=slots, progress=progress)
    temporal = _prepare_temporal(cfg, shift_plans, feature_map, out_dir, log)
    for _, cfg_t, data_t, runs_t in temporal:
        more = train_variants(cfg_t, plans, data_t, runs_t, log, slots=slots, progress=progress)
        for status, n in more.items():
            outcomes[status] = outcomes.get(status, 0) + n
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
    grid = _Grid(cfg, shift_plans, test, valid, feature_map, device, bs)
    grids = [(grid, runs_dir)]
    for sp, cfg_t, data_t, runs_t in temporal:
        fm_t = FeatureMap.load(data_t)
        test_t = _open_split(data_t, r.split, cfg_t, device, bs)
        valid_t = (
            _open_split(data_t, "valid", cfg_t, device, bs)
            if any(p.calibration for p in plans)
            else None
        )
        grids.append((_Grid(cfg_t, [], test_t, valid_t, fm_t, device, bs, natural=sp), runs_t))
    total = len(plans) * r.seeds * sum(len(g.points()) for g, _ in grids)
    bar = tqdm(total=total, desc="shift report", unit="eval", disable=not progress, file=sys.stderr)
    for g, g_runs in grids:
        _evaluate_grid(g, plans, g_runs, device, bar, source)
        if g is not grid:
            grid.rows += g.rows
            for variant, by in g.bins.items():
                grid.bins.setdefault(variant, {}).update(by)
    bar.close()
    eval_s = time.perf_counter() - t_eval

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
        "oracle_calibration": oracle_calibration(data_dir, r.split, test.labels, test.fields, r),
        "elapsed": f"{_fmt_seconds(total_s)} (training {_fmt_seconds(train_s)}, evaluation "
        f"{_fmt_seconds(eval_s)})",
        "variant_descriptions": [_describe_variant(p, cfg) for p in plans],
        "shifts": [_describe_shift(sp, grid) for sp in shift_plans],
        "runs_dir": str(runs_dir),
        "data_dir": str(data_dir),
        "train_seeds": [cfg.train.seed + k for k in range(r.seeds)],
        "timing_s": {"train": train_s, "eval": eval_s, "total": total_s},
        "config": config_to_dict(cfg),
    }
    curves = grid.curves()
    baseline = r.baseline or plans[0].name
    base_plan = next((p for p in plans if p.name == baseline), None)
    same_ranking = [p.name for p in plans if base_plan and p.same_ranking_as(base_plan)]
    paths = write_report(
        pd.DataFrame(grid.rows, columns=RESULT_COLUMNS),
        out_dir,
        baseline=baseline,
        alpha=r.alpha,
        power=r.power,
        meta=meta,
        reliability={p.name: curves[p.name] for p in plans if p.name in curves},
        figures=r.figures,
        variants=[p.name for p in plans],
        same_ranking=same_ranking,
    )
    log(f"shift report: {total} evaluations, total time {_fmt_seconds(total_s)}")
    return paths


def _evaluate_grid(grid: _Grid, plans, runs_dir: Path, device, bar, source: str) -> None:
    """Every variant and seed of one grid, one seed's models in memory at a time."""
    from ctrcal.train.results import load_run

    r = grid.cfg.report
    loaded: dict[tuple[str, int], Any] = {}

    def model(run_variant: str, j: int):
        key = (run_variant, j)
        if key not in loaded:
            loaded[key] = load_run(runs_dir / run_variant / f"seed{j}")[0].to(device).eval()
        return loaded[key]

    by_run: dict[str, list[VariantPlan]] = {}
    for plan in plans:
        by_run.setdefault(plan.run_variant, []).append(plan)
    for run_variant, group in by_run.items():
        for k in range(r.seeds):
            for plan in group:
                members = [model(run_variant, j) for j in plan.member_seeds(k, r.seeds)]
                _check_stochastic(plan, members, source)
                bar.set_postfix_str(f"{plan.name} seed {k}")
                grid.evaluate(members, plan, k, bar)
            loaded.clear()


def _prepare_temporal(
    cfg: Config, shifts: list[ShiftPlan], feature_map, out_dir: Path, log
) -> list[tuple[ShiftPlan, Config, Path, Path]]:
    """For a temporal shift: the same data prepared in time order, and where its runs go.

    The report's own data is the random split (the clean reference); the temporal shift trains
    every variant again on the first rows of the same inputs and tests on the last ones.
    """
    from ctrcal.data.prepare import prepare

    out: list[tuple[ShiftPlan, Config, Path, Path]] = []
    for sp in shifts:
        if not sp.kind.needs_time_split:
            continue
        cfg_t = copy.deepcopy(cfg)
        cfg_t.data.split_order = "time"
        cfg_t.data.prepared_dir = None
        data_t = out_dir / f"data_{sp.label}"
        log(f"{sp.label}: preparing the inputs in time order into {data_t}")
        data_t = prepare(None, data_t, cfg_t).out_dir
        from ctrcal.data.features import FeatureMap

        rows = sum(int(v.get("rows", 0)) for v in feature_map.splits.values())
        rows_t = sum(int(v.get("rows", 0)) for v in FeatureMap.load(data_t).splits.values())
        if rows and rows_t and rows != rows_t:
            raise DataError(
                f"{data_t}: the time-ordered preparation of data.* has {rows_t:,} rows but the "
                f"report's data has {rows:,}: the report's data is not the random split of the "
                f"same inputs [{sp.key}]"
            )
        out.append((sp, cfg_t, data_t, out_dir / f"runs_{sp.label}"))
    return out


def _check_data_for_shifts(shifts: list[ShiftPlan], feature_map, data_dir: Path, source: str):
    """What the prepared data must hold for the shifts (checked before any training)."""
    from ctrcal.eval.shift import original_space_codec

    for sp in shifts:
        if sp.options.get("space") == "original":
            try:
                original_space_codec(feature_map, str(data_dir / "feature_map.json"))
            except DataError as exc:
                where = f"{sp.key}.space" if sp.key.startswith("report.shifts") else sp.key
                raise DataError(f"{exc} [{source}: {where}]") from None


def _check_stochastic(plan: VariantPlan, models, source: str) -> None:
    """MC passes need something that samples: MC-LayerNorm layers or (MC-Dropout) dropout."""
    from ctrcal.eval.predictive import dropout_modules
    from ctrcal.layers.mc_layernorm import has_mc_layers

    if not plan.mc_samples:
        return
    for m in models:
        if plan.mc_dropout and not dropout_modules(m):
            raise ConfigError(
                f"{source}: report.variants: {plan.name}: mc_dropout but the runs of "
                f"{plan.run_variant} have no dropout layer"
            )
        if not plan.mc_dropout and not has_mc_layers(m):
            raise ConfigError(
                f"{source}: report.variants: {plan.name}: mc_samples but the runs of "
                f"{plan.run_variant} have no MC layer (every pass would be the same); use "
                "MC-LayerNorm runs or mc_dropout"
            )


def _describe_shift(sp: ShiftPlan, grid: _Grid) -> dict[str, Any]:
    """What the report states about a shift: kind, grid, unit, space and the stds used."""
    info: dict[str, Any] = {
        "label": sp.label,
        "name": sp.name,
        "description": sp.kind.description,
        "unit": sp.kind.unit,
        "intensities": list(sp.intensities),
        **sp.options,
    }
    if sp.intensities:
        info.update(grid.make_shift(sp, 0, sp.intensities[0]).describe())
    info["numeric_fields"] = list(grid.feature_map.numeric_fields)
    return info
