"""Murphy's decomposition of the Brier score on the bins of ECE.

Murphy (1973, "A new vector partition of the probability score") splits the Brier score of
binned forecasts into three terms. With rows binned by p into the equal-width bins of
:func:`~ctrcal.metrics.ece` (``n_b`` rows in bin b, mean prediction p̄_b, click rate
ȳ_b, overall click rate ȳ):

* ``reliability`` = Σ_b (n_b/n)·(p̄_b − ȳ_b)²: the calibration term (0 when every bin's mean
  prediction equals its click rate); the squared-error twin of ECE.
* ``resolution`` = Σ_b (n_b/n)·(ȳ_b − ȳ)²: how far the bins' click rates spread from the base
  rate (higher is better: the predictions separate rows).
* ``uncertainty`` = ȳ·(1 − ȳ): the Brier score of always predicting the base rate; a
  property of the rows, not of the model.

The identity ``brier = reliability − resolution + uncertainty`` holds exactly only when every
row of a bin carries the same p. With p varying inside a bin the rest is

    ``remainder`` = (1/n)·Σ_b Σ_{i∈b} (p_i − p̄_b)² − (2/n)·Σ_b Σ_{i∈b} (p_i − p̄_b)(y_i − ȳ_b),

the within-bin variance of p minus twice the within-bin covariance of p and y (Stephenson et
al. 2008 call them the two extra components). It is reported, not hidden, so the four terms
always add up to the Brier score (to rounding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ctrcal.metrics._inputs import check_probs_labels
from ctrcal.metrics._metrics import _uniform_edges
from ctrcal.metrics._registry import declare_metric

__all__ = ["BrierDecomposition", "brier_decomposition"]


@dataclass(frozen=True)
class BrierDecomposition:
    """The Brier score and its terms (module docstring); ``brier`` = reliability − resolution
    + uncertainty + remainder."""

    brier: float
    reliability: float
    resolution: float
    uncertainty: float
    remainder: float
    n_bins: int

    def as_dict(self, prefix: str = "brier_") -> dict[str, float]:
        """The four terms as ``{prefix + term: value}`` (the Brier score itself left out)."""
        d = asdict(self)
        return {
            prefix + k: float(d[k])
            for k in ("reliability", "resolution", "uncertainty", "remainder")
        }


def brier_decomposition(probs: Any, labels: Any, n_bins: int = 15) -> BrierDecomposition:
    """Murphy's decomposition of the Brier score on ECE's equal-width bins.

    Args:
        probs: [n] predicted click probabilities.
        labels: [n] clicks, 0/1.
        n_bins: equal-width bins on [0, 1], the bins of :func:`~ctrcal.metrics.ece`
            (a probability of exactly 1 falls in one extra last bin, as there).

    Returns:
        :class:`BrierDecomposition`.
    """
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    p, y = check_probs_labels(probs, labels)
    edges = _uniform_edges(int(n_bins), p.dtype)
    idx = np.searchsorted(edges, p, side="right") - 1
    p = p.astype(np.float64, copy=False)
    nb = int(n_bins) + 1
    n = float(p.shape[0])
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    sum_p = np.bincount(idx, weights=p, minlength=nb)
    sum_y = np.bincount(idx, weights=y, minlength=nb)
    keep = counts > 0
    mp = sum_p[keep] / counts[keep]
    my = sum_y[keep] / counts[keep]
    w = counts[keep] / n
    base = float(y.mean())
    brier = float(np.mean((p - y) ** 2))
    rel = float(np.sum(w * (mp - my) ** 2))
    res = float(np.sum(w * (my - base) ** 2))
    unc = base * (1.0 - base)
    return BrierDecomposition(brier, rel, res, unc, brier - (rel - res + unc), int(n_bins))


# ---- declarations (ctrcal.metrics.METRICS) ---------------------------------------------------

for _term, _label, _better, _definition in (
    (
        "reliability",
        "Brier reliability (calibration term, lower is better)",
        "lower",
        "Murphy's reliability term of the Brier score, Σ_b (n_b/n)·(mean p_b − click rate_b)² "
        "over ECE's 15 equal-width bins; 0 is calibrated, lower is better.",
    ),
    (
        "resolution",
        "Brier resolution (higher is better)",
        "higher",
        "Murphy's resolution term, Σ_b (n_b/n)·(click rate_b − click rate)²; higher is better.",
    ),
    (
        "uncertainty",
        "Brier uncertainty",
        None,
        "Murphy's uncertainty term, click rate·(1 − click rate): the Brier score of the base rate.",
    ),
    (
        "remainder",
        "Brier remainder",
        None,
        "Brier − (reliability − resolution + uncertainty): the within-bin variance of p minus "
        "twice its within-bin covariance with the clicks (the bins' share).",
    ),
):
    declare_metric(
        f"brier_{_term}",
        label=_label,
        definition=_definition,
        better=_better,
        computed_by="brier_decomposition",
        section="scores",
        tables=("calibration", "shift")
        if _term in ("reliability", "resolution")
        else ("calibration",),
    )
