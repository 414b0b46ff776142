"""Row-level analyses of the shift report: bootstrap intervals, risk–coverage, time windows.

The report's means and standard errors are over training seeds. Three analyses look at the
rows of one evaluation instead:

* **Row-bootstrap intervals** (``report.bootstrap: B``): ECE, PCOC and AUC of every variant's
  clean evaluation of training seed 0 with their 95 % Poisson-bootstrap intervals over rows
  (:func:`ctrcal.metrics.bootstrap_ci`): how much a metric moves with the test rows
  alone.
* **Risk–coverage** (always, for every variant with a per-row predictive std): AUC and logloss
  on the 50 / 80 / 100 % most confident rows (:func:`ctrcal.metrics.risk_coverage`),
  recorded as metrics ``auc@50%`` ... at every point of the grid.
* **Calibration over time** (``report.windows: N``, a time-ordered split): for every
  calibrated variant (training seed 0) the test period in N consecutive windows, the
  calibrator fitted once on validation (stale) against one refitted on the previous window
  (fresh) and the uncalibrated model (:func:`ctrcal.reports.shift.windows.calibration_over_time`).

:func:`check_row_level` holds the rules for the two keys (``ctrcal validate`` runs it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import ConfigError, DataError

__all__ = [
    "RowLevel",
    "WindowReport",
    "check_row_level",
    "check_time_ordered",
    "oracle_probs",
    "risk_coverage_values",
    "window_report",
]

BOOTSTRAP_LEVEL = 0.95


def check_row_level(cfg: Any) -> None:
    """Check that ``report.windows`` can cut the config's data (no data needed).

    Raises:
        ConfigError: naming the key and what was expected.
    """
    r = cfg.report  # its bounds (windows 0 or >= 2) are ReportConfig's, checked before
    if not r.windows:
        return
    if cfg.data.prepared_dir is None and cfg.data.split_order != "time":
        raise ConfigError(
            f"{cfg.where('report.windows')}: needs a time-ordered split (data.split_order: time), "
            f"got data.split_order: {cfg.data.split_order}"
        )
    if r.split != "test":
        raise ConfigError(
            f"{cfg.where('report.windows')}: the windows cut the test period, after the validation "
            f"rows the stale calibrator is fitted on; set report.split: test (got {r.split})"
        )
    from ctrcal.reports.shift.calibration_keys import calibration_spec

    if not any(calibration_spec(v) is not None for v in r.variants):
        raise ConfigError(
            f"{cfg.where('report.windows')}: compares calibrators over time; add a variant with "
            "calibration: (e.g. {name: w, from_variant: <variant>, calibration: platt})"
        )


def check_time_ordered(data_dir: Path, cfg: Any) -> None:
    """Raise unless the prepared data's splits were cut in time order (``report.windows`` of
    ``cfg``, whose file the message names)."""
    try:
        split = json.loads((Path(data_dir) / "feature_map.json").read_text()).get("split")
    except (OSError, ValueError):
        split = None
    if not (isinstance(split, dict) and split.get("order") == "time"):
        raise ConfigError(
            f"{cfg.where('report.windows')}: the data in {data_dir} was not split in time order "
            "(prepare it with data.split_order: time)"
        )


def risk_coverage_values(probs: np.ndarray, labels: np.ndarray, std: np.ndarray) -> dict:
    """``{"auc@50%": ..., "logloss@50%": ..., ...}`` of one evaluation (rows with a std)."""
    from ctrcal.metrics import risk_coverage

    return risk_coverage(probs, labels, std).as_dict()


@dataclass(frozen=True)
class WindowReport:
    """Calibration over time of one calibrated variant (training seed 0).

    Attributes:
        variant: the report variant.
        result: the per-window metrics (:class:`~ctrcal.reports.shift.windows.WindowMetrics`).
        sentence: after how many windows the stale calibrator falls detectably behind.
        oracle_ece: the ECE of the generator's true probabilities per window (the floor of
            that window's sample), or None for real data.
    """

    variant: str
    result: Any
    sentence: str
    oracle_ece: list[float] | None = None  # per window, of the true probabilities (synthetic)


@dataclass
class RowLevel:
    """What the row-level analyses produced (the risk–coverage metrics live in the rows).

    Attributes:
        bootstrap: variant -> {"ece", "pcoc", "auc"} -> BootstrapCI of its clean evaluation
            of training seed 0.
        n_boot: bootstrap replicates.
        windows: one :class:`WindowReport` per calibrated variant.
        segments: variant -> point -> the worst segments of training seed 0
            (:func:`~ctrcal.reports.shift.shift_tables.record_segments`).
    """

    bootstrap: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_boot: int = 0
    windows: list[WindowReport] = field(default_factory=list)
    segments: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` entry ``row_level``."""
        return {
            "bootstrap": {
                "replicates": self.n_boot,
                "level": BOOTSTRAP_LEVEL,
                "clean_seed0": {
                    v: {m: ci.as_dict() for m, ci in cis.items()}
                    for v, cis in self.bootstrap.items()
                },
            },
            "windows": [
                {
                    "variant": w.variant,
                    "calibrator": w.result.calibrator,
                    "fitted_on": w.result.fitted_on,
                    "sentence": w.sentence,
                    "oracle_ece": w.oracle_ece,
                    "first_detectable": w.result.first_detectable(),
                    **w.result.records(),
                }
                for w in self.windows
            ],
            "segments": self.segments,
        }


