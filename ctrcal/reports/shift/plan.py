"""The shift report's plan: variants and shifts resolved from the config, checked without data.

:func:`check_report` is everything about a ``report`` section that can be checked before any
data is read or any run trained (``ctrcal validate`` and the report's own start call it):
variant chains, prediction modes (MC integration, MC-Dropout, ensembles, calibration), the
shift names, each shift's intensity grid against its domain, and the statistics settings.
Every error names the file and the dotted key. Importing this module does not import torch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

from ctrcal.config import Config, ReportConfig, VariantConfig
from ctrcal.core.constraints import check_parameters
from ctrcal.core.errors import ConfigError
from ctrcal.reports.shift.calibration_keys import calibration_spec, check_calibration_keys
from ctrcal.reports.shift.row_level import check_row_level
from ctrcal.shifts.registry import ShiftKind, check_shift_spec
from ctrcal.train.noise_options import check_noise_options

__all__ = [
    "ShiftPlan",
    "VariantPlan",
    "check_report",
    "plan_shifts",
    "plan_variants",
    "variant_train_config",
]


@dataclass(frozen=True)
class VariantPlan:
    """A variant resolved against the config: whose runs it uses and how it predicts."""

    name: str
    run_variant: str  # the variant whose trained runs this one evaluates
    config: VariantConfig
    mc_samples: int
    calibration: dict | None  # the calibrator's spec ({name: ..., <options>}), or None
    mc_dropout: bool = False
    ensemble: int = 0  # members per replicate (0 = a single run)

    def same_ranking_as(self, other: VariantPlan) -> bool:
        """Whether this variant's predictions are a strictly increasing map of ``other``'s.

        True for temperature scaling (T > 0) of the same runs predicted the same way: every
        ranking metric (AUC) then equals ``other``'s by construction. Platt scaling is left
        out (its fitted slope may be negative), and so is isotonic regression (it ties rows).
        """
        return (
            self.calibration_name == "temperature"
            and other.calibration is None
            and self.run_variant == other.run_variant
            and (self.mc_samples, self.mc_dropout, self.ensemble)
            == (other.mc_samples, other.mc_dropout, other.ensemble)
        )

    @property
    def calibration_name(self) -> str | None:
        """The registered name of the variant's calibrator (None: uncalibrated)."""
        from ctrcal.calibration.base import calibration_name

        return None if self.calibration is None else calibration_name(self.calibration)

    def needed_fields(self) -> tuple[str, ...]:
        """The segment fields the variant's calibrator reads (the clean field codes)."""
        from ctrcal.calibration.base import create_calibrator

        if self.calibration is None:
            return ()
        return create_calibrator(self.calibration).needed_fields()

    @property
    def trains(self) -> bool:
        return self.run_variant == self.name

    @property
    def has_std(self) -> bool:
        """Whether the variant yields a per-row predictive std (MC passes or ensemble)."""
        return self.mc_samples > 0 or self.ensemble >= 2

    def member_seeds(self, k: int, n_seeds: int) -> list[int]:
        """Seed indices of the runs replicate ``k`` averages.

        Replicate k uses the run of seed index k (so it stays paired with the single-run
        variants of seed k) plus M − 1 runs of seed indices ``n_seeds + k·(M−1) + j`` that no
        other replicate uses: the replicates, and so the paired differences, stay independent.
        """
        if self.ensemble < 2:
            return [k]
        extra = self.ensemble - 1
        return [k] + [n_seeds + k * extra + j for j in range(extra)]


@dataclass(frozen=True)
class ShiftPlan:
    """One shift of the report with its own grid (the clean point is shared by all)."""

    label: str
    kind: ShiftKind
    intensities: tuple[float, ...]  # the shifted levels (> 0)
    options: dict
    key: str = "report"  # where in the config it came from, for messages

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def spec(self) -> dict:
        return {"name": self.kind.name, **self.options}


