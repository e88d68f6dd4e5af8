"""Pool the rounds of several runs of one end-to-end preset (``benchmarks/e2e_overhead.py``, same code,
same preset) from their printouts: each run prints its per-round ratios after "per-round ratios (to pool
runs):", the instrumented/uninstrumented line first, then the A/A control's. Prints the pooled median
and the same bootstrap 95 % interval as one run would over that many rounds.

    python benchmarks/pool.py run1.log run2.log
"""

from __future__ import annotations

import statistics
import sys

from e2e_overhead import bootstrap_median

MARK = "per-round ratios (to pool runs):"


def ratios_of(path: str) -> list[list[float]]:
    """The per-round ratio lines of one printout, in order (instrumented, control; per preset run)."""
    with open(path, encoding="utf-8") as f:
        return [[float(x) for x in line.split(MARK, 1)[1].split()] for line in f if MARK in line]


def main(paths: list[str]) -> int:
    runs = [ratios_of(p) for p in paths]
    if not runs or any(len(r) != 2 for r in runs):
        print("each printout must hold one preset's two lines of per-round ratios", file=sys.stderr)
        return 2
    for i, what in enumerate(("instrumented/uninstrumented", "A/A control, uninstrumented/uninstrumented")):
        pooled = [r for run in runs for r in run[i]]
        low, high = bootstrap_median(pooled)
        print(
            f"Pooled throughput ratio {what}, {len(paths)} runs, {len(pooled)} rounds: median "
            f"{statistics.median(pooled):.3f}, bootstrap 95 % interval of the median {low:.3f}–{high:.3f}; "
            f"below 1 in {sum(r < 1 for r in pooled)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
