"""Write the declared metrics (``ctrcal.metrics.METRICS``) into docs/calibration.md.

The list between ``<!-- metrics: begin -->`` and ``<!-- metrics: end -->`` is
:func:`ctrcal.reports.markdown.metric_list`; ``tests/metrics/test_registry.py`` checks that
it is current. Run after declaring a metric::

    python scripts/metric_docs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from ctrcal.reports.markdown import metric_list

BEGIN, END = "<!-- metrics: begin -->", "<!-- metrics: end -->"
DOC = Path(__file__).resolve().parents[1] / "docs" / "calibration.md"


def main() -> int:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"{DOC}: no {BEGIN} ... {END} block to write the metric list into", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{metric_list()}\n{END}{tail}")
    print(f"{DOC}: metric list written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