def plan_shifts(cfg: Config) -> list[ShiftPlan]:
    """The shifts of ``cfg.report`` (default: one ``gaussian_numeric`` over ``intensities``).

    Raises:
        ConfigError: naming ``report.shifts[i]`` and its key.
    """
    r = cfg.report
    entries = list(r.shifts)
    if entries and list(r.intensities) != list(ReportConfig().intensities):
        raise ConfigError(
            f"{cfg.where('report.intensities')}: applies only without report.shifts (each "
            "shift has its own grid: report.shifts[i].intensities)"
        )
    if not entries:
        grid = list(r.intensities)
        if not grid or any(isinstance(s, bool) or not math.isfinite(s) or s < 0 for s in grid):
            raise ConfigError(
                f"{cfg.where('report.intensities')}: expected non-negative numbers, got {grid}"
            )
        entries = [{"name": "gaussian_numeric", "intensities": grid}]
    plans, labels = [], set()
    for i, entry in enumerate(entries):
        where = cfg.where(f"report.shifts[{i}]" if r.shifts else "report")
        kind, grid, options, label = check_shift_spec(entry, where)
        if label in labels:
            raise ConfigError(
                f"{where}.label: shift {label!r} appears twice; give each a distinct label"
            )
        labels.add(label)
        if kind.needs_time_split:
            data = cfg.data
            if data.train or data.valid or data.test:
                raise ConfigError(
                    f"{where}.name: {kind.name} trains on the first rows of data.inputs (or the "
                    "synthetic data) and tests on the last ones; explicit data.train/valid/test "
                    "files cannot be re-split in time"
                )
            if getattr(data, "split_order", "random") != "random":
                raise ConfigError(
                    f"{where}.name: {kind.name} compares a time-ordered split with the random "
                    "one; keep data.split_order: random (the clean reference)"
                )
        shifted = tuple(s for s in grid if s > 0)
        key = f"report.shifts[{i}]" if r.shifts else "report.intensities"
        plans.append(ShiftPlan(label, kind, shifted, options, key))
    return plans


def _model_dropout(cfg: Config) -> float:
    return float(getattr(cfg.model, "dropout", 0.0) or 0.0)


def plan_variants(cfg: Config) -> list[VariantPlan]:
    """Resolve ``cfg.report.variants`` (``from_variant`` chains, prediction modes) or raise.

    Raises:
        ConfigError: naming ``report.variants[i]`` and what is wrong.
    """
    variants = cfg.report.variants
    if not variants:
        raise ConfigError(f"{cfg.where('report.variants')}: at least one variant is needed")
    by_name = {v.name: v for v in variants}
    if len(by_name) != len(variants):
        names = [v.name for v in variants]
        raise ConfigError(
            f"{cfg.where('report.variants')}: variant names must be unique, got {names}"
        )
    plans = []
    for i, v in enumerate(variants):
        key = cfg.where(f"report.variants[{i}]")
        if not v.name or "/" in v.name or v.name.startswith("."):
            raise ConfigError(f"{key}.name: {v.name!r} is not usable as a directory name")
        if v.mc_samples < 0 or v.mc_samples == 1:
            raise ConfigError(f"{key}.mc_samples: expected 0 (off) or >= 2, got {v.mc_samples}")
        if v.ensemble < 0 or v.ensemble == 1:
            raise ConfigError(
                f"{key}.ensemble: expected 0 (a single run) or >= 2 members, got {v.ensemble} "
                "(an ensemble of one run is the run itself)"
            )
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
        if v.mc_dropout:
            if v.mc_samples < 2:
                raise ConfigError(
                    f"{key}.mc_dropout: MC-Dropout needs mc_samples >= 2 passes, got {v.mc_samples}"
                )
            if _model_dropout(cfg) <= 0.0:
                raise ConfigError(
                    f"{key}.mc_dropout: the model has no dropout to keep on (model.dropout is "
                    f"{_model_dropout(cfg):g}); set model.dropout > 0"
                )
        check_noise_options(v.train_shift, v.weight_noise, key)
        if v.from_variant is not None and (v.train_shift is not None or v.weight_noise is not None):
            raise ConfigError(
                f"{key}: train_shift and weight_noise change how a variant trains; a variant "
                f"with from_variant reuses the runs of {v.from_variant!r} (set them there)"
            )
        calibration = calibration_spec(v)
        plans.append(
            VariantPlan(v.name, root.name, v, v.mc_samples, calibration, v.mc_dropout, v.ensemble)
        )
    baseline = cfg.report.baseline
    if baseline is not None and baseline not in by_name:
        raise ConfigError(
            f"{cfg.where('report.baseline')}: unknown variant {baseline!r} "
            f"(valid: {', '.join(by_name)})"
        )
    r = cfg.report
    check_parameters(r, r._parameter_constraints, ConfigError, "report", cfg.where)
    check_calibration_keys(cfg)
    check_row_level(cfg)
    return plans


def check_report(cfg: Config) -> tuple[list[VariantPlan], list[ShiftPlan]]:
    """Everything about ``cfg.report`` checkable without data; returns the resolved plans."""
    return plan_variants(cfg), plan_shifts(cfg)


def variant_train_config(cfg: Config, plan: VariantPlan, k: int) -> Config:
    """The training config of variant ``plan`` for seed index ``k``."""
    out = copy.deepcopy(cfg)
    out.model = out.model.replace(net_norm=plan.config.net_norm)
    if plan.config.emb_norm is not None:
        out.model = out.model.replace(emb_norm=plan.config.emb_norm)
    noise = {}
    if plan.config.train_shift is not None:
        noise["train_shift"] = copy.deepcopy(plan.config.train_shift)
    if plan.config.weight_noise is not None:
        noise["weight_noise"] = float(plan.config.weight_noise)
    out.train = dataclasses.replace(out.train, seed=cfg.train.seed + k, **noise)
    return out
