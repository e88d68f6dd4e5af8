import contextlib
import os

import pytest
from hypothesis import settings
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry_instrumentation_vllm_ascend import (
    VllmAscendInstrumentor,
    context,
    environment,
    register_collection_steps,
    state,
)
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, engine, executor, model_runner, scheduler, scopes
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from tests.support.fakes import fake_utils, patch_clock
from tests.support.process import set_process

#: The suite checks every catalogue metric's values, the opt-in ones (catalogue.OPT_IN) included: it records them
#: all (real servers inherit this); tests/unit/test_series_budget.py checks the default set with the variable unset.
os.environ.setdefault(environment.ENABLED_METRICS, "*")
#: Collections run the handlers' pre-collection steps (the stage budgets' flush, the neighbours' re-check) as in
#: an instrumented process, also in tests that drive handlers without ``instrument()``.
register_collection_steps()
#: CI (``CI`` set, as .ci/run does) runs the property tests on the same examples each time, so a run's result is
#: the code's; locally they draw new ones each run (what they found became tests, e.g. test_pipeline.py's
#: several-exporters case).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


class Metrics:
    """This process's pipeline with an in-memory reader (the real SDK, with the package's Views)."""

    def __init__(self, reader):
        self.reader = reader

    def points(self):
        """{exposed metric name: {sorted attribute items: value or (count, sum, bucket_counts)}}"""
        out = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    series = out.setdefault(metric.name, {})
                    for p in metric.data.data_points:
                        key = tuple(sorted(p.attributes.items()))
                        if hasattr(p, "bucket_counts"):
                            series[key] = (p.count, p.sum, tuple(p.bucket_counts))
                        else:
                            series[key] = p.value
        return out

    def value(self, name, **attrs):
        series = self.points().get(name, {})
        return series.get(tuple(sorted(attrs.items())))


@pytest.fixture(autouse=True)
def fresh_state():
    """Every test starts (and leaves) this process's state as a freshly forked child finds it: the same
    ``state.reset()`` the fork handler runs."""
    state.reset()
    yield
    state.reset()


@pytest.fixture
def metrics(monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    reader = InMemoryMetricReader()
    pipeline.reset(extra_readers=[reader])
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    set_process("engine_core", "0", "mixed")
    yield Metrics(reader)
    pipeline.reset()
    set_process(*saved)


@pytest.fixture
def enabled(monkeypatch):
    """``enabled(value)`` sets OTEL_VLLM_ASCEND_ENABLED_METRICS (neither it nor the disabled list is set before)."""
    monkeypatch.delenv(environment.ENABLED_METRICS, raising=False)
    monkeypatch.delenv(environment.DISABLED_METRICS, raising=False)

    def set_(value):
        monkeypatch.setenv(environment.ENABLED_METRICS, value)

    return set_


@pytest.fixture
def files_dir(tmp_path, monkeypatch):
    """This process as an EngineCore (dp 0, role decode) writing its /metrics files into ``tmp_path`` only when a
    test flushes (the export interval is an hour); no OTLP."""
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.delenv(environment.METRICS_EXPORTER, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    pipeline.reset()
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    set_process("engine_core", "0", "decode")
    yield str(tmp_path)
    pipeline.reset()
    set_process(*saved)


@pytest.fixture
def clock(monkeypatch):
    """perf_counter of the timer wrappers and of the EngineCore / worker handlers that read the clock
    themselves (a test module may override it for other handlers); the system clock the time budgets
    read once, at their start, is fixed too."""
    monkeypatch.setattr(budget, "time", lambda: 1_700_000_000.0)
    return patch_clock(monkeypatch, scheduler, engine, executor, model_runner, scopes, budget)


@pytest.fixture
def utils():
    """A stand-in for vllm.v1.utils with the package's profiling-scope factory installed."""
    module = fake_utils()
    patch = scopes.ProfilerScopes().install(module)
    yield module
    patch.remove()


@contextlib.contextmanager
def instrumented(monkeypatch, **kwargs):
    """The package instrumented as vLLM's plugin does it (the real installer patching the real vLLM
    classes) for the block, uninstrumented after it: the setUp / tearDown of opentelemetry-python-
    contrib's TestBase. ``kwargs`` go to ``instrument()`` (``metric_readers``)."""
    monkeypatch.delenv(environment.ENABLED, raising=False)
    instrumentor = VllmAscendInstrumentor()
    instrumentor.instrument(**kwargs)
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def instrumentation(metrics, monkeypatch):
    """The package instrumented (``instrumented``) for the test, recording into ``metrics``' in-memory
    reader. Yields ``metrics``."""
    with instrumented(monkeypatch):
        yield metrics
