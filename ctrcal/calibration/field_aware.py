"""Field-aware calibration: one calibrator per value of a field, shrunk toward the global one.

A model calibrated on average can be off by 30 % for a large advertiser or site; a global
calibrator cannot fix that, a calibrator per field value can (Pan et al., "Field-aware
Calibration", WWW 2020, calibrate per field value for the same reason). Small values would
overfit, so each value's calibrator is blended with the global one by its row count n_v:

    w_v = n_v / (n_v + shrinkage)

* ``method="platt"``: per value ``a_v · z + b_v``, fitted for all values at once by Newton's
  method on the per-value NLL (gradients and Hessians of every value from ``bincount``; a
  weak quadratic pull toward the global (a, b) keeps values whose clicks are separable by z
  finite). The blend is on the parameters: ``a ← w_v a_v + (1 − w_v) a``, same for b.
* ``method="isotonic"``: per value an
  :class:`~ctrcal.calibration.isotonic.IsotonicCalibration`;
  the blend is on probabilities, ``p ← w_v p_v(z) + (1 − w_v) p(z)``.

Values with fewer than ``min_count`` validation rows, or without both clicks and non-clicks,
and values never seen in validation use the global calibrator alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ctrcal.calibration.base import Calibrator, Segments, fit_inputs, logit
from ctrcal.calibration.base import sigmoid as _sigmoid_like
from ctrcal.calibration.isotonic import IsotonicCalibration
from ctrcal.calibration.scaling import PlattScaling
from ctrcal.metrics import as_numpy

__all__ = ["FieldAwareCalibration"]


def _codes(values: Any, n: int, name: str = "values") -> np.ndarray:
    v = as_numpy(values, name)
    if v.shape[0] != n:
        raise ValueError(f"{name}: expected {n} values (one per logit), got {v.shape[0]}")
    if not (np.issubdtype(v.dtype, np.integer) or v.dtype == np.bool_):
        raise ValueError(f"{name}: expected integer codes of the field, got dtype {v.dtype}")
    return v.astype(np.int64, copy=False)


def _like(out: np.ndarray, ref: Any) -> Any:
    if hasattr(ref, "detach"):
        import torch

        return torch.as_tensor(out, device=ref.device).to(ref.dtype)
    return out


class FieldAwareCalibration(Calibrator):
    """Per-value Platt or isotonic calibration of one field, shrunk toward the global one.

    ``fit`` and ``transform`` take the field's integer codes [n] either in ``segments``
    (a mapping of field name to codes, read at ``field``) or directly as an array.

    Args:
        field: the field whose values get their own calibrator (the key read from
            ``segments``; None: the codes are passed as an array).
        method: ``"platt"`` or ``"isotonic"``.
        shrinkage: pseudo-rows of the global calibrator in each value's blend (>= 0; 0 trusts
            every fitted value fully).
        min_count: values with fewer validation rows use the global calibrator alone.
        max_iter: Newton iterations of the per-value Platt fit.
        tol: stop when every parameter step is below this.
        eps: logit clipping of isotonic probabilities.

    Attributes:
        global_: the global calibrator (:class:`PlattScaling` or :class:`IsotonicCalibration`).
        values_: [V] field values with their own calibrator, sorted.
        counts_: [V] their validation rows.
        weights_: [V] their blend weights w_v.
        coef_, intercept_: [V] blended per-value Platt parameters (``method="platt"``).
        calibrators_: V per-value isotonic calibrators (``method="isotonic"``).
    """

    _learned = ("global_",)

    def __init__(
        self,
        field: str | None = None,
        method: Literal["platt", "isotonic"] = "platt",
        shrinkage: float = 1000.0,
        min_count: int = 100,
        max_iter: int = 50,
        tol: float = 1e-8,
        eps: float = 1e-7,
    ) -> None:
        self.field = field
        self.method = method
        self.shrinkage = shrinkage
        self.min_count = min_count
        self.max_iter = max_iter
        self.tol = tol
        self.eps = eps
        self._check_params()  # a bad spec fails where the config is checked, not after training

    def _check_params(self) -> None:
        if self.method not in ("platt", "isotonic"):
            raise ValueError(f"method: expected 'platt' or 'isotonic', got {self.method!r}")
        if not (isinstance(self.shrinkage, (int, float)) and self.shrinkage >= 0):
            raise ValueError(f"shrinkage: expected a number >= 0, got {self.shrinkage!r}")
        if not isinstance(self.min_count, (int, np.integer)) or self.min_count < 2:
            raise ValueError(f"min_count: expected an integer >= 2, got {self.min_count!r}")

    def needed_fields(self) -> tuple[str, ...]:
        return () if self.field is None else (self.field,)

    def _values(self, segments: Segments | np.ndarray | None) -> Any:
        if isinstance(segments, Mapping):
            if self.field is None or self.field not in segments:
                raise ValueError(
                    f"field-aware calibration needs the codes of field {self.field!r} "
                    f"(given: {', '.join(map(str, segments)) or 'none'})"
                )
            return segments[self.field]
        if segments is None:
            raise ValueError("field-aware calibration needs the field's codes (segments)")
        return segments

    def fit(
        self, logits: Any, labels: Any, segments: Segments | np.ndarray | None = None
    ) -> FieldAwareCalibration:
        """Fit on logits [n], 0/1 labels [n] and the field's integer codes [n]; returns self."""
        self._check_params()
        z, y = fit_inputs(logits, labels)
        v = _codes(self._values(segments), z.shape[0])
        uniq, inv = np.unique(v, return_inverse=True)
        inv = inv.reshape(-1)
        count = np.bincount(inv, minlength=uniq.size)
        clicks = np.bincount(inv, weights=y, minlength=uniq.size)
        eligible = (count >= self.min_count) & (clicks > 0) & (clicks < count)
        self.values_ = uniq[eligible]
        self.counts_ = count[eligible]
        self.weights_ = self.counts_ / (self.counts_ + float(self.shrinkage))
        rows = eligible[inv]
        # codes 0..V-1 of the eligible values, for the rows that have one
        remap = np.cumsum(eligible) - 1
        code = remap[inv[rows]]
        if self.method == "platt":
            self.global_ = PlattScaling().fit(z, y)
            a, b = self._fit_platt(z[rows], y[rows], code, self.values_.size)
            g_a, g_b = self.global_.coef_, self.global_.intercept_
            self.coef_ = self.weights_ * a + (1 - self.weights_) * g_a
            self.intercept_ = self.weights_ * b + (1 - self.weights_) * g_b
        else:
            self.global_ = IsotonicCalibration(eps=self.eps).fit(z, y)
            order = np.argsort(code, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(self.counts_)])
            zr, yr = z[rows][order], y[rows][order]
            self.calibrators_ = [
                IsotonicCalibration(eps=self.eps).fit(zr[s:e], yr[s:e])
                for s, e in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        return self

    def _fit_platt(
        self, z: np.ndarray, y: np.ndarray, code: np.ndarray, n_values: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-value (a_v, b_v) minimising Σ_{i∈v} NLL + (ridge/2)·|θ_v − θ_global|²."""
        g = np.array([self.global_.coef_, self.global_.intercept_])
        a = np.full(n_values, g[0])
        b = np.full(n_values, g[1])
        ridge = 1e-3  # a thousandth of a row: enough to keep separable values finite
        for _ in range(self.max_iter):
            t = a[code] * z + b[code]
            s = _sigmoid_like(t)
            r = s - y
            w = s * (1.0 - s)
            ga = np.bincount(code, weights=r * z, minlength=n_values) + ridge * (a - g[0])
            gb = np.bincount(code, weights=r, minlength=n_values) + ridge * (b - g[1])
            haa = np.bincount(code, weights=w * z * z, minlength=n_values) + ridge
            hab = np.bincount(code, weights=w * z, minlength=n_values)
            hbb = np.bincount(code, weights=w, minlength=n_values) + ridge
            det = haa * hbb - hab * hab
            da = (hbb * ga - hab * gb) / det
            db = (haa * gb - hab * ga) / det
            # a bounded step: the NLL is convex, but a full Newton step from far away can
            # overshoot into the flat region of the sigmoid
            scale = np.minimum(1.0, 2.0 / np.maximum(np.abs(da), np.abs(db)).clip(1e-300))
            a -= scale * da
            b -= scale * db
            if (
                np.max(np.abs(scale * da), initial=0.0) < self.tol
                and np.max(np.abs(scale * db), initial=0.0) < self.tol
            ):
                break
        return a, b

    def _lookup(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index into values_ of every row, and whether the row's value has one."""
        if self.values_.size == 0:
            return np.zeros(v.shape[0], dtype=np.intp), np.zeros(v.shape[0], dtype=bool)
        idx = np.minimum(np.searchsorted(self.values_, v), self.values_.size - 1)
        return idx, self.values_[idx] == v

    def predict_proba(self, logits: Any, segments: Segments | np.ndarray | None = None) -> Any:
        """Calibrated click probabilities [n] for logits [n] of rows with field codes [n]."""
        self._check_fitted()
        z = np.asarray(as_numpy(logits, "logits"), dtype=np.float64)
        v = _codes(self._values(segments), z.shape[0])
        idx, found = self._lookup(v)
        if self.method == "platt":
            a = np.full(z.shape[0], self.global_.coef_)
            b = np.full(z.shape[0], self.global_.intercept_)
            a[found] = self.coef_[idx[found]]
            b[found] = self.intercept_[idx[found]]
            return _like(_sigmoid_like(a * z + b), logits)
        p = np.asarray(self.global_.predict_proba(z), dtype=np.float64)
        rows = np.flatnonzero(found)
        if rows.size:
            order = rows[np.argsort(idx[rows], kind="stable")]
            sizes = np.bincount(idx[rows], minlength=self.values_.size)
            bounds = np.concatenate([[0], np.cumsum(sizes)])
            for j in np.flatnonzero(sizes):  # one vectorised call per fitted value present
                r = order[bounds[j] : bounds[j + 1]]
                w = self.weights_[j]
                p[r] = w * self.calibrators_[j].predict_proba(z[r]) + (1 - w) * p[r]
        return _like(p, logits)

    def transform(self, logits: Any, segments: Segments | np.ndarray | None = None) -> Any:
        """Calibrated logits [n] (``logit`` of :meth:`predict_proba`, clipped by ``eps``)."""
        return logit(self.predict_proba(logits, segments), eps=self.eps)
