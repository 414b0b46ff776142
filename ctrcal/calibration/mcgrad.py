"""MCGrad: multicalibration by gradient-boosted trees over segment features (Meta).

Tax et al., "MCGrad: Multicalibration at Web Scale" (KDD 2026; PyPI ``mcgrad``, MIT). Each
boosting round fits LightGBM trees on (the current logit, segment features) to the residual
log-loss, so the correction can differ per segment (per advertiser, site, device, ...) where a
global calibrator cannot; an unshrink factor per round and early stopping keep it from
overfitting. It is the calibrator MCGrad's paper compares against per-segment Platt scaling.

Segment features come in ``segments`` (field name -> per-row codes, as every segment-aware
calibrator takes them):

* ``categorical``: fields used as categories (ids; MCGrad encodes them itself);
* ``numeric``: fields used as ordered values, e.g. bucketised numerics (bucket codes are
  ordered, so a tree can split them by threshold).

With both left as None every field in ``segments`` is a category. The optional package is
needed: ``pip install ctrcal[mcgrad]``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ctrcal.calibration.base import Calibrator, Segments
from ctrcal.core.errors import NotAvailableError
from ctrcal.metrics import as_numpy

__all__ = ["MCGradCalibrator"]

_EPS = 1e-7  # MCGrad works on probabilities in (0, 1); logits are clipped to this range


_UNSHRINK_WARNING = "Unshrink is not close to 1"
_said_unshrink = False


@contextlib.contextmanager
def _unshrink_factors() -> Iterator[list[float]]:
    """Capture MCGrad's "Unshrink is not close to 1: <alpha>" log warnings into a list.

    MCGrad logs that warning from every boosting round whose unshrink factor is outside
    [0.95, 1.05]: one line per round and fit, with no context, which floods a report (a shift
    report fits a calibrator per variant and seed). The factors are kept instead
    (``unshrink_``), and :func:`_say_unshrink` says once per process what they mean.
    """
    alphas: list[float] = []

    def keep(record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_UNSHRINK_WARNING):
            alphas.append(float(record.args[0]) if record.args else float("nan"))
            return False
        return True

    logger = logging.getLogger("mcgrad.methods")
    logger.addFilter(keep)
    try:
        yield alphas
    finally:
        logger.removeFilter(keep)


def _say_unshrink(alphas: list[float]) -> None:
    global _said_unshrink
    if _said_unshrink or not alphas:
        return
    _said_unshrink = True
    print(
        f"note: mcgrad rescaled its logits by factors {min(alphas):.2f}-{max(alphas):.2f} in "
        "some boosting rounds (its 'unshrink' step: below 1 the logits were over-confident on "
        "the calibration rows, above 1 under-confident). MCGrad corrects this itself; the "
        "factors are kept in the calibrator's unshrink_ (said once per process).",
        file=sys.stderr,
    )


def _require_mcgrad() -> None:
    if importlib.util.find_spec("mcgrad") is None:
        raise NotAvailableError(
            "calibrator 'mcgrad' needs the optional package mcgrad: pip install ctrcal[mcgrad]"
        )


class MCGradCalibrator(Calibrator):
    """MCGrad over chosen segment fields, behind the Calibrator contract.

    Args:
        categorical: fields used as categories (None: every field given, unless ``numeric``
            names it).
        numeric: fields used as ordered values (bucketised numerics).
        num_rounds: boosting rounds at most (None: MCGrad's default, 100 with early stopping).
        early_stopping: choose the number of rounds on held-out folds (MCGrad's default).
        lightgbm_params: LightGBM parameters overriding MCGrad's tuned defaults.
        num_threads: LightGBM threads (None: its default, every core; on a shared machine
            1 avoids OpenMP oversubscription, which can slow the trees down tenfold).
        seed: MCGrad's ``random_state`` (same seed, same fit).

    Attributes:
        model_: the fitted ``mcgrad.methods.MCGrad``.
        categorical_: the categorical fields it was fitted on.
        numeric_: the numeric fields it was fitted on.
    """

    def __init__(
        self,
        categorical: Sequence[str] | None = None,
        numeric: Sequence[str] | None = None,
        num_rounds: int | None = None,
        early_stopping: bool = True,
        lightgbm_params: Mapping[str, Any] | None = None,
        num_threads: int | None = None,
        seed: int = 0,
    ) -> None:
        _require_mcgrad()
        for name, value in (("categorical", categorical), ("numeric", numeric)):
            if value is not None and (
                isinstance(value, str) or not all(isinstance(v, str) for v in value)
            ):
                raise ValueError(f"{name}: expected a list of field names, got {value!r}")
        if num_rounds is not None and not (isinstance(num_rounds, int) and num_rounds >= 1):
            raise ValueError(f"num_rounds: expected an integer >= 1, got {num_rounds!r}")
        self.categorical = None if categorical is None else list(categorical)
        self.numeric = None if numeric is None else list(numeric)
        self.num_rounds = num_rounds
        self.early_stopping = bool(early_stopping)
        if num_threads is not None and not (isinstance(num_threads, int) and num_threads >= 1):
            raise ValueError(f"num_threads: expected an integer >= 1, got {num_threads!r}")
        self.lightgbm_params = None if lightgbm_params is None else dict(lightgbm_params)
        self.num_threads = num_threads
        self.seed = seed

    def needed_fields(self) -> tuple[str, ...]:
        """The fields named by ``categorical`` and ``numeric``."""
        return tuple(self.categorical or ()) + tuple(self.numeric or ())

    def _fields(self, segments: Segments | None) -> tuple[list[str], list[str]]:
        """(categorical, numeric) fields to fit on, given the segments at hand."""
        if not segments:
            raise ValueError("mcgrad: needs segment features (segments: field -> [n] codes)")
        numeric = list(self.numeric or ())
        if self.categorical is None:
            return [k for k in segments if k not in numeric], numeric
        return list(self.categorical), numeric

    @staticmethod
    def _columns(segments: Segments | None, fields: list[str], n: int) -> dict[str, np.ndarray]:
        missing = [k for k in fields if k not in (segments or {})]
        if missing:
            raise ValueError(
                f"mcgrad: segments lack {', '.join(missing)} "
                f"(given: {', '.join(map(str, segments or {})) or 'none'})"
            )
        cols = {}
        for k in fields:
            v = as_numpy(segments[k], f"segments[{k!r}]")
            if v.shape[0] != n:
                raise ValueError(f"segments[{k!r}]: expected {n} values, got {v.shape[0]}")
            cols[f"seg_{k}"] = v
        return cols

    def _frame(self, z: np.ndarray, cols: dict, labels: np.ndarray | None = None):
        import pandas as pd

        p = np.clip(0.5 * (1.0 + np.tanh(0.5 * z)), _EPS, 1.0 - _EPS)
        data = {"prediction": p, **cols}
        if labels is not None:
            data["label"] = labels
        return pd.DataFrame(data)

    def fit(self, logits: Any, labels: Any, segments: Segments | None = None):
        """Fit on validation logits [n], 0/1 labels [n] and segment codes; returns self."""
        from mcgrad.methods import MCGrad

        z = as_numpy(logits, "logits").astype(np.float64)
        y = as_numpy(labels, "labels").astype(np.float64)
        if y.shape != z.shape:
            raise ValueError(f"logits and labels differ in length: {z.size} vs {y.size}")
        if not np.isfinite(z).all():
            raise ValueError("logits contains NaN or infinite values")
        if not np.isin(y, (0.0, 1.0)).all() or y.min() == y.max():
            raise ValueError("labels: expected 0/1 clicks with both classes present")
        categorical, numeric = self._fields(segments)
        cols = self._columns(segments, categorical + numeric, z.shape[0])
        options: dict[str, Any] = {"random_state": self.seed, "early_stopping": self.early_stopping}
        if self.num_rounds is not None:
            options["num_rounds"] = self.num_rounds
        params = dict(self.lightgbm_params or {})
        if self.num_threads is not None:
            params["num_threads"] = self.num_threads
        if params:
            options["lightgbm_params"] = params
        model = MCGrad(**options)
        with _unshrink_factors() as alphas:
            model.fit(
                self._frame(z, cols, y.astype(np.int64)),
                "prediction",
                "label",
                categorical_feature_column_names=[f"seg_{k}" for k in categorical],
                numerical_feature_column_names=[f"seg_{k}" for k in numeric],
            )
        _say_unshrink(alphas)
        self.model_, self.categorical_, self.numeric_ = model, categorical, numeric
        self.unshrink_ = alphas
        return self

    def transform(self, logits: Any, segments: Segments | None = None) -> np.ndarray:
        """Calibrated logits [n] of logits [n] and the rows' segment codes."""
        if not hasattr(self, "model_"):
            raise RuntimeError("MCGradCalibrator is not fitted; call fit() first")
        z = as_numpy(logits, "logits").astype(np.float64)
        cols = self._columns(segments, self.categorical_ + self.numeric_, z.shape[0])
        p = self.model_.predict(
            self._frame(z, cols),
            "prediction",
            categorical_feature_column_names=[f"seg_{k}" for k in self.categorical_],
            numerical_feature_column_names=[f"seg_{k}" for k in self.numeric_],
        )
        p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
        return np.log(p) - np.log1p(-p)
