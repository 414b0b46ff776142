"""The deploy gate of ``calibration-report FILE --compare COL --gate SPEC``.

A non-inferiority decision: may the candidate (``--compare``) replace the baseline
(``--prob``) on these rows? The SPEC is a comma-separated list of rules, each
``METRIC:SIGN MARGIN`` (no spaces needed)::

    SPEC   := RULE ("," RULE)*
    RULE   := METRIC ":" ("+" | "-") NUMBER
    ece:+0.002         ECE may rise by at most 0.002
    auc:-0.001         AUC may fall by at most 0.001
    logloss:+0         logloss may not rise at all

``+`` guards a metric where lower is better (the candidate − baseline difference must stay
below the margin), ``-`` one where higher is better (it must stay above −margin). A rule is
decided on the *confidence bound* of the paired row bootstrap of the difference
(:func:`~ctrcal.metrics.paired_bootstrap`, both models on the same resampled rows), not
on the point estimate: a ``+`` rule passes when the upper end of the 95 % interval is at most
the margin, a ``-`` rule when the lower end is at least −margin, i.e. a one-sided test at
2.5 %. The gate passes when every rule passes; requiring all of them is an intersection-union
test, whose error rate needs no adjustment for the number of rules (nor of segments).

With segments (``--gate-segments``), every rule is also decided on the rows of each segment
value with at least ``min_count`` rows (the bin-free and field-level metrics, which need the
whole file, are decided on all rows only). A small segment has a wide interval and fails a
tight margin: raise ``--min-count`` or widen the margin rather than read its failure as
evidence against the candidate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrcal.core.errors import ConfigError
from ctrcal.metrics import PairedCI, paired_bootstrap

__all__ = ["GateDecision", "GateRule", "decide", "gate_segments", "parse_gate"]

_RULE = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([+-])\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*$"
)
# metrics a segment's rows can decide (the bin-free and field-level ones need the whole file)
SEGMENT_METRICS = (
    "auc",
    "logloss",
    "brier",
    "ece",
    "ece_mass",
    "pcoc",
    "ne",
    "brier_reliability",
    "brier_resolution",
)


@dataclass(frozen=True)
class GateRule:
    """One rule: ``metric`` may move by at most ``margin`` in direction ``sign`` (+1: rise,
    −1: fall)."""

    metric: str
    sign: int
    margin: float

    @property
    def text(self) -> str:
        return f"{self.metric}:{'+' if self.sign > 0 else '-'}{self.margin:g}"


@dataclass(frozen=True)
class RuleResult:
    """One rule decided on one scope (``"all rows"`` or a segment)."""

    rule: GateRule
    scope: str
    diff: float
    bound: float
    passed: bool

    def line(self) -> str:
        """``auc:-0.001 on all rows: diff -0.00021, lower bound -0.00074 >= -0.001: pass``."""
        r = self.rule
        side, op = ("upper", "<=") if r.sign > 0 else ("lower", ">=")
        limit = r.sign * r.margin
        return (
            f"{r.text} on {self.scope}: diff {self.diff:+.5g}, {side} bound "
            f"{self.bound:+.5g} {op} {limit:+g}: {'pass' if self.passed else 'FAIL'}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.text,
            "metric": self.rule.metric,
            "scope": self.scope,
            "diff": self.diff,
            "bound": self.bound,
            "pass": self.passed,
        }


@dataclass(frozen=True)
class GateDecision:
    """Every rule's result and the verdict (pass only when every rule passes)."""

    spec: str
    level: float
    results: list[RuleResult]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def lines(self) -> list[str]:
        """One line per rule on all rows, one per failed segment rule, a count of the segment
        rules that passed, and the verdict."""
        verdict = "PASS" if self.passed else "FAIL"
        failed = sum(not r.passed for r in self.results)
        every = [r for r in self.results if r.scope == "all rows"]
        seg = [r for r in self.results if r.scope != "all rows"]
        shown = every + [r for r in seg if not r.passed]
        out = [f"gate: {r.line()}" for r in shown]
        if seg:
            out.append(f"gate: {sum(r.passed for r in seg)} of {len(seg)} segment rules pass")
        return out + [
            f"gate: {verdict} ({len(self.results) - failed} of {len(self.results)} rules pass; "
            f"bounds of the paired bootstrap's {100 * self.level:g} % interval)"
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "level": self.level,
            "verdict": "pass" if self.passed else "fail",
            "rules": [r.as_dict() for r in self.results],
        }


