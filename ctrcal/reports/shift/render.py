"""Rendering a shift report: every file of a report directory, all prose and all figures.

:func:`write_report` takes the numbers (a :class:`~ctrcal.reports.shift.stats.Summary`) and how the
report was made (a :class:`ReportMeta`) and writes ``results.csv``, ``summary.json``,
``report.md`` (:mod:`ctrcal.reports.shift.markdown`, :mod:`ctrcal.reports.shift.verdict`) and the
figures
(:mod:`ctrcal.reports.shift.figures`). Nothing here computes a statistic.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrcal.core.utils import write_json_atomic, write_text_atomic
from ctrcal.reports.shift.markdown import render_markdown, shift_infos
from ctrcal.reports.shift.row_level import RowLevel
from ctrcal.reports.shift.stats import Summary, format_intensity
from ctrcal.reports.shift.verdict import verdict_sentence

__all__ = [
    "REPORT_OUTPUTS",
    "ReportMeta",
    "ReportPaths",
    "Timing",
    "TrainingInfo",
    "describe_variant",
    "finish_message",
    "fmt_seconds",
    "write_report",
]

# what write_report writes into a report directory (glob patterns of the names)
REPORT_OUTPUTS = ("results.csv", "summary.json", "report.md", "fig_*.png")


def fmt_seconds(s: float) -> str:
    """``1m17s``, ``2h03m09s``."""
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m{s % 60:02d}s"
    return f"{s // 60}m{s % 60:02d}s"


@dataclass
class Timing:
    """Wall time of a report's phases, in seconds (``eval_by_variant``: each variant's share
    of the evaluation, its calibrators' fits included)."""

    train: float
    eval: float
    total: float
    eval_by_variant: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainingInfo:
    """How the report's runs were trained.

    Attributes:
        workers: the device of each worker (one entry: trained in the report's process).
        threads_per_run: intra-op threads of each run.
        runs: counts by outcome (``trained``, ``reused``, ``resumed``).
    """

    workers: list[str]
    threads_per_run: int
    runs: dict[str, int]