def oracle_probs(data_dir: Path, split: str, labels: np.ndarray) -> np.ndarray | None:
    """The generator's true probabilities of ``split`` in row order (None for real data, or
    when its rows do not line up with ``labels``)."""
    import pyarrow.parquet as pq

    from ctrcal.preparation.write import PROB_COL

    files = sorted((Path(data_dir) / split).glob("*.parquet"))
    if not files or PROB_COL not in pq.read_schema(files[0]).names:
        return None
    parts = [pq.read_table(f, columns=[PROB_COL, "label"]) for f in files]
    prob = np.concatenate([t.column(PROB_COL).to_numpy() for t in parts]).astype(np.float64)
    lab = np.concatenate([t.column("label").to_numpy() for t in parts]).astype(np.float64)
    if lab.shape != labels.shape or not np.array_equal(lab, labels):
        return None
    return prob


def window_report(
    variant: str,
    spec: Any,
    test: tuple[np.ndarray, np.ndarray, dict | None],
    valid: tuple[np.ndarray, np.ndarray, dict | None],
    report: Any,
    seed: int = 0,
    oracle: np.ndarray | None = None,
) -> WindowReport:
    """Stale vs fresh vs uncalibrated per window of the test period, in row (time) order.

    Args:
        variant: the variant's name.
        spec: its calibrator spec.
        test: (logits [n], labels [n], segments) of the test split in time order.
        valid: the same of the validation split (the stale calibrator's fitting set).
        report: the report config (``windows``, ``bootstrap`` or 200 replicates for the
            detectable difference, ``alpha``, ``power``, ``field_min_count``).
        seed: the paired bootstrap's seed.
        oracle: [n] the true probabilities of the test rows (synthetic data), or None.
    """
    from ctrcal import metrics as M
    from ctrcal.reports.shift.windows import calibration_over_time, decay_sentence, windows

    z, y, segs = test
    try:
        result = calibration_over_time(
            z,
            y,
            np.arange(z.shape[0]),
            report.windows,
            spec,
            segments=segs,
            validation=valid,
            n_boot=report.bootstrap or 200,
            alpha=report.alpha,
            power=report.power,
            min_count=report.field_min_count,
            seed=seed,
        )
    except ValueError as exc:
        raise DataError(f"report.windows: {variant}: {exc}") from None
    oracle_ece = None
    if oracle is not None:  # the same windows: time is the row order
        parts = windows(np.arange(z.shape[0]), report.windows)
        oracle_ece = [float(M.ece(oracle[rows], y[rows])) for rows in parts]
    return WindowReport(variant, result, decay_sentence(result), oracle_ece)
