"""The jobs of a shift report: which data sets it evaluates and which runs it trains.

A report evaluates its own prepared data (the random split, the clean reference) and, for a
temporal shift, the same inputs prepared again in time order (train on the first rows, test
on the last). Each is a :class:`DataJob` with its own runs directory; :func:`data_jobs`
prepares the time-ordered copies. :func:`train_jobs_for` lists every training run the
variants need on every data set: one per training seed, plus the extra members of deep
ensembles.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.reports.shift.plan import ShiftPlan, VariantPlan, variant_train_config
from ctrcal.shifts.data_check import check_original_space, check_shifts_apply
from ctrcal.sweep.sweep import TrainJob

__all__ = [
    "DataJob",
    "check_data_for_shifts",
    "data_jobs",
    "run_seeds",
    "train_jobs_for",
]


@dataclass(frozen=True)
class DataJob:
    """One prepared data set of a report, the config that trains on it and where its runs go.

    Attributes:
        natural: the temporal shift this data set is (None: the report's own data).
    """

    cfg: Config
    data_dir: Path
    runs_dir: Path
    natural: ShiftPlan | None = None


def data_jobs(
    cfg: Config,
    shifts: list[ShiftPlan],
    feature_map: Any,
    data_dir: Path,
    out_dir: Path,
    log: Callable[[str], None],
) -> list[DataJob]:
    """The report's own data, then each temporal shift's time-ordered copy (prepared here).

    Raises:
        DataError: the time-ordered preparation has another row count than the report's
            data (then the report's data is not the random split of the same inputs).
    """
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.preparation.prepare import prepare

    out = [DataJob(cfg, data_dir, out_dir / "runs")]
    for sp in shifts:
        if not sp.kind.needs_time_split:
            continue
        cfg_t = copy.deepcopy(cfg)
        cfg_t.data.split_order = "time"
        cfg_t.data.prepared_dir = None
        data_t = out_dir / f"data_{sp.label}"
        log(f"{sp.label}: preparing the inputs in time order into {data_t}")
        data_t = prepare(None, data_t, cfg_t.data, cfg_t.features).out_dir
        rows = sum(int(v.get("rows", 0)) for v in feature_map.splits.values())
        rows_t = sum(int(v.get("rows", 0)) for v in FeatureMap.load(data_t).splits.values())
        if rows and rows_t and rows != rows_t:
            raise DataError(
                f"{data_t}: the time-ordered preparation of data.* has {rows_t:,} rows but the "
                f"report's data has {rows:,}: the report's data is not the random split of the "
                f"same inputs [{sp.key}]"
            )
        out.append(DataJob(cfg_t, data_t, out_dir / f"runs_{sp.label}", natural=sp))
    return out


def run_seeds(plans: list[VariantPlan], n_seeds: int) -> dict[str, list[int]]:
    """Seed indices each training variant must have runs for (ensemble members included)."""
    out: dict[str, set[int]] = {p.name: set() for p in plans if p.trains}
    for plan in plans:
        for k in range(n_seeds):
            out[plan.run_variant].update(plan.member_seeds(k, n_seeds))
    return {name: sorted(seeds) for name, seeds in out.items()}


def train_jobs_for(jobs: list[DataJob], plans: list[VariantPlan]) -> list[TrainJob]:
    """Every training run of every data set: ``runs_dir/<variant>/seed<k>``."""
    out = []
    for job in jobs:
        needed = run_seeds(plans, job.cfg.report.seeds)
        out += [
            TrainJob(plan.name, k, variant_train_config(job.cfg, plan, k), job.data_dir, run_dir)
            for plan in plans
            if plan.trains
            for k in needed[plan.name]
            for run_dir in [job.runs_dir / plan.name / f"seed{k}"]
        ]
    return out


def check_data_for_shifts(
    shifts: list[ShiftPlan], feature_map: Any, data_dir: Path, cfg: Any
) -> None:
    """What the prepared data must hold for ``cfg``'s shifts (checked before any training;
    messages name the file that set each key)."""
    check_shifts_apply([(sp.key, sp.kind) for sp in shifts], feature_map, data_dir, cfg)
    for sp in shifts:
        if sp.options.get("space") == "original":
            where = f"{sp.key}.space" if sp.key.startswith("report.shifts") else sp.key
            check_original_space(where, feature_map, data_dir, cfg)