@dataclass
class ReportMeta:
    """How a report was made: everything it states besides the numbers.

    Attributes:
        split: the split evaluated (``test`` or ``valid``).
        rows: its rows.
        mix_fraction: the fraction of each batch's rows shifted.
        noise_seeds: noise seeds per shift point.
        device: where it was evaluated (and trained, in words).
        variant_descriptions: one line per variant (:func:`describe_variant`).
        shifts: one dict per shift: ``label``, ``name``, ``description``, ``unit``,
            ``intensities``, its options (``space``) and, for Gaussian noise,
            ``numeric_fields`` and the stds in both spaces.
        oracle: the true probabilities' AUC / logloss (synthetic data), or None.
        oracle_calibration: the true probabilities' calibration metrics, or None.
        timing: wall time per phase, or None.
        training: how the runs were trained, or None.
        runs_dir: where the runs are.
        data_dir: the prepared data.
        train_seeds: the training seed of each seed index.
        config: the whole config as plain data.
    """

    split: str = "test"
    rows: int = 0
    mix_fraction: float = 1.0
    noise_seeds: int = 1
    device: str = "cpu"
    variant_descriptions: list[str] = field(default_factory=list)
    shifts: list[dict[str, Any]] = field(default_factory=list)
    oracle: dict[str, float] | None = None
    oracle_calibration: dict[str, float] | None = None
    timing: Timing | None = None
    training: TrainingInfo | None = None
    runs_dir: str = "runs/"
    data_dir: str | None = None
    train_seeds: list[int] = field(default_factory=list)
    config: dict[str, Any] | None = None

    @property
    def elapsed(self) -> str:
        t = self.timing
        if t is None:
            return "n/a"
        return (
            f"{fmt_seconds(t.total)} (training {fmt_seconds(t.train)}, evaluation "
            f"{fmt_seconds(t.eval)})"
        )

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` keys of the meta (``timing_s``, ``elapsed`` among them)."""
        out = dataclasses.asdict(self)
        out["timing_s"] = out.pop("timing")
        out["elapsed"] = self.elapsed
        return out


@dataclass
class ReportPaths:
    """Where a report was written."""

    out_dir: Path
    results_csv: Path
    summary_json: Path
    report_md: Path
    figures: dict[str, Path] = field(default_factory=dict)

    @property
    def main_figure(self) -> Path | None:
        return next((p for k, p in self.figures.items() if k.startswith("auc_ece")), None)


def _norm_text(spec: Any) -> str:
    if spec is None:
        return "none"
    return spec.name + (
        "(" + ", ".join(f"{k}={v}" for k, v in spec.kwargs.items()) + ")" if spec.kwargs else ""
    )


def _calibration_text(spec: dict[str, Any]) -> str:
    name = spec["name"]
    if name == "field_aware":
        return (
            f"field-aware {spec.get('method', 'platt')} calibration on {spec.get('field')} "
            f"(shrinkage {float(spec.get('shrinkage', 1000.0)):g}) on clean validation"
        )
    what = {
        "temperature": "temperature scaling",
        "platt": "platt scaling",
        "isotonic": "isotonic regression",
    }.get(name, f"{name} calibration")
    options = {k: v for k, v in spec.items() if k != "name"}
    if options:
        what += " (" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
    return f"{what} on clean validation"


def _training_noise_text(variant: Any, train: Any) -> list[str]:
    """How a variant's runs were trained with noise (its own keys, else the train section's)."""
    shift = variant.train_shift if variant.train_shift is not None else train.train_shift
    eta = variant.weight_noise if variant.weight_noise is not None else train.weight_noise
    out = []
    if shift is not None:
        from ctrcal.shifts.registry import get_shift

        kind = get_shift(shift.name)
        level = (
            format_intensity(shift.intensity, "p")
            if kind.unit == "p"
            else f"{shift.intensity:g} {kind.unit}"
        )
        space = shift.space or kind.options.get("space", (None,))[0]
        where = f" in {space} space" if space else ""
        out.append(f"trained with input noise {kind.name} {level}{where}")
    if eta:
        out.append(f"trained with weight noise N(0, {eta:g})")
    return out


def describe_variant(plan: Any, cfg: Any) -> str:
    """One line on a variant: its norms (or whose runs), how it predicts, its calibrator.

    Args:
        plan: a :class:`~ctrcal.reports.shift.plan.VariantPlan`.
        cfg: the whole config.
    """
    bits = []
    if plan.trains:
        emb = plan.config.emb_norm
        emb = emb if emb is not None else cfg.model.get("emb_norm")
        where = "MaskBlocks" if cfg.model.name == "masknet" else f"{cfg.model.name} net_norm"
        bits.append(f"{where} {_norm_text(plan.config.net_norm)}, fields {_norm_text(emb)}")
        bits.extend(_training_noise_text(plan.config, cfg.train))
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
        bits.append(_calibration_text(plan.calibration))
    return f"{plan.name} ({'; '.join(bits)})"


def write_report(
    summary: Summary,
    out_dir: str | Path,
    meta: ReportMeta | None = None,
    *,
    reliability: dict[str, dict[Any, dict[str, Any]]] | None = None,
    figures: bool = True,
    row_level: RowLevel | None = None,
) -> ReportPaths:
    """Write results.csv, summary.json, report.md and (with ``figures``) the PNG figures.

    Args:
        summary: the numbers (:func:`~ctrcal.reports.shift.stats.summarize_report`).
        out_dir: report directory (created).
        meta: how the report was made (default: what the results table itself tells).
        reliability: pooled reliability-curve data ``{variant: {(shift, intensity): {...}}}``.
        figures: write PNG figures.
        row_level: the row-bootstrap intervals and time windows
            (:mod:`ctrcal.reports.shift.row_level`).
    """
    from ctrcal.reports.shift.figures import write_figures
    from ctrcal.reports.shift.monitoring import monitor_lines
    from ctrcal.reports.shift.row_level_render import row_level_figures, row_level_lines
    from ctrcal.reports.shift.shift_tables import label_free_lines, segment_lines

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if meta is None:
        meta = ReportMeta(noise_seeds=int(summary.results["noise_seed"].nunique()))
    shifts = shift_infos(meta.shifts, summary.table)
    units = {i["label"]: i.get("unit", "std") for i in shifts}
    verdict = verdict_sentence(summary, units)

    paths = ReportPaths(
        out_dir, out_dir / "results.csv", out_dir / "summary.json", out_dir / "report.md"
    )
    write_text_atomic(paths.results_csv, summary.results.to_csv(index=False))
    if figures:
        paths.figures = write_figures(
            summary.table, reliability, out_dir, summary.variants, shifts, summary.baseline
        )
        if row_level is not None:
            paths.figures.update(row_level_figures(row_level, out_dir))
    extra = row_level_lines(row_level, paths.figures)
    extra += label_free_lines(summary.table, summary.variants, shifts)
    extra += monitor_lines(summary.table, summary.variants, shifts, summary.results)
    extra += segment_lines(row_level.segments if row_level is not None else {})
    write_text_atomic(
        paths.report_md, render_markdown(summary, meta, paths.figures, shifts, extra=extra)
    )
    payload = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **meta.to_json(),
        "variant_names": summary.variants,
        "n_seeds": summary.n_seeds,
        "baseline": summary.baseline,
        "alpha": summary.alpha,
        "power": summary.power,
        "shifts": shifts,
        "verdict": verdict,
        **({"row_level": row_level.to_json()} if row_level is not None else {}),
        "summary": summary.table.to_dict(orient="records"),
        "paired": summary.paired.to_dict(orient="records"),
        "reliability": {
            v: {f"{k[0]}@{k[1]:g}" if isinstance(k, tuple) else k: c for k, c in by.items()}
            for v, by in (reliability or {}).items()
        },
        "files": {
            "results_csv": paths.results_csv.name,
            "report_md": paths.report_md.name,
            "figures": {k: p.name for k, p in paths.figures.items()},
        },
    }
    write_json_atomic(paths.summary_json, payload)
    return paths


def finish_message(paths: ReportPaths, elapsed_s: float) -> str:
    """What the CLI prints at the end: the verdict, total time, report and figure paths."""
    summary = json.loads(paths.summary_json.read_text())
    lines = ["", summary.get("verdict", ""), "", f"total time: {fmt_seconds(elapsed_s)}"]
    lines.append(f"report: {paths.report_md}")
    if paths.main_figure is not None:
        lines.append(f"figure: {paths.main_figure}")
    return "\n".join(lines)
