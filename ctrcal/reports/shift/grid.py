"""The evaluation grid of a shift report: every variant and seed at every shift point.

Two steps, in this order, for one set of trained runs (the report's data, or a temporal
shift's time-ordered data):

1. :func:`fit_calibrators`: each calibrated variant's calibrator fitted on its clean
   validation predictions, per seed (:mod:`ctrcal.calibration`);
2. :func:`evaluate_grid`: the clean test split once, then every shift of the report at every
   intensity of its grid and every noise seed, predictions calibrated by the fitted
   calibrators (nothing is fitted here), into the long results rows and pooled reliability
   curves.

A shift's noise depends only on its label and noise seed, never on the variant: all variants
see the same shifted rows. MC sampling draws from the global RNG, which is seeded per
evaluation, so every number is reproducible whatever ran before.

What is deterministic is computed once and shared, within :data:`KEEP_BYTES`: the shifted
batches of each point (every variant and seed reads the same ones), and each run's one-shot
prediction at each point (the variants made of the same runs -- the calibrated ones, the
ensembles -- read it instead of running the model again). The numbers are those of running it
again: the same model on the same batches gives the same logits.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal import metrics as M
from ctrcal.config import Config
from ctrcal.core.errors import ConfigError
from ctrcal.metrics import bootstrap_ci
from ctrcal.reports.shift.calibrate import SplitFields, evaluation_metrics, load_split_fields
from ctrcal.reports.shift.jobs import DataJob
from ctrcal.reports.shift.plan import ShiftPlan, VariantPlan
from ctrcal.reports.shift.row_level import RowLevel, risk_coverage_values, window_report
from ctrcal.reports.shift.shift_tables import record_segments
from ctrcal.reports.shift.stats import CLEAN
from ctrcal.train.predict import Prediction, ShiftedBatches, ensemble_prediction, predict_split

__all__ = [
    "EvalGrid",
    "Split",
    "evaluate_grid",
    "fit_calibrators",
    "open_split",
    "oracle_metrics",
    "row_level_windows",
    "shift_info",
    "shift_seed",
]

# (variant, seed index) -> the variant's calibrator fitted for that seed's runs
Calibrators = dict[tuple[str, int], Any]

# (split, shift label, noise seed, intensity): one point of one split
Point = tuple[str, str, int, float]

KEEP_BYTES = 512 << 20
"""Most bytes of shifted batches and of one-shot predictions a grid keeps for reuse (each
kind); what does not fit is computed again where it is needed (slower, the same numbers)."""


def shift_seed(label: str, noise_seed: int) -> int:
    """The seed of a shift's stream: by shift label and noise seed, never by variant or model."""
    return (zlib.crc32(label.encode()) + 1_000_003 * noise_seed) % (2**31)


@dataclass
class Split:
    """A split loaded once for the whole grid, with its labels on the host.

    Attributes:
        data: the :class:`~ctrcal.data.loader.ParquetCTRData` split.
        labels: [n] float64 0/1 labels in prediction order.
        fields: clean field codes [n, F] (segments of the field metrics and of segment-aware
            calibrators), or None when nothing needs them.
    """

    data: Any
    labels: np.ndarray
    fields: SplitFields | None = None

    def segments(self) -> dict[str, np.ndarray] | None:
        """The clean field codes by field name (a calibrator's ``segments``)."""
        if self.fields is None:
            return None
        return {name: self.fields.column(name) for name in self.fields.names}


def _labels(data: Any, batch_size: int) -> np.ndarray:
    import torch

    from ctrcal.train.predict import iter_batches

    parts = [b.label.detach().double().cpu() for b in iter_batches(data, batch_size)]
    return torch.cat(parts).numpy()


def open_split(
    data_dir: Path, split: str, cfg: Config, device: Any, batch_size: int, fields: bool
) -> Split:
    """Open ``split`` of prepared data for evaluation (with its clean field codes if asked)."""
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.train import splits

    mode = splits.resolve_data_mode(cfg.train.data_mode, device, FeatureMap.load(data_dir))
    data = splits.open_split(data_dir, split, mode, device)
    buckets = cfg.report.field_numeric_buckets
    codes = load_split_fields(data, batch_size, buckets) if fields else None
    return Split(data, _labels(data, batch_size), codes)


