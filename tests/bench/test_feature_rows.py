"""Section A2 of the benchmark runs: its hook-file rows load the bench's own file through the real loader (a file
naming a module outside vLLM needs OTEL_VLLM_ASCEND_CONFIG_MODULES, which the section sets for itself)."""

import os

from benchmarks import run
from opentelemetry_instrumentation_vllm_ascend import environment


def test_section_a2_runs_every_row_and_leaves_the_environment_as_it_was(monkeypatch):
    monkeypatch.delenv(environment.CONFIG_MODULES, raising=False)
    rows = dict(run.feature_rows(50, 1))
    assert "ours: hook-file timer (type: timer)" in rows
    assert "ours: hook-file expression histogram (expr: x * 2 + 1)" in rows
    assert all(len(times) == 1 and times[0] > 0 for times in rows.values())
    assert environment.CONFIG_MODULES not in os.environ
