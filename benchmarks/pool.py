"""Pool the rounds of several runs of one end-to-end preset (``benchmarks/e2e_overhead.py``, same code, same
preset) from their printouts: each run prints one line per round ("server set S round R: off X, on Y, control Z
…"). Every server set of every run is a set of its own (fresh server processes). Prints the pooled median of each
throughput ratio a run prints (``e2e_overhead.RATIOS``) with the same two-stage bootstrap interval
(server sets, then their rounds) as one run prints over that many sets. Refuses printouts that differ in
preset, model size, design (``--switched``), placement (``--placement``) or ablation (``--disabled-metrics``,
``--disabled-scopes``, ``--recording-off``).

    python -m benchmarks.pool run1.log run2.log
"""

from __future__ import annotations

import re
import statistics
import sys

from benchmarks.e2e_overhead import (
    APART_HEADER,
    RATIOS,
    RECORDING_OFF_HEADER,
    SWITCHED_HEADER,
    bootstrap_median_by_set,
    round_ratios,
)

ROUND = re.compile(r"^server set (\d+) round\s+\d+: off\s+([\d.]+), on\s+([\d.]+), control\s+([\d.]+)")


HEADER = re.compile(r"^### End-to-end overhead, preset (\S+): model hidden (\d+) x (\d+) layers.*$", re.M)
ABLATION = re.compile(r"; (disabled metrics: [^;]*|untimed scopes: [^;]*|" + re.escape(RECORDING_OFF_HEADER) + ")")


def design(path: str) -> dict:
    """What a printout measured, which pooled runs must share: the preset and its model's size (from its
    header; None for a printout without one), ``--switched`` (one server switched at runtime) or three servers,
    where the EngineCores ran (``--placement``) and what the instrumented server left out (``--disabled-metrics``,
    ``--disabled-scopes``, ``--recording-off``)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    header = HEADER.search(text)
    return {
        "preset and model": header.groups() if header else None,
        "design": "switched" if SWITCHED_HEADER in text else "three servers",
        "placement": "apart" if APART_HEADER in text else "shared",
        "ablation": ("; ".join(ABLATION.findall(header.group(0))) if header else "") or "none",
    }


def sets_of(path: str) -> dict[int, list[dict[str, float]]]:
    """A printout's rounds by server set: each round's throughput ratios (``e2e_overhead.round_ratios``)."""
    sets: dict[int, list[dict[str, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = ROUND.match(line)
            if m:
                off, on, control = (float(x) for x in m.group(2, 3, 4))
                sets.setdefault(int(m.group(1)), []).append(round_ratios(off, on, control))
    return sets


def main(paths: list[str]) -> int:
    runs = [sets_of(p) for p in paths]
    if not paths or not all(runs):
        print("each printout must hold the round lines of one preset's run", file=sys.stderr)
        return 2
    designs = [design(p) for p in paths]
    for key in designs[0]:
        kinds = {str(d[key]) for d in designs}
        if len(kinds) > 1:
            print(f"the printouts differ in their {key} ({', '.join(sorted(kinds))}): pool each apart", file=sys.stderr)
            return 2
    sets = [rounds for run in runs for rounds in run.values()]
    for key, what in RATIOS.items():
        by_set = [[r[key] for r in rounds] for rounds in sets]
        pooled = [r for rs in by_set for r in rs]
        low, high = bootstrap_median_by_set(by_set)
        print(
            f"Pooled throughput ratio {what}, {len(paths)} runs, {len(sets)} server sets, {len(pooled)} rounds: "
            f"median {statistics.median(pooled):.3f}, 95 % interval of the median {low:.3f}–{high:.3f} (two-stage "
            f"bootstrap); below 1 in {sum(r < 1 for r in pooled)}; medians per server set "
            + " ".join(f"{statistics.median(rs):.3f}" for rs in by_set)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