def oracle_metrics(data_dir: Path, split: str) -> dict[str, float] | None:
    """The true-probability AUC/logloss of synthetic data (None for real data)."""
    try:
        fm = json.loads((Path(data_dir) / "feature_map.json").read_text())
    except (OSError, ValueError):
        return None
    oracle = fm.get("oracle") or {}
    return oracle.get(split) if isinstance(oracle, dict) else None


@dataclass
class EvalGrid:
    """One set of trained runs evaluated at every point, and what it has produced so far.

    Attributes:
        natural: a natural shift (temporal): this grid's clean split *is* the shifted data,
            recorded under the shift's label at intensity 1.
        rows: the long results rows (:data:`~ctrcal.reports.shift.stats.RESULT_COLUMNS`).
        bins: variant -> (shift, intensity) -> summed reliability bins (pooled over seeds).
        row_level: the row-bootstrap intervals and time windows
            (:mod:`ctrcal.reports.shift.row_level`).
        kept: (variant, split) -> the uncalibrated logits of training seed 0, kept for the
            time windows of calibrated variants (``report.windows``).
    """

    cfg: Config
    shifts: list[ShiftPlan]
    test: Split
    valid: Split | None
    feature_map: Any
    device: Any
    batch_size: int
    natural: ShiftPlan | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    bins: dict[str, dict[tuple[str, float], dict[str, np.ndarray]]] = field(default_factory=dict)
    row_level: RowLevel = field(default_factory=RowLevel)
    kept: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # variant -> fit + evaluation time
    # what is shared between evaluations (see the module's docstring)
    shifted: dict[Point, ShiftedBatches] = field(default_factory=dict, repr=False)
    one_shot: dict[tuple[str, int, Point], Prediction] = field(default_factory=dict, repr=False)
    # drift and label-free estimates against the validation split (None: not yet made, False:
    # the splits are too small or there is no validation split)
    monitor: Any = None
    runs_dir: Path | None = None
    # (run variant, seed) -> the autocast dtype the run was trained in (None: float32)
    precisions: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def open(
        cls,
        job: DataJob,
        shifts: list[ShiftPlan],
        device: Any,
        batch_size: int,
        *,
        fields: bool,
        valid: bool,
    ) -> EvalGrid:
        """The grid of one data set: its evaluated split (and validation split when ``valid``).

        Args:
            job: the data set, its config and its runs.
            shifts: the report's shifts (a natural shift's data set is evaluated clean only).
            device: where predictions run.
            batch_size: rows per prediction batch.
            fields: load the clean field codes (field metrics, segment-aware calibrators).
            valid: open the validation split (the calibrators are fitted on it).
        """
        from ctrcal.data.feature_map import FeatureMap

        split = job.cfg.report.split
        return cls(
            job.cfg,
            [] if job.natural else shifts,
            open_split(job.data_dir, split, job.cfg, device, batch_size, fields),
            open_split(job.data_dir, "valid", job.cfg, device, batch_size, fields)
            if valid
            else None,
            FeatureMap.load(job.data_dir),
            device,
            batch_size,
            natural=job.natural,
            runs_dir=job.runs_dir,
        )

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

    def make_shift(self, sp: ShiftPlan, noise_seed: int, s: float) -> Any:
        from ctrcal.shifts import registry as shifts

        return shifts.create_shift(
            sp.spec,
            self.feature_map,
            intensity=s,
            seed=shift_seed(sp.label, noise_seed),
            mix_fraction=self.cfg.report.mix_fraction,
        )

    def batches(self, point: Point) -> ShiftedBatches:
        """The batches of ``point`` (its split, shifted), drawn once while they fit."""
        kept = self.shifted.get(point)
        if kept is not None:
            return kept
        split_name, label, noise_seed, s = point
        split = self.valid if split_name == "valid" else self.test
        if split is None:  # pragma: no cover - the recipe opens it when needed
            raise RuntimeError("calibration needs the validation split")
        sp = next((sp for sp in self.shifts if sp.label == label), None)
        shift = None if sp is None else self.make_shift(sp, noise_seed, s)
        out = ShiftedBatches.of(split.data, self.batch_size, shift)
        used = sum(b.nbytes for b in self.shifted.values())
        if used + out.nbytes <= KEEP_BYTES:
            self.shifted[point] = out
        return out

    def precision(self, run_variant: str, j: int) -> Any:
        """The autocast dtype run ``seed{j}`` of ``run_variant`` was trained in (None: float32):
        every run is scored in its own arithmetic, as ``ctrcal evaluate`` scores it."""
        from ctrcal.train.results import run_precision

        key = (run_variant, j)
        if key not in self.precisions:
            run_dir = None if self.runs_dir is None else self.runs_dir / run_variant / f"seed{j}"
            self.precisions[key] = (
                None if run_dir is None else run_precision(run_dir, self.cfg, self.device)
            )
        return self.precisions[key]

    def predict(self, models: list, plan: VariantPlan, k: int, point: Point) -> Prediction:
        """The variant's prediction of seed ``k`` at ``point``; a one-shot run's own
        prediction is made once and shared by every variant made of that run."""
        n_seeds = self.cfg.report.seeds
        if plan.mc_samples:
            precisions = {
                self.precision(plan.run_variant, j) for j in plan.member_seeds(k, n_seeds)
            }
            return predict_split(
                models,
                self.batches(point),
                batch_size=self.batch_size,
                device=self.device,
                mc_samples=plan.mc_samples,
                mc_dropout_on=plan.mc_dropout,
                # members trained in different precisions score in float32 together
                precision=precisions.pop() if len(precisions) == 1 else None,
            )
        members = [
            self._one_shot(model, plan.run_variant, j, point)
            for model, j in zip(models, plan.member_seeds(k, n_seeds), strict=True)
        ]
        return members[0] if len(members) == 1 else ensemble_prediction(members, self.batch_size)

    def _one_shot(self, model: Any, run_variant: str, j: int, point: Point) -> Prediction:
        key = (run_variant, j, point)
        kept = self.one_shot.get(key)
        if kept is not None:
            return kept
        pred = predict_split(
            [model],
            self.batches(point),
            batch_size=self.batch_size,
            device=self.device,
            precision=self.precision(run_variant, j),
        )
        for a in (pred.probs, pred.logits, pred.rows, pred.labels):
            a.flags.writeable = False  # shared by several variants: nobody may change it
        used = sum(_nbytes(p) for p in self.one_shot.values())
        if used + _nbytes(pred) <= KEEP_BYTES:
            self.one_shot[key] = pred
        return pred

    def forget_predictions(self) -> None:
        """Drop the kept one-shot predictions (their runs are done with)."""
        self.one_shot.clear()

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

    def fit_calibrator(self, models: list, plan: VariantPlan, k: int) -> Any:
        """The variant's calibrator fitted on the clean validation split (None: uncalibrated)."""
        from ctrcal.calibration.base import create_calibrator, logit
        from ctrcal.core.devices import seed_everything

        if plan.calibration is None:
            return None
        if self.valid is None:  # pragma: no cover - the recipe opens it when needed
            raise RuntimeError("calibration needs the validation split")
        seed_everything(7919 * (k + 1))
        pred = self.predict(models, plan, k, ("valid", CLEAN, 0, 0.0))
        z = pred.logits if pred.logits is not None else logit(pred.probs)
        if self.cfg.report.windows and k == 0:
            self.kept[(plan.name, "valid")] = np.asarray(z, dtype=np.float64)
        return create_calibrator(plan.calibration).fit(z, self.valid.labels, self.valid.segments())

    def monitor_reference(
        self, models: list, plan: VariantPlan, k: int, calibrator: Any
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The variant's clean validation probabilities and the clicks, the monitor's
        reference (:mod:`ctrcal.reports.shift.monitoring`); None without a monitor (no
        validation split, splits too small, or ``report.monitor: false``)."""
        from ctrcal.calibration.base import logit
        from ctrcal.core.devices import seed_everything
        from ctrcal.reports.shift.monitoring import ShiftMonitor

        if (
            self.valid is None
            or self.natural is not None
            or self.monitor is False
            or not self.cfg.report.monitor
        ):
            return None
        point = ("valid", CLEAN, 0, 0.0)
        if self.monitor is None:
            made = ShiftMonitor.of(self.feature_map, len(self.valid.labels), len(self.test.labels))
            self.monitor = False if made is None else made.fit(self.batches(point))
            if made is None:
                return None
        seed_everything(7919 * (k + 1))  # as the calibrator's fit: the same MC draws
        pred = self.predict(models, plan, k, point)
        probs = pred.probs
        if calibrator is not None:
            z = pred.logits if pred.logits is not None else logit(pred.probs)
            probs = calibrator.predict_proba(z, self.valid.segments())
        return np.asarray(probs, dtype=np.float64), self.valid.labels

    def evaluate(self, models: list, plan: VariantPlan, k: int, calibrator: Any, bar) -> None:
        """The clean point and every (shift, noise seed, intensity) of one variant and seed."""
        from ctrcal.calibration.base import logit
        from ctrcal.core.devices import seed_everything

        watch = self.monitor_reference(models, plan, k, calibrator)
        r = self.cfg.report
        labels = self.test.labels
        segments = self.test.segments() if calibrator is not None else None
        clean_std: np.ndarray | None = None
        for sp, noise_seed, s in self.points():
            label = CLEAN if sp is None else sp.label
            # MC sampling draws from the global RNG: seed it per evaluation for reproducibility
            seed_everything(
                1_000_003 * (k + 1) + 1009 * noise_seed + int(s * 1e6) + zlib.crc32(label.encode())
            )
            pred = self.predict(models, plan, k, ("test", label, noise_seed, s))
            probs = pred.probs
            if calibrator is not None:
                z = pred.logits if pred.logits is not None else logit(pred.probs)
                probs = np.asarray(calibrator.predict_proba(z, segments), dtype=np.float64)
                if sp is None and k == 0 and r.windows:
                    self.kept[(plan.name, "test")] = np.asarray(z, dtype=np.float64)
            sel = pred.rows if sp is not None else np.ones_like(pred.rows)
            values = evaluation_metrics(probs, labels, self.test.fields, r, rows=sel)
            if watch is not None:
                point = ("test", label, noise_seed, s)
                chunks = self.monitor.chunks(point, self.batches(point))
                values.update(self.monitor.values(chunks, probs, labels, *watch))
            if sp is None and k == 0 and r.bootstrap and self.natural is None:
                self.row_level.n_boot = r.bootstrap
                self.row_level.bootstrap[plan.name] = bootstrap_ci(
                    probs,
                    labels,
                    n_boot=r.bootstrap,
                    n_bins=r.ece_bins,
                    seed=zlib.crc32(plan.name.encode()),
                )
            if pred.std is not None:
                values["pred_std"] = float(pred.std[sel].mean())
                values.update(risk_coverage_values(probs[sel], labels[sel], pred.std[sel]))
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
            if k == 0 and noise_seed == 0 and (sp is None or strongest):
                store = self.row_level.segments.setdefault(plan.name, {})
                point = label if sp is None else f"{label} @ {s:g}"
                record_segments(store, point, probs, labels, sel, self.test.fields, r)
            if noise_seed == 0 and (sp is None or strongest):
                self.accumulate(plan.name, (label, s), probs[sel], labels[sel])
            bar.update(1)


def _nbytes(pred: Prediction) -> int:
    arrays = (pred.probs, pred.logits, pred.std, pred.rows, pred.labels)
    return sum(a.nbytes for a in arrays if a is not None)


def _seed_models(
    plans: list[VariantPlan], runs_dir: Path, device: Any, n_seeds: int, cfg: Config
) -> Iterator[tuple[VariantPlan, int, list]]:
    """(plan, seed index, its models) for every variant and seed, one seed's runs in memory."""
    from ctrcal.train.results import load_run

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
        for k in range(n_seeds):
            for plan in group:
                members = [model(run_variant, j) for j in plan.member_seeds(k, n_seeds)]
                _check_stochastic(plan, members, cfg)
                yield plan, k, members
            loaded.clear()


def fit_calibrators(grid: EvalGrid, plans: list[VariantPlan], runs_dir: Path) -> Calibrators:
    """Every calibrated variant's calibrator per seed, fitted on clean validation."""
    calibrated = [p for p in plans if p.calibration is not None]
    out: Calibrators = {}
    n = grid.cfg.report.seeds
    runs = None
    for plan, k, members in _seed_models(calibrated, runs_dir, grid.device, n, grid.cfg):
        if (plan.run_variant, k) != runs:  # the previous runs' predictions are not read again
            grid.forget_predictions()
            runs = (plan.run_variant, k)
        t0 = time.perf_counter()
        out[(plan.name, k)] = grid.fit_calibrator(members, plan, k)
        grid.seconds[plan.name] = grid.seconds.get(plan.name, 0.0) + time.perf_counter() - t0
    return out


def evaluate_grid(
    grid: EvalGrid,
    plans: list[VariantPlan],
    runs_dir: Path,
    calibrators: Calibrators,
    bar: Any,
) -> None:
    """Every variant and seed of one grid (calibrators already fitted), into ``grid.rows``."""
    n = grid.cfg.report.seeds
    runs = None
    for plan, k, members in _seed_models(plans, runs_dir, grid.device, n, grid.cfg):
        if (plan.run_variant, k) != runs:  # the previous runs' predictions are not read again
            grid.forget_predictions()
            runs = (plan.run_variant, k)
        bar.set_postfix_str(f"{plan.name} seed {k}")
        t0 = time.perf_counter()
        grid.evaluate(members, plan, k, calibrators.get((plan.name, k)), bar)
        grid.seconds[plan.name] = grid.seconds.get(plan.name, 0.0) + time.perf_counter() - t0
    grid.forget_predictions()
    grid.shifted.clear()


def row_level_windows(
    grid: EvalGrid, plans: list[VariantPlan], oracle: np.ndarray | None = None
) -> None:
    """The time windows of every calibrated variant (seed 0), into ``grid.row_level``
    (``oracle``: the test rows' true probabilities, for the per-window floor)."""
    if not grid.cfg.report.windows or grid.natural is not None or grid.valid is None:
        return
    for plan in plans:
        if plan.calibration is None:
            continue
        test = (grid.kept[(plan.name, "test")], grid.test.labels, grid.test.segments())
        valid = (grid.kept[(plan.name, "valid")], grid.valid.labels, grid.valid.segments())
        t0 = time.perf_counter()
        grid.row_level.windows.append(
            window_report(plan.name, plan.calibration, test, valid, grid.cfg.report, oracle=oracle)
        )
        grid.seconds[plan.name] = grid.seconds.get(plan.name, 0.0) + time.perf_counter() - t0


def _check_stochastic(plan: VariantPlan, models: list, cfg: Config) -> None:
    """MC passes need something that samples: MC-LayerNorm layers or (MC-Dropout) dropout."""
    from ctrcal.layers.mc_layernorm.module import has_mc_layers
    from ctrcal.train.predict import dropout_modules

    if not plan.mc_samples:
        return
    for m in models:
        if plan.mc_dropout and not dropout_modules(m):
            raise ConfigError(
                f"{cfg.where('report.variants')}: {plan.name}: mc_dropout but the runs of "
                f"{plan.run_variant} have no dropout layer"
            )
        if not plan.mc_dropout and not has_mc_layers(m):
            raise ConfigError(
                f"{cfg.where('report.variants')}: {plan.name}: mc_samples but the runs of "
                f"{plan.run_variant} have no MC layer (every pass would be the same); use "
                "MC-LayerNorm runs or mc_dropout"
            )


def shift_info(sp: ShiftPlan, grid: EvalGrid) -> dict[str, Any]:
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
