"""``ctrcal.metrics``: the metrics of CTR predictions, importable as a module.

Every metric takes ``(probs, labels)`` (torchmetrics' order) and is defined once, in
:mod:`ctrcal.eval.metrics`; this module is its public name::

    import ctrcal.metrics
    ctrcal.metrics.ece(probs, labels)
"""

from __future__ import annotations

from ctrcal.eval import metrics as _metrics
from ctrcal.eval.metrics import *  # noqa: F403 - the public names, defined there once

__all__ = list(_metrics.__all__)
