"""The shift-robustness report, end to end: plan, jobs, training, evaluation, statistics, render.

The protocol of the MC-LayerNorm paper's Criteo experiment (its Figure 3), generalised to the
shifts and baselines of the uncertainty literature, on any prepared data directory. This
module is the recipe: it reads top to bottom and calls one component per step.

1. **Plan** (:mod:`ctrcal.reports.shift.plan`): the variants and shifts of ``report``, checked
   before any data is read; the workers' devices (:mod:`ctrcal.sweep.sweep`).
2. **Jobs** (:mod:`ctrcal.reports.shift.jobs`): the report's prepared data (prepared from ``data:``
   when needed) and, for a temporal shift, the same inputs prepared in time order; on each,
   every variant that owns its runs (``from_variant`` unset) once per training seed
   ``train.seed + k`` (k < ``report.seeds``), plus the extra members of its deep ensembles.
   The variants of the same k share the seed, so they are compared *paired by seed*.
3. **Training** (:mod:`ctrcal.sweep.sweep`): every run trained, or reused when a finished run
   with the same config and data is in ``OUT/runs/<variant>/seed<k>`` (runs trained with
   ``ctrcal train`` elsewhere can be placed there), or resumed; with ``report.workers`` /
   ``report.devices`` in parallel processes.
4. **Evaluation** (:mod:`ctrcal.reports.shift.grid`): per data set, the calibrators fitted on clean
   validation, then the clean split and every shift at every intensity and noise seed. A
   variant with ``from_variant`` reuses that variant's runs and changes only how it predicts:
   MC integration (``mc_samples``, ``mc_dropout``), an ensemble, a calibrator
   (``calibration:``, :mod:`ctrcal.calibration`).
5. **Statistics** (:mod:`ctrcal.reports.shift.stats`): mean ± SE over seeds, paired tests against
   the baseline with the family-wise correction and the detectable difference: a ``Summary``.
6. **Rendering** (:mod:`ctrcal.reports.shift.render`): ``results.csv`` (long: variant, shift, seed,
   noise_seed, intensity, metric, value), ``summary.json``, ``report.md`` (a one-screen
   summary: what differs, the detectable difference per metric, the figure; then an appendix:
   the verdict table, tables per shift, uncertainty quality, definitions) and the PNG figures.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ctrcal.config import Config, config_to_dict
from ctrcal.reports.shift.calibrate import oracle_calibration
from ctrcal.reports.shift.grid import (
    EvalGrid,
    evaluate_grid,
    fit_calibrators,
    oracle_metrics,
    row_level_windows,
    shift_info,
)
from ctrcal.reports.shift.jobs import check_data_for_shifts, data_jobs, train_jobs_for
from ctrcal.reports.shift.plan import (
    check_report,
)
from ctrcal.reports.shift.render import (
    REPORT_OUTPUTS,
    ReportMeta,
    ReportPaths,
    Timing,
    TrainingInfo,
    describe_variant,
    fmt_seconds,
    write_report,
)
from ctrcal.reports.shift.row_level import check_time_ordered, oracle_probs
from ctrcal.reports.shift.stats import RESULT_COLUMNS, summarize_report
from ctrcal.sweep.sweep import check_workers, train_jobs, training_threads, worker_slots

__all__ = ["run_shift_report", "shift_report"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
) -> ReportPaths:
    """Train what is missing, evaluate the grid and write the report.

    With ``train.loggers`` naming ``mlflow``, the report is one MLflow run whose children are
    its training runs (one per variant and seed) and whose artifacts are the report's tables
    and figures (:func:`ctrcal.train.loggers.report_tracking`). The arguments are those of
    :func:`shift_report`.
    """
    from ctrcal.train.loggers import report_tracking

    out_dir = Path(out_dir)
    with report_tracking(cfg.train, out_dir, config_to_dict(cfg), out_dir.name) as artifact:
        paths = shift_report(
            cfg,
            out_dir,
            data_dir,
            seeds=seeds,
            workers=workers,
            devices=devices,
            progress=progress,
            log=log,
        )
        for path in (paths.report_md, paths.results_csv, paths.summary_json):
            artifact(path)
        for figure in paths.figures.values():
            artifact(figure)
    return paths


def shift_report(
    cfg: Config,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    *,
    seeds: int | None = None,
    workers: int | None = None,
    devices: str | list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = _log,
) -> ReportPaths:
    """Train what is missing, evaluate the grid and write the report (without tracking).

    Args:
        cfg: the whole config (``report`` section drives the protocol).
        out_dir: report directory; runs go to ``out_dir/runs/<variant>/seed<k>``.
        data_dir: prepared data; default ``cfg.data.prepared_dir`` or, with neither, data
            prepared from ``cfg.data`` into ``out_dir/data``.
        seeds: override ``cfg.report.seeds``.
        workers: override ``cfg.report.workers`` (runs training at once, each in its own
            process; see :mod:`ctrcal.sweep.sweep`).
        devices: override ``cfg.report.devices`` (``"auto"``, ``"cuda:0,cuda:1"`` or a list).
        progress: show progress bars over the parallel training runs and the evaluation grid.
        log: where progress lines go (stderr by default).

    Returns:
        The paths written (report.md, results.csv, summary.json, figures).
    """
    from ctrcal.core.devices import resolve_device

    t_start = time.perf_counter()
    out_dir = Path(out_dir)

    # 1. plan: everything checkable without data fails here, before any work
    if seeds is not None or workers is not None or devices is not None:
        cfg = copy.deepcopy(cfg)
        cfg.report.seeds = cfg.report.seeds if seeds is None else int(seeds)
        cfg.report.workers = cfg.report.workers if workers is None else int(workers)
        cfg.report.devices = cfg.report.devices if devices is None else devices
    plans, shift_plans = check_report(cfg)
    check_workers(cfg)
    slots = worker_slots(cfg)  # a GPU that is not there fails now
    r = cfg.report
    calibrated = any(p.calibration for p in plans)

    # 2. jobs: the data sets (prepared if needed, temporal copies included) and their runs
    data_dir, jobs = _data_jobs(cfg, shift_plans, out_dir, data_dir, calibrated, log)

    # 3. training
    t_train = time.perf_counter()
    outcomes = train_jobs(train_jobs_for(jobs, plans), log, slots=slots, progress=progress)
    train_s = time.perf_counter() - t_train

    # 4. evaluation: per data set, calibrators fitted on clean validation, then the grid
    t_eval = time.perf_counter()
    # explicit report.devices: evaluate on the first of them, as a sequential run would train
    device = resolve_device(slots[0] if r.devices else cfg.train.device)
    grids, rows, curves, by_variant = _evaluate(
        cfg, jobs, plans, shift_plans, device, valid=calibrated, progress=progress
    )
    eval_s = time.perf_counter() - t_eval

    # 5. statistics: numbers only
    baseline = r.baseline or plans[0].name
    base_plan = next(p for p in plans if p.name == baseline)
    summary = summarize_report(
        pd.DataFrame(rows, columns=RESULT_COLUMNS),
        baseline=baseline,
        alpha=r.alpha,
        power=r.power,
        variants=[p.name for p in plans],
        same_ranking=[p.name for p in plans if p.same_ranking_as(base_plan)],
    )

    # 6. rendering: every word and figure
    total_s = time.perf_counter() - t_start
    timing = Timing(train=train_s, eval=eval_s, total=total_s, eval_by_variant=by_variant)
    training = TrainingInfo(slots, training_threads(cfg, slots), outcomes)
    meta = _report_meta(
        cfg, plans, shift_plans, grids[0], data_dir, out_dir, device, timing, training
    )
    reliability = {p.name: curves[p.name] for p in plans if p.name in curves}
    paths = write_report(
        summary,
        out_dir,
        meta,
        reliability=reliability,
        figures=r.figures,
        row_level=grids[0].row_level,
    )
    total = len(plans) * r.seeds * sum(len(g.points()) for g in grids)
    log(f"shift report: {total} evaluations, total time {fmt_seconds(total_s)}")
    log(
        "evaluation time by variant (calibrator fits included): "
        + ", ".join(f"{v} {s:.1f}s" for v, s in by_variant.items())
    )
    return paths


def _data_jobs(
    cfg: Config,
    shift_plans: list[Any],
    out_dir: Path,
    data_dir: str | Path | None,
    calibrated: bool,
    log: Callable[[str], None],
) -> tuple[Path, list[Any]]:
    """The report's prepared data, checked against what the shifts and calibrators need, and
    its data jobs -> (data_dir, jobs)."""
    from ctrcal.core.utils import remove_stale_temporaries
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.train.runs import prepared_data_dir
    from ctrcal.train.splits import require_labelled

    r = cfg.report
    # a killed report may have left its outputs' temporaries; the data's and the runs' own
    # temporaries beside them are cleaned by their owners
    remove_stale_temporaries(out_dir, REPORT_OUTPUTS)
    data_dir = prepared_data_dir(cfg, out_dir, data_dir)
    feature_map = FeatureMap.load(data_dir)
    check_data_for_shifts(shift_plans, feature_map, data_dir, cfg)
    require_labelled(feature_map, r.split, data_dir, f"the shift report (report.split: {r.split})")
    if calibrated:
        require_labelled(feature_map, "valid", data_dir, "the calibrators")
        if r.split == "valid":
            log(
                "note: report.split is 'valid', the split the calibrators are fitted on; their "
                "clean numbers are in-sample"
            )
    if r.windows:
        check_time_ordered(data_dir, cfg)
    return data_dir, data_jobs(cfg, shift_plans, feature_map, data_dir, out_dir, log)


def _evaluate(
    cfg: Config,
    jobs: list[Any],
    plans: list[Any],
    shift_plans: list[Any],
    device: Any,
    *,
    valid: bool,
    progress: bool,
) -> tuple[list[EvalGrid], list[list[Any]], dict[str, dict[Any, Any]], dict[str, float]]:
    """Every data set's grid: its calibrators fitted on clean validation, then every variant
    and seed at every point -> (grids, result rows, reliability curves by variant, evaluation
    seconds by variant, calibrator fits included)."""
    from tqdm.auto import tqdm

    r = cfg.report
    fields = r.field_metrics or bool(r.windows) or any(p.needed_fields() for p in plans)
    bs = cfg.train.eval_batch_size
    grids = [
        EvalGrid.open(job, shift_plans, device, bs, fields=fields, valid=valid) for job in jobs
    ]
    total = len(plans) * r.seeds * sum(len(g.points()) for g in grids)
    bar = tqdm(total=total, desc="shift report", unit="eval", disable=not progress, file=sys.stderr)
    rows: list[list[Any]] = []
    curves: dict[str, dict[Any, Any]] = {}
    for grid, job in zip(grids, jobs, strict=True):
        calibrators = fit_calibrators(grid, plans, job.runs_dir)
        evaluate_grid(grid, plans, job.runs_dir, calibrators, bar)
        if r.windows and job.natural is None:
            row_level_windows(grid, plans, oracle_probs(job.data_dir, r.split, grid.test.labels))
        rows += grid.rows
        for variant, by_point in grid.curves().items():
            curves.setdefault(variant, {}).update(by_point)
    bar.close()
    by_variant = {p.name: sum(g.seconds.get(p.name, 0.0) for g in grids) for p in plans}
    return grids, rows, curves, by_variant


def _report_meta(
    cfg: Config,
    plans: list[Any],
    shift_plans: list[Any],
    main: EvalGrid,
    data_dir: Path,
    out_dir: Path,
    device: Any,
    timing: Timing,
    training: TrainingInfo,
) -> ReportMeta:
    """How the report was made, in the words :mod:`ctrcal.reports.shift.render` writes."""
    r, test = cfg.report, main.test
    device_note = str(device)
    if len(training.workers) > 1:
        device_note += (
            f"; training in {len(training.workers)} parallel processes "
            f"({', '.join(training.workers)})"
        )
    return ReportMeta(
        split=r.split,
        rows=int(test.labels.shape[0]),
        mix_fraction=r.mix_fraction,
        noise_seeds=r.noise_seeds,
        device=device_note,
        variant_descriptions=[describe_variant(p, cfg) for p in plans],
        shifts=[shift_info(sp, main) for sp in shift_plans],
        oracle=oracle_metrics(data_dir, r.split),
        oracle_calibration=oracle_calibration(data_dir, r.split, test.labels, test.fields, r),
        timing=timing,
        training=training,
        runs_dir=str(out_dir / "runs"),
        data_dir=str(data_dir),
        train_seeds=[cfg.train.seed + k for k in range(r.seeds)],
        config=config_to_dict(cfg),
    )
