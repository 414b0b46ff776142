"""Size a shift report from a pilot: how many training seeds detect a given difference.

A pilot is a shift report with the design's variants, shifts and data, and a few seeds. For
every comparison of its primary family (variant vs baseline × {AUC, ECE} × shift point) this
takes the std of the paired differences over the pilot's seeds and asks the calculation the
report's verdict uses (:func:`ctrcal.reports.shift.stats.detectable_difference`, through
:func:`~ctrcal.reports.shift.stats.seeds_needed`): a paired t-test over n seeds at Holm's
strictest level α/m (m: the family's size, the same for the pilot and the design), t quantiles
with n − 1 degrees of freedom, at the report's power. It prints, per comparison and per metric,
the std, the detectable difference at ``--seeds`` and the seeds that reach ``--target``.

Usage::

    python scripts/power_design.py outputs/decisive --seeds 12 --target auc=0.005 ece=0.003
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ctrcal.reports.shift.stats import detectable_difference, seeds_needed


def _target(text: str) -> tuple[str, float]:
    metric, _, value = text.partition("=")
    return metric, float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the pilot's report directory")
    parser.add_argument("--seeds", type=int, required=True, help="the design's training seeds")
    parser.add_argument("--target", type=_target, nargs="+", required=True, help="metric=diff")
    args = parser.parse_args()
    summary = json.loads((args.report / "summary.json").read_text())
    alpha, power = float(summary["alpha"]), float(summary["power"])
    primary = [r for r in summary["paired"] if r["primary"] and math.isfinite(r["p"] or math.nan)]
    m = len(primary)
    level = alpha / m
    targets = dict(args.target)
    print(
        f"pilot: {summary['n_seeds']} seeds; family m = {m}; α/m = {level:.3g}; "
        f"power {power:g}; design: {args.seeds} seeds\n"
    )
    print("| variant | metric | point | sd of Δ | detectable at n | seeds for target |")
    print("|---|---|---|---|---|---|")
    worst: dict[str, tuple[float, int]] = {}
    for r in primary:
        if r["metric"] not in targets:
            continue
        sd = float(r["se"]) * math.sqrt(int(r["n"]))
        need = seeds_needed(sd, targets[r["metric"]], level, power)
        at_n = detectable_difference(sd, args.seeds, level, power)
        point = "clean" if r["shift"] == "clean" else f"{r['shift']} {r['intensity']:g}"
        need_text = str(need) if need <= 1000 else "> 1000"
        print(f"| {r['variant']} | {r['metric']} | {point} | {sd:.5f} | {at_n:.4f} | {need_text} |")
        sd0, need0 = worst.get(r["metric"], (0.0, 0))
        worst[r["metric"]] = (max(sd0, sd), max(need0, need))
    print("\n| metric | target | largest sd of Δ | detectable at n (largest sd) | seeds needed |")
    print("|---|---|---|---|---|")
    for metric, (sd, need) in worst.items():
        at_n = detectable_difference(sd, args.seeds, level, power)
        print(f"| {metric} | {targets[metric]:g} | {sd:.5f} | {at_n:.4f} | {need} |")


if __name__ == "__main__":
    main()
