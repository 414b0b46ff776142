"""Every metric declared once: its function, direction, label and definition.

A metric is one :class:`Metric` in :data:`METRICS`, a :class:`~ctrcal.core.registry.Registry`
(the one every pluggable thing in ctrcal uses), declared beside the function that computes it
with :func:`declare_metric`. The reports, the deploy gate, the shift report's tables and tests
and the docs' lists read this table and nothing else: a new metric is one declaration (and its
test), and it appears in every table its declaration names::

    import numpy as np
    from ctrcal.metrics import declare_metric, METRICS

    def mean_p(probs, labels):
        return float(np.mean(probs))

    declare_metric(
        "mean_p",
        label="mean probability",
        definition="mean of the predicted click probabilities, mean p.",
        better=None,  # neither direction is better
        compute=mean_p,  # (probs, labels) -> float
        section="calibration",
        tables=("calibration",),  # a row of calibration-report's table; a --gate metric
    )
    METRICS.get("mean_p").compute(np.array([0.1, 0.3]), np.array([0, 1]))  # 0.2

What a metric needs decides the signature of ``compute``: a ``labelled`` metric is
``compute(probs, labels) -> float`` (torchmetrics' order), a ``label_free`` estimate
``compute(probs) -> float`` (no clicks; ``auc_est``), and a ``drift`` score or a ``derived``
value (made by a report from other values: ``auc_retained``) may name what computes it in
``computed_by`` instead. Many metrics come in families computed together (one sort for ECCE
and equal-mass ECE): they give ``computed_by`` (``"calibration_summary"``) and the report
reads them from that family's result.

Keys with a part of their own are declared once with a placeholder: ``field_rce:<field>``
(one value per field) and ``auc@<c>%`` (per coverage); :func:`metric_of` finds the declaration
of ``field_rce:C14`` and ``auc@50%``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from ctrcal.core.registry import Registry

__all__ = [
    "KINDS",
    "METRICS",
    "SECTIONS",
    "TABLES",
    "Metric",
    "declare_metric",
    "metric_of",
    "metrics_in",
]

Better = Literal["higher", "lower"]

# what a metric is computed from (and so the signature of its compute)
KINDS = ("labelled", "label_free", "drift", "derived")
# the order metrics are listed in, by what they measure
SECTIONS = (
    "ranking",
    "calibration",
    "scores",
    "bin-free",
    "fields",
    "segments",
    "uncertainty",
    "label-free",
    "drift",
)
# the tables a declaration may ask to be listed in:
#   calibration: a row of calibration-report's metric table (with bootstrap, floor and the
#                paired comparison), and so a metric a --gate rule may name;
#   shift:       a section of the shift report (a table per shift, mean ± SE per point);
#   compared:    a paired test against the baseline in the shift report (needs a direction)
TABLES = ("calibration", "shift", "compared")


@dataclass(frozen=True)
class Metric:
    """One metric's declaration (module docstring).

    Attributes:
        name: the key of its value in every result (``metrics.json``, ``results.csv``).
        label: a short name for tables and sentences (``"AUC"``).
        definition: one line, printed under the reports' tables.
        better: ``"higher"`` or ``"lower"`` is better, or None (no direction: PCOC, whose
            best value is 1; a p-value; a term of a decomposition).
        compute: the function that computes it alone (signature by ``kind``), or None.
        computed_by: what computes it when ``compute`` is None (a family's function).
        weighted: ``compute`` also takes ``sample_weight=`` ([n] weights >= 0, a row counted
            w times), so a bootstrap can evaluate it from a replicate's row counts without
            materialising the rows.
        kind: one of :data:`KINDS`.
        section: one of :data:`SECTIONS` (the listing order).
        tables: the :data:`TABLES` that list it.
        segments: it needs segment columns (field-level metrics).
        bounds: the values it can take, ``(low, high)``, or None when unbounded.
    """

    name: str
    label: str
    definition: str
    better: Better | None
    compute: Callable[..., float] | None = None
    computed_by: str = ""
    weighted: bool = False
    kind: str = "labelled"
    section: str = "calibration"
    tables: tuple[str, ...] = ()
    segments: bool = False
    bounds: tuple[float, float] | None = None

    @property
    def higher_is_better(self) -> bool | None:
        """True, False, or None without a direction."""
        return None if self.better is None else self.better == "higher"


METRICS: Registry[Metric] = Registry("metric")


def declare_metric(
    name: str,
    *,
    label: str,
    definition: str,
    better: Better | None,
    compute: Callable[..., float] | None = None,
    computed_by: str = "",
    weighted: bool = False,
    kind: str = "labelled",
    section: str = "calibration",
    tables: Iterable[str] = (),
    segments: bool = False,
    bounds: tuple[float, float] | None = None,
    overwrite: bool = False,
) -> Metric:
    """Declare a metric in :data:`METRICS` (see the module docstring for an example).

    Returns:
        The :class:`Metric`.

    Raises:
        ValueError: a name already declared (unless ``overwrite``), an empty label or
            definition, an unknown ``better``, ``kind``, ``section`` or table, neither
            ``compute`` nor ``computed_by``, or a compared metric without a direction.
    """
    tables = tuple(tables)
    where = f"metric {name!r}"
    if not label.strip() or not definition.strip():
        raise ValueError(f"{where}: a label and a definition are required")
    if better not in ("higher", "lower", None):
        raise ValueError(f"{where}: better must be 'higher', 'lower' or None, got {better!r}")
    for value, valid, what in (
        (kind, KINDS, "kind"),
        (section, SECTIONS, "section"),
        *((t, TABLES, "table") for t in tables),
    ):
        if value not in valid:
            raise ValueError(f"{where}: unknown {what} {value!r} (valid: {', '.join(valid)})")
    if compute is None and not computed_by:
        raise ValueError(f"{where}: give the function that computes it (compute or computed_by)")
    if weighted and compute is None:
        raise ValueError(f"{where}: weighted=True needs the function (compute)")
    if "compared" in tables and better is None:
        raise ValueError(f"{where}: a compared metric needs a direction (better=...)")
    metric = Metric(
        name,
        label,
        definition,
        better,
        compute,
        computed_by,
        weighted,
        kind,
        section,
        tables,
        segments,
        bounds,
    )
    METRICS.register(name, metric, overwrite=overwrite)
    return metric


def metrics_in(table: str | None = None, *, kind: str | None = None) -> list[Metric]:
    """The declared metrics listed in ``table`` (every one when None) of ``kind``, in listing
    order: by :data:`SECTIONS`, then as declared."""
    if table is not None and table not in TABLES:
        raise ValueError(f"unknown table {table!r} (valid: {', '.join(TABLES)})")
    found = [
        m
        for _, m in METRICS.items()
        if (table is None or table in m.tables) and (kind is None or m.kind == kind)
    ]
    return sorted(found, key=lambda m: SECTIONS.index(m.section))  # stable: as declared


_FIELD = re.compile(r"^([^:@]+):.+$")
_COVERAGE = re.compile(r"^([^:@]+)@[0-9.]+%$")


def metric_of(key: str) -> Metric | None:
    """The declaration a result's key belongs to, or None: ``ece`` itself, ``field_rce:C14``
    as ``field_rce:<field>``, ``auc@50%`` as ``auc@<c>%``."""
    found = METRICS.find(key)
    if found is not None:
        return found
    if m := _FIELD.match(key):
        return METRICS.find(f"{m.group(1)}:<field>")
    if m := _COVERAGE.match(key):
        return METRICS.find(f"{m.group(1)}@<c>%")
    return None