def parse_gate(spec: str, known: Sequence[str]) -> list[GateRule]:
    """The rules of a gate SPEC (module docstring); ConfigError naming the bad part.

    Args:
        spec: e.g. ``"ece:+0.002,auc:-0.001"``.
        known: the metric names a rule may name.
    """
    rules = []
    parts = [s for s in str(spec).split(",")]
    if not any(s.strip() for s in parts):
        raise ConfigError("--gate: empty; expected rules such as 'ece:+0.002,auc:-0.001'")
    for part in parts:
        m = _RULE.match(part)
        if m is None:
            raise ConfigError(
                f"--gate: {part.strip()!r} is not a rule METRIC:+MARGIN or METRIC:-MARGIN "
                "(e.g. 'ece:+0.002': ECE may rise by at most 0.002)"
            )
        metric, sign, margin = m.group(1), m.group(2), float(m.group(3))
        if metric not in known:
            raise ConfigError(
                f"--gate: unknown metric {metric!r}; known: {', '.join(sorted(known))}"
            )
        if not math.isfinite(margin):
            raise ConfigError(f"--gate: {part.strip()!r}: the margin must be a finite number")
        rules.append(GateRule(metric, 1 if sign == "+" else -1, margin))
    return rules


def _result(rule: GateRule, scope: str, ci: PairedCI | None) -> RuleResult:
    if ci is None:
        return RuleResult(rule, scope, float("nan"), float("nan"), False)
    bound = ci.diff.high if rule.sign > 0 else ci.diff.low
    ok = math.isfinite(bound) and (bound <= rule.margin if rule.sign > 0 else bound >= -rule.margin)
    return RuleResult(rule, scope, ci.diff.estimate, bound, bool(ok))


def decide(
    spec: str, rules: Sequence[GateRule], paired: Mapping[str, PairedCI], level: float
) -> GateDecision:
    """Every rule on all rows, from the paired bootstrap of the whole file.

    A metric that is undefined on these rows (NaN bound) fails its rule: the gate cannot show
    non-inferiority without it.
    """
    return GateDecision(spec, level, [_result(r, "all rows", paired.get(r.metric)) for r in rules])


def segment_metric_fn(names: Sequence[str], n_bins: int) -> Callable:
    """``fn(probs, labels, rows) -> {metric: value}`` of only the metrics in ``names``."""
    from ctrcal import metrics as M
    from ctrcal.metrics import brier_decomposition

    wanted = set(names)

    def fn(p: np.ndarray, y: np.ndarray, rows: np.ndarray | None) -> dict[str, float]:
        out = (
            M.compute_all(p, y, n_bins=n_bins)
            if wanted - {"brier_reliability", "brier_resolution"}
            else {}
        )
        if wanted & {"brier_reliability", "brier_resolution"}:
            out.update(brier_decomposition(p, y, n_bins).as_dict())
        return {k: v for k, v in out.items() if k in wanted}

    return fn


def gate_segments(
    rules: Sequence[GateRule],
    probs_a: np.ndarray,
    probs_b: np.ndarray,
    labels: np.ndarray,
    segments: Mapping[str, np.ndarray],
    value_names: Mapping[str, Sequence[str]],
    *,
    min_count: int,
    n_boot: int,
    seed: int,
    n_bins: int,
) -> tuple[list[RuleResult], int]:
    """Every rule on every segment value with at least ``min_count`` rows.

    Returns:
        (the results, the number of segment values skipped for having too few rows).
    """
    per_seg = [r for r in rules if r.metric in SEGMENT_METRICS]
    if not per_seg:
        return [], 0
    fn = segment_metric_fn([r.metric for r in per_seg], n_bins)
    results, skipped = [], 0
    for col, codes in segments.items():
        counts = np.bincount(codes)
        names = value_names.get(col)
        for code in np.flatnonzero(counts):
            if counts[code] < min_count:
                skipped += 1
                continue
            rows = np.flatnonzero(codes == code)
            paired = paired_bootstrap(
                fn, probs_a[rows], probs_b[rows], labels[rows], n_boot=n_boot, seed=seed
            )
            value = names[code] if names is not None and code < len(names) else code
            results += [_result(r, f"{col}={value}", paired.get(r.metric)) for r in per_seg]
    return results, skipped
