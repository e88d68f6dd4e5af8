"""Instructions instead of seconds: a Python program run under ``valgrind --tool=callgrind``, its counts split at
marks the program sets itself.

These machines are shared VMs without hardware counters (``perf stat -e instructions`` reads "not supported");
two runs of the same timed code differ by more than a hook costs. Callgrind counts the instructions the program
executes, which do not depend on what else the machine is doing: the same code, inputs and environment give the
same count (``run()`` fixes ``PYTHONHASHSEED``, to the seed it is given, so that dict and set layouts repeat).

A mark is a call of ``os.getppid()``, which the program makes nowhere else that matters: callgrind runs with
``--dump-before=os_getppid`` (the C function behind it in CPython's binary), so each mark writes the counts since
the previous one to a numbered file. ``mark(label)`` names the segment that ends there; ``run()`` pairs the files
with the names and sums each event (``Ir``: instructions; more with ``simulate``) per name. A segment named None
is not reported (warm-up, setup).

A count converts to time only at a rate measured elsewhere (the same code timed natively): CPython's instructions
run at about the same rate whoever's Python they interpret, but cache misses and the clock reads' system time are
not in the count.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MARK_SYMBOL = "os_getppid"
LABELS_FILE = "OTEL_VLLM_ASCEND_BENCH_MARK_LABELS"  # where the child writes its marks' names

_labels: list[str | None] = []


def unavailable() -> str | None:
    """Why instructions cannot be counted here, or None."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian: apt-get install -y valgrind)"
    return None


def mark(label: str | None) -> None:
    """End the current segment and name it (None: not reported)."""
    _labels.append(label)
    os.getppid()


def save() -> None:
    """The child's last act: write its marks' names for ``run()``."""
    with open(os.environ[LABELS_FILE], "w") as f:
        json.dump(_labels, f)


def segment_totals(directory: str, stem: str) -> list[dict[str, int]]:
    """The counts of each dump ``stem.1``, ``stem.2``, … in order, per event (its header's ``events:`` and
    ``summary:`` lines; ``Ir``: instructions)."""
    pattern = re.compile(re.escape(stem) + r"\.(\d+)")
    parts = sorted((int(m.group(1)), name) for name in os.listdir(directory) if (m := pattern.fullmatch(name)))
    totals = []
    for _, name in parts:
        events = ["Ir"]
        with open(os.path.join(directory, name)) as f:
            for line in f:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith("summary:"):
                    totals.append(dict(zip(events, map(int, line.split()[1:]))))
                    break
            else:
                raise ValueError(f"{name}: no summary line")
    return totals


def by_label(labels: list[str | None], totals: list[dict[str, int]]) -> dict[str, tuple[dict[str, int], int]]:
    """Counts per event and segment count per name: dump N holds what ran between mark N − 1 and mark N."""
    if len(labels) != len(totals):
        raise ValueError(
            f"{len(labels)} marks but {len(totals)} dumps: is {MARK_SYMBOL} a symbol of this Python's binary "
            "(a stripped interpreter has none), or does something else call os.getppid()?"
        )
    out: dict[str, tuple[dict[str, int], int]] = {}
    for label, total in zip(labels, totals):
        if label is not None:
            events, segments = out.get(label, ({}, 0))
            out[label] = ({event: events.get(event, 0) + n for event, n in total.items()}, segments + 1)
    return out


def estimated_cycles(events: dict[str, int]) -> int:
    """Callgrind's cycle estimate (KCachegrind's ``CEst``) from simulated caches and branch predictors:
    instructions + 10 × (L1 misses + mispredicted branches) + 100 × last-level misses."""
    l1 = events.get("I1mr", 0) + events.get("D1mr", 0) + events.get("D1mw", 0)
    last_level = events.get("ILmr", 0) + events.get("DLmr", 0) + events.get("DLmw", 0)
    return events["Ir"] + 10 * (l1 + events.get("Bcm", 0) + events.get("Bim", 0)) + 100 * last_level


def run(argv: list[str], seed: int = 0, simulate: bool = False) -> dict[str, tuple[dict[str, int], int]]:
    """Run ``python argv…`` under callgrind with hash seed ``seed``; its marks' counts per event and segment
    counts per name. ``simulate``: also simulate the caches and branch predictors (``estimated_cycles``; about
    twice as slow)."""
    with tempfile.TemporaryDirectory(prefix="otel-vllm-callgrind-") as directory:
        labels_file = os.path.join(directory, "labels.json")
        child_env = {**os.environ, "PYTHONHASHSEED": str(seed), LABELS_FILE: labels_file}
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--dump-before={MARK_SYMBOL}",
            f"--callgrind-out-file={os.path.join(directory, 'cg.out')}",
            "--dump-line=no",
            *(["--cache-sim=yes", "--branch-sim=yes"] if simulate else []),
            "--log-file=" + os.path.join(directory, "valgrind.log"),
            sys.executable,
            *argv,
        ]
        done = subprocess.run(command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0 or not os.path.exists(labels_file):
            with open(os.path.join(directory, "valgrind.log")) as f:
                log = f.read()[-2000:]
            raise RuntimeError(f"callgrind run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{log}")
        with open(labels_file) as f:
            labels = json.load(f)
        return by_label(labels, segment_totals(directory, "cg.out"))
