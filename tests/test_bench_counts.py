"""Section F3 of ``tox -e bench`` (benchmarks/_step.py ``call_count_rows``): what each process's hooks add to a
simulated engine step, counted in calls rather than timed, so that a code change's effect reads the same on any
machine. The counts must be exact to be worth printing."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _step  # noqa: E402


def test_python_call_counts_are_exact_and_the_default_set_adds_no_more_than_every_metric():
    first, second = _step.call_count_rows(batch=16, steps=32), _step.call_count_rows(batch=16, steps=32)
    assert [(label, python, every, distinct) for label, python, _c, every, distinct in first] == [
        (label, python, every, distinct) for label, python, _c, every, distinct in second
    ]
    by_label = {label: python for label, python, *_ in first}
    assert len(by_label) == 6
    for process in ("EngineCore", "worker", "API server"):
        default = by_label[f"batch 16, {process} hooks, default set"]
        assert 0 < default <= by_label[f"batch 16, {process} hooks, every metric"]
